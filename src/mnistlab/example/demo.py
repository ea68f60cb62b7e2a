"""Draw a digit, see what the model reads: ``launch(cfg)`` behind ``demo.py``, a Gradio page.

What is drawn reaches the model as an image file would: its PNG goes through ``conf/decode/``'s
function (``digits``: the preparation of ``predict.py`` and the server, dark ink on a light canvas
inverted, the digit boxed and centred as MNIST's), and the page shows the most likely classes after
every stroke. Offline: no analytics, no share link, the system's fonts rather than Google's.
"""

import io
import logging
import os
from collections.abc import Callable
from typing import Any

import numpy as np
from omegaconf import DictConfig
from PIL import Image

from mnistlab.runtime.config import hydra_versions
from mnistlab.runtime.run.failures import InputError
from mnistlab.trained import inference

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"  # read when gradio is imported: no usage reports, no version check
import gradio  # after the line above

log = logging.getLogger(__name__)


def reader(model: inference.TrainedModel, decode: Callable[[bytes], np.ndarray]) -> Callable[[Any], dict | None]:
    """The page's function: a drawing (the sketchpad's value) -> the probability of each class by name,
    or None while the canvas is blank."""

    def read(drawing: dict[str, Any] | None) -> dict[str, float] | None:
        image = _flattened(drawing)
        if image is None:
            return None
        file = io.BytesIO()
        image.save(file, format="PNG")
        try:
            inputs = decode(file.getvalue())
        except InputError as err:  # not expected of a drawing: said on the page, not as a stack trace
            raise gradio.Error(str(err)) from None
        probabilities = model.probabilities(inputs[None])[0]
        return {model.name(label): float(p) for label, p in enumerate(probabilities)}

    return read


def _flattened(drawing: dict[str, Any] | None) -> Image.Image | None:
    """The sketchpad's composite (RGBA, transparent where nothing is drawn) on white; None when blank."""
    composite = (drawing or {}).get("composite")
    if composite is None:
        return None
    image = Image.fromarray(np.asarray(composite, np.uint8)).convert("RGBA")
    page = Image.new("RGBA", image.size, "white")
    grey = Image.alpha_composite(page, image).convert("L")
    low, high = grey.getextrema()
    return None if low == high else grey  # a uniform canvas holds no digit


def page(cfg: DictConfig) -> gradio.Blocks:
    """The demo's page for ``cfg`` (conf/demo.yaml): a sketchpad, the top classes beside it."""
    model = inference.load(
        cfg.ckpt_path, "cpu", cfg.paths.data_dir, cfg.trusted_modules
    )  # one drawing at a time: the CPU is enough
    pen = gradio.Brush(default_size=cfg.brush, colors=["#000000"], color_mode="fixed")
    with gradio.Blocks(title="Draw a digit") as blocks:
        gradio.Markdown(
            "## Draw a digit\nPick the pen, draw: the model reads it after every stroke, as `predict.py` reads an image."
        )
        # Each in a column of its own: in a bare row the sketchpad's canvas was sometimes sized before the
        # label beside it took its half (the drawing area then lay off-centre, past the pad's edge; measured:
        # 10 of 24 fresh page loads in Chromium, 0 of 36 with the columns).
        with gradio.Row():
            with gradio.Column():
                pad = gradio.Sketchpad(
                    canvas_size=(cfg.canvas, cfg.canvas), fixed_canvas=True, brush=pen, layers=False, height=cfg.canvas + 160,
                    type="numpy", label="Your digit", elem_id="drawing",
                )  # fmt: skip
            with gradio.Column():
                shown = gradio.Label(num_top_classes=cfg.top_classes, label="The model reads", elem_id="reading")
        pad.change(
            reader(model, hydra_versions.plain_partial(cfg.decode)), pad, shown,
            api_name="classify", trigger_mode="always_last", show_progress="hidden",
        )  # fmt: skip
    return blocks


def launch(cfg: DictConfig) -> None:
    fonts = gradio.themes.Default(
        font=["system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"]
    )  # the default theme's fonts come from Google's servers
    log.info("Drawing page for %s on http://%s:%d", cfg.ckpt_path, cfg.host, cfg.port)
    page(cfg).launch(server_name=cfg.host, server_port=cfg.port, share=False, ssr_mode=False, theme=fonts, quiet=True)
