"""logger=mlflow and logger=wandb, run for real: each store read back after a short run."""

import json
import time
from pathlib import Path

import mlflow  # the loggers extra (in dev): a missing one fails here, it does not skip
import pytest
import wandb

from mnistlab.tasks import train

from conftest import SHORT, compose_config

pytestmark = pytest.mark.slow  # trains, and writes to each logger's store


def test_mlflow_keeps_the_runs_metrics_and_settings_in_a_local_sqlite_store(tmp_path: Path) -> None:
    metrics = train(compose_config("train", tmp_path, [*SHORT, "logger=mlflow", "print_config=false"]))
    assert not (tmp_path / "config_tree.txt").exists()  # print_config=false: no tree printed, none saved
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("train").experiment_id])
    assert run.data.metrics["test/acc"] == pytest.approx(metrics["test/acc"])
    assert run.data.metrics["val/acc_best"] == pytest.approx(metrics["val/acc_best"])
    assert float(run.data.params["model/optimizer/lr"]) == 1e-3
    assert run.data.tags["run_dir"] == str(tmp_path)
    assert len(client.get_metric_history(run.info.run_id, "val/acc")) == 1  # one epoch


def test_wandb_writes_an_offline_run_that_can_be_synced_later(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("WANDB_SILENT", "true")
    metrics = train(compose_config("train", tmp_path, [*SHORT, "logger=wandb"]))
    wandb.finish()  # what the end of a script does; Lightning leaves the run open for another fit in this process
    (run,) = (tmp_path / "wandb").glob("offline-run-*")
    (records,) = run.glob("run-*.wandb")  # what `wandb sync` uploads
    # wandb 0.31 reads these files only in its Go core: look for the protobuf records' strings instead.
    # Its core process writes them on its own schedule: once, in CI, finish() returned before it had
    # written more than the header; give it a minute.
    deadline = time.monotonic() + 60
    while b"val/acc_best" not in (data := records.read_bytes()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert data.startswith(b":W&B")
    for key in ("test/acc", "val/acc_best"):
        assert key.encode() + b"\x82\x01" in data and json.dumps(metrics[key]).encode() in data  # key, its value
    assert b"optimizer" in data and b"batch_size" in data  # the run's settings
