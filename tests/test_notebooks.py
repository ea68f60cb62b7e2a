"""The notebooks run from the first cell to the last in a real kernel (nbclient), as a reader runs them."""

import json
from pathlib import Path

import nbclient  # the dev extra: a missing one fails here, it does not skip
import nbformat
import pytest

from conftest import ROOT


def _execute(name: str, project_root: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, dict[str, dict]]:
    """Run notebooks/<name>.ipynb; its outputs as text, and the metrics.json of each run it made."""
    monkeypatch.setenv("PROJECT_ROOT", str(project_root))  # paths.root_dir: its runs go to <project_root>/outputs
    notebook = nbformat.read(ROOT / "notebooks" / f"{name}.ipynb", as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=600, resources={"metadata": {"path": str(ROOT / "notebooks")}})
    client.execute()  # raises CellExecutionError, with the cell and its traceback, if a cell fails
    outputs = "".join(str(output) for cell in notebook.cells for output in cell.get("outputs", []))
    runs = (project_root / "outputs" / "notebooks").iterdir()
    return outputs, {run.name.rsplit("-", 5)[0]: json.loads((run / "metrics.json").read_text()) for run in runs}


@pytest.mark.slow
def test_quickstart_trains_and_shows_the_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    outputs, runs = _execute("01_quickstart", tmp_path, monkeypatch)
    assert runs["quickstart"]["test/acc"] > 0.95  # two epochs
    assert outputs.count("image/png") == 3  # the training digits, the predictions, the confusion matrix
    assert "train/loss" in outputs  # read back from the run's TensorBoard events


@pytest.mark.slow
def test_ddp_in_the_notebook_trains_as_ddp_from_a_terminal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, runs = _execute("02_distributed", tmp_path, monkeypatch)
    assert runs["ddp-notebook"]["test/acc"] == runs["ddp-terminal"]["test/acc"]
    assert runs["ddp-notebook"]["test/loss"] == pytest.approx(runs["ddp-terminal"]["test/loss"], rel=1e-6)
