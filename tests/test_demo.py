# Part of the MNIST example: a project generated without it has no such file.
"""demo.py: draw a digit and see what the model reads. Its page is driven in a real browser (Debian's
Chromium, by Playwright) and through gradio_client; its function is checked alone on drawn arrays."""

import functools
import io
import math
import re
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from PIL import Image, ImageDraw
from playwright.sync_api import Page, sync_playwright
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from torchvision.datasets import MNIST

from mnistlab.example import digits
from mnistlab.example.demo import page, reader
from mnistlab.runtime.config import hydra_versions
from mnistlab.runtime.run import run_folder
from mnistlab.runtime.run.failures import InputError
from mnistlab.trained import inference

import composing
import running
from composing import DATA_DIR, OWN, ROOT
from payloads import MARKER
from running import serving

pytestmark = pytest.mark.yours  # reads your task: pytest -m yours (docs/make-it-yours.md)

# The example's own tests: they train what conf/ composes by default (the suite's task is the machinery's).
compose_config = functools.partial(composing.compose_config, task=OWN)
run_script = functools.partial(running.run_script, task=OWN)

CHROMIUM = "/usr/bin/chromium"  # Debian's package (.ci/run installs it)
SIDE = 280  # conf/demo.yaml's canvas


@pytest.fixture(scope="session")  # computed once a worker: see test_ray.cluster
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model trained for one whole epoch (97%): drawings are further from MNIST than its test digits, and
    the suite's shorter run (80%) reads a drawn loop as a 5."""
    from mnistlab.tasks import train  # not at import: see tests/faults.py

    out = tmp_path_factory.mktemp("demo")
    train(
        compose_config(
            "train", out, ["trainer.max_epochs=1", "trainer.limit_val_batches=5", "test=false", "logger=none"]
        )
    )
    return run_folder.last_checkpoint(out)


def _drawn(shape: str) -> np.ndarray:
    """What the sketchpad sends for a stroke in black on its transparent canvas: RGBA (SIDE, SIDE, 4)."""
    image = Image.new("RGBA", (SIDE, SIDE), (0, 0, 0, 0))
    pen = ImageDraw.Draw(image)
    if shape == "bar":
        pen.line([(140, 50), (140, 230)], fill="black", width=22)
    else:  # a loop
        pen.ellipse([80, 40, 200, 240], outline="black", width=22)
    return np.asarray(image)


def test_a_drawing_is_read_as_predict_reads_its_image(checkpoint: Path) -> None:
    model = inference.load(checkpoint, data_dir=DATA_DIR)
    read = reader(model, lambda body: digits.decode(body, max_pixels=10**6))
    for shape, label in (("bar", 1), ("loop", 0)):
        drawing = _drawn(shape)
        shown = read({"background": None, "layers": [drawing], "composite": drawing})
        assert shown is not None and max(shown, key=shown.get) == model.name(label), (shape, shown)
        on_white = Image.alpha_composite(Image.new("RGBA", (SIDE, SIDE), "white"), Image.fromarray(drawing))
        as_file = digits.decode(_png(on_white.convert("L")), max_pixels=10**6)  # predict.py's preparation
        assert list(shown.values()) == model.probabilities(as_file[None])[0].tolist()
    assert read({"composite": np.zeros((SIDE, SIDE, 4), np.uint8)}) is None  # a blank canvas: nothing shown
    assert read(None) is None


def test_the_page_is_built_from_the_config(checkpoint: Path) -> None:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), **hydra_versions.BASE):
        cfg = compose("demo", [f"ckpt_path={checkpoint}", f"paths.data_dir={DATA_DIR}", "top_classes=5"])
    config = page(cfg).get_config_file()
    kinds = {c["props"].get("elem_id"): c for c in config["components"]}
    assert kinds["reading"]["props"]["num_top_classes"] == 5
    assert kinds["drawing"]["props"]["canvas_size"] == [SIDE, SIDE]
    assert [d["api_name"] for d in config["dependencies"]] == ["classify"]


def _png(image: Image.Image) -> bytes:
    file = io.BytesIO()
    image.save(file, format="PNG")
    return file.getvalue()


def _pen(tab: Page) -> None:
    """Pick up the pen, as the page asks ("select the draw tool to start")."""
    tab.wait_for_load_state("networkidle")
    tab.wait_for_timeout(1000)
    tab.locator('#drawing button[aria-label="Brush"]').click()
    tab.wait_for_timeout(500)


def _stroke(browser_page: Page, points: list[tuple[float, float]]) -> None:
    """Press at the first point, move through the others, release: one stroke on the canvas, in its
    fractions of width and height."""
    box = browser_page.locator("#drawing canvas").first.bounding_box()
    at = [(box["x"] + x * box["width"], box["y"] + y * box["height"]) for x, y in points]
    browser_page.mouse.move(*at[0])
    browser_page.mouse.down()
    for point in at[1:]:
        browser_page.mouse.move(*point)
    browser_page.mouse.up()


READING = "() => document.querySelector('#reading').innerText.split('\\n')[1] || ''"  # under its label


def _shown(tab: Page, expected: str) -> str:
    """The class the page shows on top, once it shows ``expected`` (or after 10 s, whatever it shows)."""
    try:
        tab.wait_for_function(f"text => ({READING})() === text", arg=expected, timeout=10_000)
    except PlaywrightTimeout:  # the caller's assertion says what was shown
        pass
    return tab.evaluate(READING)


def _drawn_and_read(tab: Page, url: str, points: list[tuple[float, float]], expected: str) -> str:
    """Open the page, pick up the pen, draw one stroke through ``points``: the class then shown on top.
    The canvas must lie within its pad (in a bare row Gradio sometimes sized it before the row's split,
    src/mnistlab/example/demo.py)."""
    tab.goto(url)
    tab.wait_for_selector("#drawing canvas")
    _pen(tab)
    canvas, pad = tab.locator("#drawing canvas").first.bounding_box(), tab.locator("#drawing").bounding_box()
    assert canvas is not None and pad is not None
    assert canvas["x"] >= pad["x"] and canvas["x"] + canvas["width"] <= pad["x"] + pad["width"] + 1, (canvas, pad)
    _stroke(tab, points)
    return _shown(tab, expected)


@pytest.mark.slow
def test_digits_drawn_in_chromium_are_read_live_and_the_page_stays_offline(checkpoint, tmp_path) -> None:
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"needs Chromium at {CHROMIUM}: apt-get install chromium (Debian's package)")
    names = inference.load(checkpoint, data_dir=DATA_DIR).classes
    bar = [(0.5, 0.15 + 0.7 * k / 20) for k in range(21)]
    loop = [(0.5 + 0.22 * math.cos(t), 0.5 + 0.33 * math.sin(t)) for t in np.linspace(0, 2 * math.pi, 41)]
    with serving(tmp_path / "demo", f"ckpt_path={checkpoint}", script="demo.py", ready="/") as url:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                tab = browser.new_page(viewport={"width": 1100, "height": 700}, locale="en-US")
                hosts: set[str] = set()
                tab.on("request", lambda request: hosts.add(urlparse(request.url).hostname or ""))
                assert _drawn_and_read(tab, url, bar, names[1]) == names[1]
                assert _drawn_and_read(tab, url, loop, names[0]) == names[0]
                tab.screenshot(path=tmp_path / "demo.png")
            finally:
                browser.close()
        assert hosts <= {"127.0.0.1"}, hosts  # no fonts, analytics or scripts from elsewhere


@pytest.mark.slow
def test_the_page_answers_gradio_client_as_predict_reads_the_image(checkpoint, tmp_path) -> None:
    from gradio_client import Client, handle_file

    test = MNIST(DATA_DIR, train=False)
    model = inference.load(checkpoint, data_dir=DATA_DIR)
    with serving(tmp_path / "demo", f"ckpt_path={checkpoint}", script="demo.py", ready="/") as url:
        client = Client(url, verbose=False)
        for index in range(4):  # MNIST's test digits, dark on light and 3 times larger, as a drawing is
            file = tmp_path / f"{index}.png"
            Image.fromarray(255 - test.data[index].numpy()).resize((84, 84)).save(file)
            expected = model.probabilities(digits.load(file, max_pixels=10**6)[None, None])[0]
            drawing = {"background": handle_file(file), "layers": [], "composite": handle_file(file)}
            shown = client.predict(drawing, api_name="/classify")
            assert shown["label"] == model.name(int(expected.argmax()))
            confidences = {c["label"]: c["confidence"] for c in shown["confidences"]}
            assert confidences[shown["label"]] == pytest.approx(float(expected.max()), abs=1e-6)


def test_the_demo_refuses_a_bad_checkpoint(payload_checkpoint, pickle_checkpoint, tmp_path) -> None:
    """Before its page is built (each refusal printed in one line, as every InputError: test_trust.py)."""
    for checkpoint, reason in (
        (tmp_path / "missing.ckpt", "no such file"),
        (payload_checkpoint, "_target_"),
        (pickle_checkpoint, ""),
    ):
        with pytest.raises(InputError, match=re.escape(reason)):
            page(composing.compose_config("demo", tmp_path / "out", [f"ckpt_path={checkpoint}"]))
        assert not (tmp_path / MARKER).exists(), "the payload ran"


@pytest.mark.slow
def test_the_demo_refuses_a_port_it_cannot_take_in_one_line(pickle_checkpoint, tmp_path) -> None:
    out = f"paths.log_dir={tmp_path / 'out'}"
    result = run_script("demo.py", f"ckpt_path={pickle_checkpoint}", "port=80", out, timeout=240)
    assert result.stderr.strip().splitlines()[-1].startswith("Error: port=80"), result.stderr[-2000:]
