"""The ids of the tracker runs a run folder keeps (trackers.json): a damaged file is refused in one line
before any tracker run opens; a run going on in its folder without one says it starts a new tracker run."""

import logging
import re
from pathlib import Path

import mlflow
import pytest

from mnistlab.runtime.reporting import trackers
from mnistlab.runtime.run import run_folder
from mnistlab.runtime.run.failures import InputError
from mnistlab.runtime.run.run_folder import TRACKERS_FILE


@pytest.mark.parametrize("damage", [b'{"mlflow": "2f4e', b"[]", b"", bytes(range(256))])
def test_a_damaged_ids_file_is_refused_before_a_tracker_run_opens(damage: bytes, tmp_path: Path) -> None:
    (tmp_path / TRACKERS_FILE).write_bytes(damage)
    store = f"sqlite:///{tmp_path}/mlflow.db"
    with pytest.raises(InputError, match=re.escape(f"{tmp_path / TRACKERS_FILE} is damaged; it should hold")):
        trackers.ContinuedMLFlowLogger(run_folder=str(tmp_path), tracking_uri=store, experiment_name="train")
    assert (tmp_path / TRACKERS_FILE).read_bytes() == damage
    client = mlflow.MlflowClient(tracking_uri=store)
    assert client.search_runs([e.experiment_id for e in client.search_experiments()]) == []  # no orphan run


def test_a_run_going_on_without_its_ids_says_it_starts_a_new_tracker_run(tmp_path: Path, caplog) -> None:
    assert trackers.saved_id(tmp_path, "mlflow") is None  # a new run folder: a new tracker run, silently
    assert caplog.records == []
    run_folder.checkpoints(tmp_path).mkdir()
    (run_folder.last_checkpoint(tmp_path)).write_bytes(b"")
    with caplog.at_level(logging.WARNING):
        assert trackers.saved_id(tmp_path, "mlflow") is None
    assert f"{tmp_path / TRACKERS_FILE} names no mlflow run for this run to go on in" in caplog.text
