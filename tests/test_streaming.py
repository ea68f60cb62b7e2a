"""data=stream: a data module's splits written as LitData chunks (stream.py), streamed from a folder or an S3
bucket; every sample once per epoch across ranks, after a kill and on another number of ranks too."""

import json
import os
import random
import shutil
import time
from pathlib import Path

import kubeflow
import pods as namespaces
import pytest
import s3_server
import torch

from mnistlab.runtime.config import schema
from mnistlab.runtime.data.streaming import StreamingDataModule
from mnistlab.runtime.run import run_folder
from mnistlab.runtime.run.failures import InputError, RunStopped
from mnistlab.tasks import stream, train

import processes
import running
import suite_task
from composing import EVERY_7_STEPS, SUITE, SUITE_DATA, compose_config
from running import free_port, one_run, run_script

# The suite's data with evaluation sets that no rank count divides: what counts every sample once is seen.
SIZES = {"train_size": 1024, "val_size": 250, "test_size": 250}
STREAMED = ["data=suite_stream", "model=suite_recorder"]
EVERY_5_STEPS = ["callbacks.last_checkpoint.every_n_train_steps=5", "callbacks.last_checkpoint.every_n_epochs=null"]


@pytest.fixture(scope="session")
def chunks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The suite's data (SIZES) as chunks, written as `python stream.py data=suite output=...` does."""
    out = tmp_path_factory.mktemp("chunks")
    sizes = [f"data.{key}={value}" for key, value in SIZES.items()]
    written = stream(compose_config("stream", out / "logs", [f"output={out / 'suite'}", "chunk_bytes=16KB", *sizes]))
    assert written == {split: SIZES[f"{split}_size"] for split in ("train", "val", "test")}
    return out / "suite"


def _samples(run: Path) -> dict[int, list[dict]]:
    """Each rank's records of the samples it trained on (suite_task.SampleRecorder), by rank."""
    return {
        int(path.stem.removeprefix("samples_rank")): [json.loads(line) for line in path.read_text().splitlines()]
        for path in run.glob("samples_rank*.jsonl")
    }


def _each_sample_once(stopped: Path, resumed: Path, saved: int) -> None:
    """The samples of a 1-process run before its checkpoint of step ``saved``, then those of the run resumed
    from it: the epoch, each sample once."""
    (before,), (after,) = _samples(stopped).values(), _samples(resumed).values()
    seen = [i for line in before if line["step"] < saved for i in line["ids"]] + [
        i for line in after for i in line["ids"]
    ]
    assert sorted(seen) == list(range(SIZES["train_size"]))


def _per_epoch(*records: list[dict]) -> dict[int, list[int]]:
    seen: dict[int, list[int]] = {}
    for lines in records:
        for line in lines:
            seen.setdefault(line["epoch"], []).extend(line["ids"])
    return seen


def test_stream_writes_each_sample_once_and_the_data_module_streams_it_back(chunks: Path) -> None:
    datamodule = StreamingDataModule(str(chunks), batch_size=50, fields=["input", "target", "id"])
    datamodule.prepare_data()
    datamodule.setup("fit")
    datamodule.setup("test")
    sizes = {key.removesuffix("_size"): value for key, value in SIZES.items()}
    for split in ("train", "val", "test"):
        # the suite model's 4 classes of 3 x 8 x 8 images (tests/conf/model/suite.yaml, tests/conf/data/suite.yaml)
        inputs, targets = suite_task.draw(sizes, split, 4, (3, 8, 8), SUITE_DATA["noise"], SUITE_DATA["seed"])
        batches = list(getattr(datamodule, f"{split}_dataloader")())
        ids = torch.cat([batch[2] for batch in batches])
        assert sorted(ids.tolist()) == list(range(SIZES[f"{split}_size"])), split
        torch.testing.assert_close(torch.cat([batch[0] for batch in batches]), inputs[ids], rtol=0, atol=0)
        assert torch.equal(torch.cat([batch[1] for batch in batches]), targets[ids])
    # What the source data module said of its data, for a model card: the suite's counts its classes (4).
    assert (datamodule.meta["source"], datamodule.classes, datamodule.input_name) == (
        "suite_task.Patterns",
        4,
        "inputs",
    )


def test_training_from_a_mid_epoch_checkpoint_sees_the_rest_of_the_epoch_then_whole_epochs(
    chunks: Path, tmp_path: Path
) -> None:
    """One process: 2 epochs of 32 steps, stopped at step 14 (a checkpoint every 7), resumed with ckpt_path=:
    the same samples in the same steps as without the stop; the epoch after the resumed one is whole (LitData
    0.2.76's own loader replays the resumed epoch's rest there instead)."""
    run = [*STREAMED, f"data.input_dir={chunks}", "trainer.max_epochs=2", "trainer.limit_val_batches=2", "test=false"]
    run += ["logger=none"]
    train(compose_config("train", tmp_path / "whole", run))
    train(compose_config("train", tmp_path / "stopped", [*run, *EVERY_7_STEPS, "trainer.max_epochs=1"]))
    mid_epoch = run_folder.checkpoints(tmp_path / "stopped") / "step14.ckpt"
    train(compose_config("train", tmp_path / "resumed", [*run, f"ckpt_path={mid_epoch}"]))
    (whole,), (stopped,), (resumed,) = (_samples(tmp_path / name).values() for name in ("whole", "stopped", "resumed"))
    before = [line for line in stopped if line["step"] < 14]
    assert [line["ids"] for line in [*before, *resumed]] == [line["ids"] for line in whole]
    for epoch, ids in _per_epoch(whole).items():
        assert sorted(ids) == list(range(SIZES["train_size"])), epoch


def test_a_run_resumed_from_an_epochs_end_trains_the_next_epoch_whole(chunks: Path, tmp_path: Path) -> None:
    run = [*STREAMED, f"data.input_dir={chunks}", "trainer.limit_val_batches=2", "test=false", "logger=none"]
    train(compose_config("train", tmp_path / "first", [*run, "trainer.max_epochs=1"]))
    last = run_folder.last_checkpoint(tmp_path / "first")
    train(compose_config("train", tmp_path / "next", [*run, "trainer.max_epochs=2", f"ckpt_path={last}"]))
    (lines,) = _samples(tmp_path / "next").values()
    assert {line["epoch"] for line in lines} == {1}
    assert sorted(_per_epoch(lines)[1]) == list(range(SIZES["train_size"]))


@pytest.mark.parametrize("fault", ["deleted", "damaged"])
def test_a_chunk_deleted_or_damaged_mid_run_stops_it_in_one_line_and_its_checkpoint_resumes(
    fault: str, chunks: Path, tmp_path: Path
) -> None:
    """A training chunk gone, or overwritten with noise, after stream.py wrote it: the run stops in one line
    with the resume command when it reaches that chunk (LitData alone: a timeout or a KeyError from deep in
    its decoder); last.ckpt, written before, is whole, and continues the run once the chunk is back."""
    copy = tmp_path / "chunks"
    shutil.copytree(chunks, copy)
    chunk = copy / "train" / "chunk-0-20.bin"
    if fault == "deleted":
        chunk.unlink()
    else:
        damaged = bytearray(chunk.read_bytes())
        damaged[100:4000] = bytes(random.Random(0).randrange(256) for _ in range(3900))
        chunk.write_bytes(bytes(damaged))
    run = [*STREAMED, f"data.input_dir={copy}", "trainer.max_epochs=1", "trainer.limit_val_batches=2", "test=false"]
    run += [*EVERY_5_STEPS, "logger=none"]
    with pytest.raises(RunStopped) as stopped:
        train(compose_config("train", tmp_path / "run", run))
    said = str(stopped.value)
    assert said.startswith("Stopped at step ") and f"a chunk of {copy} cannot be read (" in said
    assert said.endswith(f"Continue with: python train.py resume={tmp_path / 'run'}") and "\n" not in said
    step = int(said.removeprefix("Stopped at step ").split(":")[0])
    last = run_folder.last_checkpoint(tmp_path / "run")
    saved = torch.load(last, weights_only=True)["global_step"]
    assert 0 < saved <= step < SIZES["train_size"] // 32
    shutil.copyfile(chunks / "train" / chunk.name, chunk)  # the chunks whole again
    train(compose_config("train", tmp_path / "resumed", [*run, f"ckpt_path={last}"]))
    _each_sample_once(tmp_path / "run", tmp_path / "resumed", saved)


@pytest.mark.slow  # an S3 server: a cache holds only a bucket's chunks
def test_a_full_cache_folder_stops_the_run_in_one_line_and_its_checkpoint_resumes(
    chunks: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk of data.cache_dir runs full at step 3 (another process took its room): the run stops in one
    line naming the cache folder and what to do, with the resume command (LitData alone: its download thread's
    traceback, then a "deleted or damaged" chunk); with room again, last.ckpt continues it, each sample once."""
    import boto3

    for name, value in s3_server.start(tmp_path / "moto.txt", bucket="data").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # it read the environment once: this test's, not a later's
    client = boto3.client("s3")
    for path in (path for path in chunks.rglob("*") if path.is_file()):
        client.upload_file(str(path), "data", f"suite/{path.relative_to(chunks).as_posix()}")
    with running.small_disk(tmp_path / "cache", "4m") as cache:
        run = [*STREAMED, "data.input_dir=s3://data/suite", f"data.cache_dir={cache}", "trainer.max_epochs=1"]
        every_step = [
            "callbacks.last_checkpoint.every_n_train_steps=1",
            "callbacks.last_checkpoint.every_n_epochs=null",
        ]
        run += ["trainer.limit_val_batches=2", "test=false", *every_step, "logger=none"]
        # Early: LitData fetches chunks well ahead, and may hold the whole (small) split some steps later.
        fill = ["+callbacks.fill._target_=faults.FillAt", "+callbacks.fill.step=3", f"+callbacks.fill.folder={cache}"]
        with pytest.raises(RunStopped) as stopped:
            train(compose_config("train", tmp_path / "run", [*run, *fill]))
        said = str(stopped.value)
        assert said.startswith("Stopped at step ") and f"the cache folder {cache} is full (" in said, said
        assert said.endswith(f"Continue with: python train.py resume={tmp_path / 'run'}") and "\n" not in said
        step = int(said.removeprefix("Stopped at step ").split(":")[0])
        last = run_folder.last_checkpoint(tmp_path / "run")
        saved = torch.load(last, weights_only=True)["global_step"]
        assert 0 < saved <= step < SIZES["train_size"] // 32
        (cache / "filler").unlink()  # room again
        train(compose_config("train", tmp_path / "resumed", [*run, f"ckpt_path={last}"]))
    _each_sample_once(tmp_path / "run", tmp_path / "resumed", saved)


def test_a_streamed_run_evaluates_every_sample_once_and_learns_as_from_memory(chunks: Path, tmp_path: Path) -> None:
    epochs = ["trainer.max_epochs=3", "logger=none"]
    sizes = [f"data.{key}={value}" for key, value in SIZES.items()]
    streamed = train(compose_config("train", tmp_path / "streamed", [*STREAMED, f"data.input_dir={chunks}", *epochs]))
    in_memory = train(compose_config("train", tmp_path / "memory", [*sizes, *epochs]))
    assert streamed["test/samples"] == in_memory["test/samples"] == SIZES["test_size"]
    # Another order of the same samples (LitData's shuffle): another path to a model as good.
    assert abs(streamed["test/acc"] - in_memory["test/acc"]) <= 0.05, (streamed, in_memory)


def test_chunks_missing_or_there_already_are_one_line(chunks: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"holds no chunks for train, val, test .* `python stream.py data="):
        StreamingDataModule(str(tmp_path)).prepare_data()
    with pytest.raises(InputError, match=r"already holds chunks \(train, val, test\): pass overwrite=true"):
        stream(compose_config("stream", tmp_path, [f"output={chunks}"]))
    with pytest.raises(InputError, match=r"gs://bucket/x: stream.py writes to a folder or to s3://<bucket>/<prefix>"):
        stream(compose_config("stream", tmp_path, ["output=gs://bucket/x"]))


def test_a_global_batch_the_ranks_do_not_divide_is_refused(chunks: Path, tmp_path: Path) -> None:
    overrides = [*STREAMED, f"data.input_dir={chunks}", "data.batch_size=33", "strategy=ddp", "trainer.devices=2"]
    with pytest.raises(InputError, match="data.batch_size=33 is the global batch .* multiple of the world size 2"):
        schema.check(compose_config("train", tmp_path, overrides), schema.TrainConfig)


# SIGKILL: nothing saved, last.ckpt is step 20's; SIGTERM (SLURM's preemption, Kubernetes' eviction) to rank 0:
# the ranks agree to stop and save at their next look at signals (every 4 steps here: callbacks.safe_stop).
STOPS = {
    "SIGKILL": ["+callbacks.kill._target_=faults.KillAt", "+callbacks.kill.step=23"],
    "SIGTERM": ["+callbacks.term._target_=faults.SignalAt", "+callbacks.term.step=23", "trainer.log_every_n_steps=4"],
}


@pytest.mark.slow
@pytest.mark.parametrize(("stop", "ranks", "resumed_on"), [("SIGKILL", 1, 1), ("SIGTERM", 2, 2), ("SIGKILL", 4, 2)])
def test_a_streamed_run_stopped_mid_epoch_resumes_with_each_sample_once(
    stop: str, ranks: int, resumed_on: int, chunks: Path, tmp_path: Path
) -> None:
    """1, 2 or 4 DDP ranks stopped at step 23 of epoch 0's 32; ``resume=`` on as many ranks, or on 2 of 4 (a node
    lost): each sample of each epoch trained on exactly once, over the ranks, before the stop and after."""
    ddp = ["strategy=ddp", "trainer.accelerator=cpu", "allow_cpu_oversubscription=true", "logger=none"]
    common = [*STREAMED, f"data.input_dir={chunks}", "trainer.max_epochs=2", "trainer.limit_val_batches=2", *ddp]
    result = run_script(
        "train.py",
        *common,
        *EVERY_5_STEPS,
        f"trainer.devices={ranks}",
        *STOPS[stop],
        "test=false",
        f"paths.log_dir={tmp_path}",
    )
    assert result.returncode != 0
    (run,) = (tmp_path / "train" / "runs").iterdir()
    stopped_at = torch.load(run_folder.last_checkpoint(run), weights_only=True)["global_step"]
    assert stopped_at == (20 if stop == "SIGKILL" else 24), stopped_at  # mid-epoch either way
    before = {rank: [line for line in lines if line["step"] < stopped_at] for rank, lines in _samples(run).items()}
    for path in run.glob("samples_rank*.jsonl"):
        path.unlink()

    # The run's own overrides are replayed (data=suite_stream among them); Hydra's search path is given again.
    search_path = [arg for arg in SUITE if arg.startswith("hydra.searchpath")]
    result = run_script(
        "train.py",
        f"resume={run}",
        f"trainer.devices={resumed_on}",
        "test=false",
        f"paths.log_dir={tmp_path}",
        task=search_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    after = _samples(run)
    assert sorted(after) == list(range(resumed_on))
    seen = _per_epoch(*before.values(), *after.values())
    for epoch in (0, 1):
        assert sorted(seen[epoch]) == list(range(SIZES["train_size"])), f"epoch {epoch}"
    assert min(line["step"] for lines in after.values() for line in lines) == stopped_at


@pytest.mark.slow
def test_two_ranks_stream_from_a_bucket_count_every_sample_once_and_write_no_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """stream.py's task writes the suite's data into s3://data/suite (in this process, the bucket's
    credentials in its environment); two DDP ranks train from it (chunks cached in data.cache_dir) and test
    on 250 samples, 125 each; the secret key is in no file of the run or its logs."""
    import boto3

    s3 = s3_server.start(tmp_path / "moto.txt", bucket="data")
    env = {**os.environ, **s3}
    sizes = [f"data.{key}={value}" for key, value in SIZES.items()]
    logs = f"paths.log_dir={tmp_path / 'logs'}"
    for name, value in s3.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # it read the environment once: a new process's
    stream(compose_config("stream", tmp_path / "stream", ["output=s3://data/suite", "chunk_bytes=16KB", *sizes]))
    streamed = capfd.readouterr()
    ddp = ["strategy=ddp", "trainer.devices=2", "trainer.accelerator=cpu", "trainer.max_epochs=1"]
    source = ["data.input_dir=s3://data/suite", f"data.cache_dir={tmp_path / 'cache'}"]
    command = processes.python("train.py", *STREAMED, *source, *ddp, *EVERY_7_STEPS, logs)
    trained = processes.run(command, env=env)
    assert trained.returncode == 0, trained.stderr[-3000:]
    run = one_run(tmp_path / "logs")
    # From its mid-epoch checkpoint on a node whose cache is elsewhere (LitData alone refuses: its state holds
    # the cache's path): the rest of the epoch, each sample once with the steps before.
    elsewhere = [f"data.cache_dir={tmp_path / 'other-cache'}", f"paths.log_dir={tmp_path / 'resumed'}"]
    middle = f"ckpt_path={run_folder.checkpoints(run) / 'step14.ckpt'}"
    command = processes.python("train.py", *STREAMED, source[0], *ddp, middle, "test=false", *elsewhere)
    resumed = processes.run(command, env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    before = [i for lines in _samples(run).values() for line in lines if line["step"] < 14 for i in line["ids"]]
    after = [i for lines in _samples(one_run(tmp_path / "resumed")).values() for line in lines for i in line["ids"]]
    assert sorted(before + after) == list(range(SIZES["train_size"]))
    metrics = json.loads((run / run_folder.METRICS_FILE).read_text())
    assert metrics["test/samples"] == SIZES["test_size"]
    assert sorted(i for lines in _samples(run).values() for line in lines for i in line["ids"]) == list(
        range(SIZES["train_size"])
    )
    secret = s3["AWS_SECRET_ACCESS_KEY"].encode()
    written = [p for p in (tmp_path / "logs").rglob("*") if p.is_file()]
    assert len(written) > 10 and not [p for p in written if secret in p.read_bytes()]
    assert secret not in (streamed.out + streamed.err + trained.stdout + trained.stderr).encode()
    _refusals_of_a_bucket(s3, tmp_path, monkeypatch)


def _refusals_of_a_bucket(s3: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing bucket, a wrong secret key, an endpoint that does not answer: one line each, to write and to
    read (asked in this process: the lines reach the user as every InputError does, ``Error: <line>``)."""
    import boto3

    sizes = [f"data.{key}={value}" for key, value in SIZES.items()]

    def refused(env: dict[str, str], output: str, input_dir: str, **module: float) -> tuple[str, str]:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # it read the environment once: a new process's
        with pytest.raises(InputError) as writing:
            stream(compose_config("stream", tmp_path / "refused", [*SUITE, f"output={output}", *sizes]))
        with pytest.raises(InputError) as reading:
            StreamingDataModule(input_dir, **module).setup("fit")
        return str(writing.value), str(reading.value)

    written, read = refused(s3, "s3://no-such-bucket/suite", "s3://no-such-bucket/suite")
    assert written.startswith("cannot write to s3://no-such-bucket/suite: ") and "\n" not in written
    assert read.startswith("cannot read the chunks in s3://no-such-bucket/suite/train: ") and "\n" not in read
    written, read = refused(s3 | {"AWS_SECRET_ACCESS_KEY": "not-the-secret"}, "s3://data/other", "s3://data/suite")
    assert written.startswith("cannot write to s3://data/other: ") and "SignatureDoesNotMatch" in written
    assert read.startswith("cannot read the chunks in s3://data/suite/train: ") and "(403)" in read
    assert "refused these credentials" in read
    # Nobody listens at the endpoint: within data.timeout's 3 tries (LitData alone retries 1,000 times).
    silent = s3 | {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}
    started = time.monotonic()
    written, read = refused(silent, "s3://data/other", "s3://data/suite", timeout=2)
    assert read.startswith("cannot read the chunks in s3://data/suite/train: ") and time.monotonic() - started < 60


@pytest.mark.slow
@pytest.mark.xdist_group("pods")  # the pods' network namespaces share one subnet (tests/test_kubernetes.py)
def test_two_pods_of_two_ranks_stopped_mid_epoch_and_started_again_see_each_sample_once(
    chunks: Path, tmp_path: Path
) -> None:
    """deploy/kubernetes/trainjob.yaml's command in two "pods" of two processes (tests/pods.py): rank 0 gets
    SIGTERM (an eviction) at step 23 of epoch 0; every rank saves at step 24 and exits; the pods, started
    again as Kubernetes restarts them, resume from it: each sample of each epoch once over the 4 ranks."""
    job = kubeflow.trainjob_pods(kubeflow.manifest("trainjob.yaml"), "stream-x7k2p")
    stop = [*STOPS["SIGTERM"], "trainer.max_epochs=2", "trainer.limit_val_batches=2", "test=false", "logger=none"]
    overrides = [*SUITE, *STREAMED, f"data.input_dir={chunks}", "trainer.accelerator=cpu", *stop]

    def start_the_pods() -> list[str]:
        started = [
            pods.start(i, [*namespaces.python_module(kubeflow.on_volume(pod.command, tmp_path)), *overrides], pod.env)
            for i, pod in enumerate(job)
        ]
        return [processes.finish(process) for process in started]

    with namespaces.running([pod.names for pod in job]) as pods:
        first = start_the_pods()
        run = tmp_path / "outputs" / "train" / "runs" / "stream-x7k2p"
        assert torch.load(run_folder.last_checkpoint(run), weights_only=True)["global_step"] == 24, first[0][-3000:]
        again = start_the_pods()
    assert "Starting with 4 processes" in again[0], again[0][-3000:]
    records = _samples(run)
    assert sorted(records) == [0, 1, 2, 3]
    for epoch, ids in _per_epoch(*records.values()).items():
        assert sorted(ids) == list(range(SIZES["train_size"])), f"epoch {epoch}"
    assert torch.load(run_folder.last_checkpoint(run), weights_only=True)["global_step"] == 64
