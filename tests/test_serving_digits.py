# Part of the MNIST example: a project generated without it has no such file.
"""serve.py with the example's input: digit images (PNG, JPEG, any size, either polarity), prepared as
predict.py prepares files, asked by a real HTTP client (httpx)."""

import base64
import io

import httpx
import numpy as np
import pytest
from PIL import Image
from torchvision.datasets import MNIST

from mnistlab.example import digits
from mnistlab.trained import inference

import onnx_models
from composing import DATA_DIR
from running import run_script, serving

pytestmark = pytest.mark.yours  # reads your task: pytest -m yours (docs/make-it-yours.md)


def _png(pixels: np.ndarray, scale: int, dark_on_light: bool) -> bytes:
    image = Image.fromarray(255 - pixels if dark_on_light else pixels).resize((28 * scale,) * 2, Image.Resampling.BOX)
    file = io.BytesIO()
    image.save(file, format="PNG")
    return file.getvalue()


@pytest.mark.slow
def test_digit_images_are_classified_as_predict_classifies_them_and_bad_ones_get_400(trained_example, tmp_path):
    test = MNIST(DATA_DIR, train=False)
    images = [_png(test.data[i].numpy(), 1 + i % 3, i % 2 == 1) for i in range(24)]
    model = inference.load(trained_example, data_dir=DATA_DIR)  # as predict.py loads it
    prepared = np.stack([digits.decode(image, max_pixels=10**6) for image in images])
    expected = model.probabilities(prepared).argmax(1).tolist()
    assert np.mean(np.array(expected) == test.targets[:24].numpy()) > 0.8  # a trained model reads them

    with serving(tmp_path / "serve", f"ckpt_path={trained_example}", "decode.max_pixels=10_000") as url:
        answers = [
            httpx.post(f"{url}/predict", content=image, headers={"Content-Type": "image/png"}) for image in images
        ]
        assert [a.json()["class"] for a in answers] == expected
        assert answers[0].json()["name"] == MNIST.classes[expected[0]]
        batch = {"images": [base64.b64encode(image).decode() for image in images]}
        assert [p["class"] for p in httpx.post(f"{url}/predict", json=batch).json()["predictions"]] == expected

        large = _png(test.data[0].numpy(), 4, False)  # 112 x 112 = 12,544 pixels
        for body, reason in [(b"GIF89a...", "the input is not an image PIL can read (PNG, JPEG)"),
                             (large, "the input has 12,544 pixels, over max_pixels=10,000"),
                             (images[0][:200], "the input is not an image PIL can read")]:  # fmt: skip
            refused = httpx.post(f"{url}/predict", content=body, headers={"Content-Type": "image/png"})
            assert refused.status_code == 400 and reason in refused.json()["detail"], refused.text
        assert httpx.get(f"{url}/health").text == "ok"


@pytest.mark.slow
def test_a_model_that_does_not_take_digit_images_is_refused_at_start_not_served(tmp_path) -> None:
    """Not a healthy server that answers every request with a 400 blaming its client: one line, exit 1."""
    model = onnx_models.flattening(tmp_path / "model.onnx", ["N", 784])
    result = run_script("serve.py", f"ckpt_path={model}", f"paths.log_dir={tmp_path}", timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "Error: the model takes inputs of shape (784), but decode (mnistlab.example.digits.decode) gives (1, 28, 28): "
        "serve or predict with a model exported from a checkpoint of this task"
    )
