# Part of the MNIST example: a project generated without it has no such file.
"""predict.py: digit images of any size, prepared as MNIST's were, classified as the model does."""

import csv
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from mnistlab.data import normalize
from mnistlab.example.prediction import predict
from mnistlab.runtime.checkpointing.checkpoint_io import load_checkpoint
from mnistlab.runtime.run.failures import InputError
from mnistlab.trained import loading

import onnx_models
from composing import DATA_DIR, compose_config
from payloads import MARKER

pytestmark = pytest.mark.yours  # reads your task: pytest -m yours (docs/make-it-yours.md)

IMAGES = 64


def _test_set() -> tuple[torch.Tensor, torch.Tensor]:
    from torchvision.datasets import MNIST

    test = MNIST(DATA_DIR, train=False)
    return test.data[:IMAGES], test.targets[:IMAGES]


def test_pngs_of_test_digits_at_other_sizes_get_the_models_predictions(trained_example: Path, tmp_path: Path) -> None:
    images, _ = _test_set()
    folder = tmp_path / "digits"
    (folder / "dark_on_light").mkdir(parents=True)
    for i, image in enumerate(images.numpy()):
        if i % 2:  # white on black, 3 times larger
            Image.fromarray(image).resize((84, 84), Image.NEAREST).save(folder / f"{i:03d}.png")
        else:  # black on white (a scan, a drawing), twice as large
            Image.fromarray(255 - image).resize((56, 56), Image.NEAREST).save(folder / "dark_on_light" / f"{i:03d}.png")
    rows = predict(
        compose_config("predict", tmp_path, [f"ckpt_path={trained_example}", f"input={folder}", "batch_size=16"])
    )

    saved = load_checkpoint(trained_example)
    with torch.inference_mode():
        expected = loading.network(saved)(normalize(images, *loading.normalization(saved))).softmax(dim=1)
    by_index = {int(Path(row["file"]).stem): row for row in rows}
    assert sorted(by_index) == list(range(IMAGES))
    for i, row in by_index.items():
        assert row["predicted"] == int(expected[i].argmax())
        assert np.allclose([row[f"p{c}"] for c in range(10)], expected[i].numpy(), atol=1e-5)
    with (tmp_path / "predictions.csv").open() as file:
        written = list(csv.DictReader(file))
    assert len(written) == IMAGES and list(written[0])[:3] == ["file", "predicted", "p0"]


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda d: (d / "x.png").write_text("not an image"), "x.png is not an image PIL can read"),
        (lambda d: (d / "notes.txt").write_text("no images"), "holds no PNG or JPEG files"),
    ],
)
def test_a_folder_without_readable_images_is_refused(make, message: str, trained_example: Path, tmp_path) -> None:
    (tmp_path / "in").mkdir()
    make(tmp_path / "in")
    with pytest.raises(InputError, match=message):  # printed in one line, as every InputError (test_trust.py)
        predict(compose_config("predict", tmp_path, [f"ckpt_path={trained_example}", f"input={tmp_path / 'in'}"]))


def test_unreadable_and_oversized_images_are_skipped_and_the_rest_classified(
    trained_example: Path, tmp_path: Path, caplog
) -> None:
    images, _ = _test_set()
    folder = tmp_path / "in"
    folder.mkdir()
    Image.fromarray(images[0].numpy()).save(folder / "a_digit.png")
    (folder / "b_broken.png").write_bytes(b"\x89PNG\r\n\x1a\n and then nothing")
    Image.new("L", (12_000, 12_000)).save(folder / "c_bomb.png")  # 144 Mpx in a small file
    large = Image.fromarray(images[1].numpy()).resize((2800, 2800), Image.NEAREST)  # reduced as it is read
    large.save(folder / "d_large.jpg", quality=95)
    assert (folder / "c_bomb.png").stat().st_size < 1_000_000
    rows = predict(compose_config("predict", tmp_path, [f"ckpt_path={trained_example}", f"input={folder}"]))

    assert [Path(row["file"]).name for row in rows] == ["a_digit.png", "d_large.jpg"]
    skipped = caplog.text.partition("Skipped 2 image(s) that could not be read:")[2]
    assert f"{folder / 'b_broken.png'} is not an image PIL can read" in skipped
    assert f"{folder / 'c_bomb.png'} has 144,000,000 pixels, over max_pixels=50,000,000" in skipped
    saved = load_checkpoint(trained_example)
    with torch.inference_mode():
        expected = loading.network(saved)(normalize(images[:2], *loading.normalization(saved))).argmax(1)
    assert [row["predicted"] for row in rows] == expected.tolist()
    assert len((tmp_path / "predictions.csv").read_text().splitlines()) == 3


def test_the_output_is_checked_before_any_work(tmp_path: Path) -> None:
    """Named before the checkpoint (missing here) is even read: a refused output costs nothing."""
    (tmp_path / "taken.csv").write_text("someone's results")
    base = [f"ckpt_path={tmp_path / 'missing.ckpt'}", f"input={tmp_path}"]
    with pytest.raises(InputError, match="exists; pass overwrite=true to replace it"):
        predict(compose_config("predict", tmp_path, [*base, f"output={tmp_path / 'taken.csv'}"]))
    assert (tmp_path / "taken.csv").read_text() == "someone's results"
    with pytest.raises(InputError, match="is a folder; name a file"):
        predict(compose_config("predict", tmp_path, [*base, f"output={tmp_path}"]))
    with pytest.raises(InputError, match="missing.ckpt: no such file"):  # past the output's checks
        predict(compose_config("predict", tmp_path, [*base, f"output={tmp_path / 'taken.csv'}", "overwrite=true"]))


def test_predict_refuses_a_malicious_checkpoint(payload_checkpoint: Path, pickle_checkpoint: Path, tmp_path) -> None:
    """README, Trust: a checkpoint from anyone never runs code (the others' entry points, and the one line a
    script prints of the refusal: test_trust.py)."""
    images = tmp_path / "images"
    images.mkdir()
    Image.fromarray(_test_set()[0][0].numpy()).save(images / "digit.png")
    for checkpoint in (payload_checkpoint, pickle_checkpoint):
        cfg = compose_config("predict", tmp_path / "out", [f"ckpt_path={checkpoint}", f"input={images}"])
        with pytest.raises(InputError):
            predict(cfg)
        assert not (tmp_path / MARKER).exists(), f"{checkpoint.name}: the payload ran"


def test_a_16_bit_png_reads_as_the_same_digit_at_8_bits(tmp_path: Path) -> None:
    """16-bit grey PNGs (a scanner's, a microscope's) are scaled to 0..255, not clipped at 255: each of
    the test digits prepares as it does from its 8-bit file, for predict.py and the server alike."""
    from mnistlab.example import digits

    images, _ = _test_set()
    for i, image in enumerate(images.numpy()):
        Image.fromarray(image).save(tmp_path / f"{i}_8.png")
        Image.fromarray(image.astype(np.uint16) * 257).save(tmp_path / f"{i}_16.png")  # 255 -> 65535
        assert Image.open(tmp_path / f"{i}_16.png").mode.startswith("I")  # PIL reads it as 16-bit
        eight = digits.load(tmp_path / f"{i}_8.png", max_pixels=10_000)
        np.testing.assert_allclose(digits.load(tmp_path / f"{i}_16.png", max_pixels=10_000), eight, atol=1e-3)
        body = (tmp_path / f"{i}_16.png").read_bytes()
        np.testing.assert_allclose(digits.decode(body, max_pixels=10_000)[0], eight, atol=1e-3)


@pytest.mark.parametrize("shape", [["N", 784], ["N", 3, 32, 32]], ids=["flat", "RGB"])
def test_an_onnx_model_that_does_not_take_digit_images_is_refused_before_any_is_read(shape, tmp_path: Path) -> None:
    model = onnx_models.flattening(tmp_path / "model.onnx", shape)
    shown = "(" + ", ".join(str(d) for d in shape[1:]) + ")"
    with pytest.raises(InputError, match=re.escape(f"the model takes inputs of shape {shown}, but predict.py's digit")):
        predict(compose_config("predict", tmp_path, [f"ckpt_path={model}", f"input={tmp_path}"]))
    assert not (tmp_path / "predictions.csv").exists()


def test_predict_says_when_the_data_differs_from_the_checkpoints(trained_example: Path, tmp_path: Path, caplog) -> None:
    """README, Run records: predict.py compares the code, versions and data of now with the checkpoint's."""
    raw = tmp_path / "data" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for source in (Path(DATA_DIR) / "MNIST" / "raw").iterdir():
        (raw / source.name).symlink_to(source)
    changed = raw / "t10k-labels-idx1-ubyte"
    changed.unlink()
    changed.write_bytes((Path(DATA_DIR) / "MNIST" / "raw" / changed.name).read_bytes()[:-1] + b"\x00")  # a label
    images = tmp_path / "images"
    images.mkdir()
    Image.fromarray(_test_set()[0][0].numpy()).save(images / "digit.png")
    overrides = [f"ckpt_path={trained_example}", f"input={images}", f"paths.data_dir={tmp_path / 'data'}"]
    predict(compose_config("predict", tmp_path, overrides))
    assert f"{trained_example} was written by other code or data than now: " in caplog.text
    assert "data file t10k-labels-idx1-ubyte differs" in caplog.text
