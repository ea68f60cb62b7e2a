# Part of the MNIST example: a project generated without it has no such file.
"""The notebooks run from the first cell to the last in a real kernel, with the command the README gives."""

import json
import os
from pathlib import Path

import nbformat
import pytest

from mnistlab.runtime.run.console import DropNoise

import processes


def _execute(name: str, project_root: Path) -> tuple[str, dict[str, dict]]:
    """Run notebooks/<name>.ipynb with the README's command (``jupyter execute``, nbclient's: this
    environment's kernel); its outputs as text, and the metrics.json of each run it made."""
    env = os.environ | {"PROJECT_ROOT": str(project_root)}  # paths.root_dir: its runs go to <project_root>/outputs
    executed = project_root / name
    command = ["jupyter", "execute", f"--output={executed}", f"notebooks/{name}.ipynb"]
    result = processes.run(command, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-5000:]  # a failing cell: its traceback
    notebook = nbformat.read(executed.with_suffix(".ipynb"), as_version=4)
    outputs = "".join(str(output) for cell in notebook.cells for output in cell.get("outputs", []))
    for noise in DropNoise.NOISE:  # the console of train.py (console.quiet_console)
        assert noise not in outputs
    runs = (project_root / "outputs" / "notebooks").iterdir()
    return outputs, {run.name.rsplit("-", 5)[0]: json.loads((run / "metrics.json").read_text()) for run in runs}


@pytest.mark.slow
def test_quickstart_trains_and_shows_the_results(tmp_path: Path) -> None:
    outputs, runs = _execute("01_quickstart", tmp_path)
    assert runs["quickstart"]["test/acc"] > 0.95  # two epochs
    assert outputs.count("image/png") == 3  # the training digits, the predictions, the confusion matrix
    assert "train/loss" in outputs  # read back from the run's TensorBoard events
    assert "GPU available: False" in outputs  # what train.py's console shows, the notebook shows


@pytest.mark.slow
def test_ddp_in_the_notebook_trains_as_ddp_from_a_terminal(tmp_path: Path) -> None:
    _, runs = _execute("02_distributed", tmp_path)
    assert runs["ddp-notebook"]["test/acc"] == runs["ddp-terminal"]["test/acc"]
    assert runs["ddp-notebook"]["test/loss"] == pytest.approx(runs["ddp-terminal"]["test/loss"], rel=1e-6)
