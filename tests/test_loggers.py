"""logger=mlflow and logger=wandb, run for real: each store read back after a short run."""

import json
import struct
import subprocess
import sys
from pathlib import Path

import httpx
import mlflow  # the loggers extra (in dev): a missing one fails here, it does not skip
import pytest
import wandb
import yaml

from mnistlab.tasks import train

import processes
from composing import SHORT, SUITE, compose_config
from running import answering, free_port, run_script

pytestmark = pytest.mark.slow  # trains, and writes to each logger's store


def test_mlflow_keeps_the_runs_metrics_and_settings_in_a_local_sqlite_store(tmp_path: Path) -> None:
    cfg = compose_config("train", tmp_path, [*SHORT, "logger=mlflow", "print_config=false"])
    metrics = train(cfg)
    assert not (tmp_path / "config_tree.txt").exists()  # print_config=false: no tree printed, none saved
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("train").experiment_id])
    assert run.data.metrics["test/acc"] == pytest.approx(metrics["test/acc"])
    assert run.data.metrics["val/acc_best"] == pytest.approx(metrics["val/acc_best"])
    assert float(run.data.params["model/optimizer/lr"]) == cfg.model.optimizer.lr
    # The compared few (conf/train.yaml's hparams; a test's composed config has no command line), not all:
    assert set(run.data.params) == {
        "model/optimizer/lr",
        "data/batch_size",
        "trainer/max_epochs",
        "seed",
    }
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert artifacts == {"config.yaml", "test"}  # the whole config, and the test's pictures:
    pictures = {a.path: a.file_size for a in client.list_artifacts(run.info.run_id, "test")}
    assert set(pictures) == {"test/confusion_matrix.png", "test/misclassified.png"} and all(pictures.values())
    assert len(client.get_metric_history(run.info.run_id, "val/acc_best")) == 1  # no extra point at the test
    assert run.data.tags["run_dir"] == str(tmp_path)
    assert len(client.get_metric_history(run.info.run_id, "val/acc")) == 1  # one epoch


def test_the_readmes_mlflow_ui_serves_the_store(tmp_path: Path) -> None:
    metrics = train(compose_config("train", tmp_path, [*SHORT, "logger=mlflow"]))
    port = free_port()
    mlflow_command = str(Path(sys.executable).parent / "mlflow")  # the loggers extra's, as the README runs it
    ui = processes.start(
        [mlflow_command, "ui", "--backend-store-uri", f"sqlite:///{tmp_path}/mlflow.db", "--port", port]
    )
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        assert ui.poll() is None, processes.finish(ui)
        return answering(f"{url}/health")

    # Its server imports MLflow's web stack first: past 60 s on two cores shared with the other worker's ranks.
    processes.until(answers, 180, "mlflow ui answering", every=0.5)
    assert "MLflow" in httpx.get(url, timeout=60).text  # the web page, not only its API (slow on a busy machine)
    experiment = httpx.get(f"{url}/api/2.0/mlflow/experiments/get-by-name", params={"experiment_name": "train"}).json()
    found = httpx.post(
        f"{url}/api/2.0/mlflow/runs/search", json={"experiment_ids": [experiment["experiment"]["experiment_id"]]}
    ).json()
    (run,) = found["runs"]
    shown = {m["key"]: m["value"] for m in run["data"]["metrics"]}
    assert shown["test/acc"] == pytest.approx(metrics["test/acc"])


def test_wandb_writes_an_offline_run_that_can_be_synced_later(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("WANDB_SILENT", "true")
    metrics = train(compose_config("train", tmp_path, [*SHORT, "logger=wandb"]))
    wandb.finish()  # what the end of a script does; Lightning leaves the run open for another fit in this process
    (run,) = (tmp_path / "wandb").glob("offline-run-*")
    (records,) = run.glob("run-*.wandb")  # what `wandb sync` uploads

    # wandb 0.31 reads these files only in its Go core: look for the protobuf records' strings instead.
    # Its core process writes them on its own schedule, after finish() has returned (in CI: only the
    # header at first, then val/acc_best without test/acc): wait a minute for every record looked for.
    expected = [key.encode() + b"\x82\x01" for key in ("test/acc", "val/acc_best")]  # each key as a record's
    expected += [json.dumps(metrics[key]).encode() for key in ("test/acc", "val/acc_best")]  # their values
    expected += [b"optimizer", b"batch_size"]  # the run's settings

    def written() -> bytes:
        data = records.read_bytes()
        return data if all(part in data for part in expected) else b""

    def missing() -> str:
        return f"in {records.name}, {[part for part in expected if part not in records.read_bytes()]}"

    data = processes.until(written, 60, missing, every=0.5)
    assert data.startswith(b":W&B")
    pictures = {p.name.rsplit("_", 2)[0] for p in (run / "files" / "media" / "images" / "test").glob("*.png")}
    assert pictures == {"confusion_matrix", "misclassified"}  # the test's pictures, W&B's way


def test_tensorboard_hparams_are_the_compared_few_and_the_keys_given(tmp_path: Path) -> None:
    given = [*SHORT, "model.optimizer.lr=3e-3", "strategy=auto", "logger=tensorboard"]
    result = run_script("train.py", *given, f"paths.log_dir={tmp_path}", "test=false")
    assert result.returncode == 0, result.stderr[-3000:]
    (hparams,) = tmp_path.rglob("hparams.yaml")  # what Lightning's TensorBoardLogger gave HPARAMS
    logged = yaml.safe_load(hparams.read_text())
    listed = {"model/optimizer/lr", "data/batch_size", "trainer/max_epochs", "seed"}
    typed = {arg.split("=")[0].replace(".", "/") for arg in [*SUITE[1:], *given, "test=false"]}  # data=suite too
    assert set(logged) == listed | typed | {"paths/log_dir", "trainer/accelerator"}
    assert logged["strategy"] == "auto" and logged["model/optimizer/lr"] == 3e-3


def _run_then_resume(tmp_path: Path, logger: str) -> tuple[Path, list[subprocess.CompletedProcess[str]]]:
    """A one-epoch run, then ``resume=`` it for a second epoch (max_epochs changed: a changed parameter)."""
    run = tmp_path / "run"
    common = ["test=false", f"paths.log_dir={tmp_path}"]
    first = run_script("train.py", *SHORT, f"logger={logger}", *common, f"hydra.run.dir={run}")
    second = run_script("train.py", f"resume={run}", "trainer.max_epochs=2", *common)
    for result in (first, second):
        assert result.returncode == 0, result.stderr[-3000:]
    return run, [first, second]


def test_a_resumed_run_logs_into_the_same_mlflow_and_wandb_runs_its_steps_continuous(tmp_path: Path) -> None:
    run, results = _run_then_resume(tmp_path, "[mlflow,wandb]")
    ids = json.loads((run / "trackers.json").read_text())
    assert set(ids) == {"mlflow", "wandb"}
    # MLflow: one run, not two, its curve going on, its parameters as first logged (and the log says so).
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    (found,) = client.search_runs([client.get_experiment_by_name("train").experiment_id])
    assert ids["mlflow"] == found.info.run_id
    curve = client.get_metric_history(found.info.run_id, "val/acc")
    assert [point.step for point in curve] == [19, 39]  # 20 steps an epoch: the second epoch's, after the first's
    assert found.data.params["trainer/max_epochs"] == "1"
    assert "changed since: trainer/max_epochs=2" in (run / "train.log").read_text()
    assert "changed since" in results[1].stdout
    # W&B, offline: a part per process under the same run id (`wandb sync --append` joins them).
    parts = sorted((run / "wandb").glob("offline-run-*"))
    assert [part.name.rsplit("-", 1)[1] for part in parts] == [ids["wandb"], ids["wandb"]]
    steps = []
    for part in parts:
        (records,) = part.glob("run-*.wandb")
        # wandb's core process writes on its own schedule
        processes.until(lambda r=records: any("val/acc" in row for row in _history(r)), 60, "W&B's history", every=0.5)
        steps.append([int(row["trainer/global_step"]) for row in _history(records) if "val/acc" in row])
    assert steps == [[19], [39]]
    assert not any("anonymous" in result.stderr + result.stdout for result in results)  # wandb#10909's warning


def _history(records: Path) -> list[dict[str, str]]:
    """The history rows of a W&B run file (wandb 0.31 reads it only in its Go core): its blocks of
    LevelDB-log records after a 7-byte header, each a protobuf ``Record``."""
    from wandb.proto import wandb_internal_pb2

    data, position, pending, rows = records.read_bytes(), 7, b"", []
    while position + 7 <= len(data):
        if (left := 32768 - position % 32768) < 7:  # a block's tail too short for a header: padding
            position += left
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = wandb_internal_pb2.Record.FromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                rows.append({item.key or "/".join(item.nested_key): item.value_json for item in record.history.item})
    return rows
