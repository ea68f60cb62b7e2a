# Part of the MNIST example: a project generated without it has no such file.
"""The lines of docs/export-serve.md that use an exported model with nothing of this project installed, run as written."""

import re
import site
import subprocess
import sys

import numpy as np
import pytest
import torch
import torchvision
from hydra import compose, initialize_config_dir
from PIL import Image

from mnistlab.runtime.checkpointing.checkpoint_io import load_checkpoint
from mnistlab.runtime.config import hydra_versions
from mnistlab.trained import loading
from mnistlab.trained.exporting import SUFFIX, export

import processes
from composing import DATA_DIR, ROOT

pytestmark = pytest.mark.yours  # reads your task: pytest -m yours (docs/make-it-yours.md)

# Each block of docs/export-serve.md that starts "# model.<suffix>: <what it needs>"
BLOCKS = {
    m[1]: m[0]
    for m in re.findall(
        r"```python\n(# model(\.\w+).*?)```", (ROOT / "docs" / "export-serve.md").read_text(), re.DOTALL
    )
}


def _without_this_project(code: str, folder) -> subprocess.CompletedProcess[str]:
    """``code`` run in ``folder`` by a Python that reads site-packages but not its .pth files: this
    project's editable install (a .pth naming src/) is not there, its dependencies are."""
    command = [sys.executable, "-S", "-c", code]
    env = {"PYTHONPATH": ":".join(site.getsitepackages()), "PATH": "/usr/bin:/bin"}
    return processes.run(command, timeout=120, cwd=folder, env=env)


def _test_digit(folder) -> int:
    """A test digit as a 28 x 28 PNG (white on black, as MNIST's), and its label."""
    raw = (ROOT / DATA_DIR / "MNIST" / "raw").resolve()
    pixels = np.frombuffer((raw / "t10k-images-idx3-ubyte").read_bytes()[16 : 16 + 784], np.uint8)
    Image.fromarray(pixels.reshape(28, 28)).save(folder / "digit.png")
    return (raw / "t10k-labels-idx1-ubyte").read_bytes()[8]


@pytest.mark.slow
@pytest.mark.parametrize("format", list(SUFFIX))
def test_the_readme_lines_classify_a_digit_with_the_exported_file_alone(format, trained_example, tmp_path) -> None:
    assert _without_this_project("import mnistlab", tmp_path).returncode != 0
    code = BLOCKS[SUFFIX[format]]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), **hydra_versions.BASE):
        export(compose("export", [f"ckpt_path={trained_example}", f"format={format}", f"paths.output_dir={tmp_path}"]))
    label = _test_digit(tmp_path)
    saved = load_checkpoint(trained_example)
    image = torch.from_numpy(np.asarray(Image.open(tmp_path / "digit.png"), np.float32))
    mean, std = loading.normalization(saved)
    with torch.inference_mode():
        predicted = int(loading.network(saved)(((image / 255 - mean) / std)[None, None]).argmax())
    assert predicted == label  # a digit the network reads right: the page's lines must too

    used = _without_this_project(code, tmp_path)
    assert used.returncode == 0, used.stderr[-2000:]
    assert used.stdout.strip() == torchvision.datasets.MNIST.classes[label]
