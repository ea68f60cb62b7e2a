"""A run or sweep folder takes one process at a time: a second start on it is refused in one line naming
the holder, and the first goes on to the end (runtime/run/folder_lock.py)."""

import fcntl
import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from mnistlab.runtime.run import folder_lock, run_folder
from mnistlab.runtime.run.failures import InputError
from mnistlab.runtime.run.run_folder import LOCK_FILE

import processes
from composing import SHORT
from running import run_script


def test_a_held_folder_is_refused_naming_its_holder_and_free_once_released(tmp_path: Path) -> None:
    # Another open file of the lock stands in for another process: flock locks belong to the open file.
    other = open(tmp_path / LOCK_FILE, "a+")  # noqa: SIM115
    other.write("host elsewhere, pid 4242\n")
    other.flush()
    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with pytest.raises(InputError, match=re.escape(f"the run {tmp_path} is in use by host elsewhere, pid 4242")):
        folder_lock.hold(tmp_path, "the run")
    other.close()  # its process ended: the operating system releases its lock
    folder_lock.hold(tmp_path, "the run")
    try:
        assert (tmp_path / LOCK_FILE).read_text() == f"host {os.uname().nodename}, pid {os.getpid()}\n"
        folder_lock.hold(tmp_path, "the run")  # again in the same process: it holds it already
    finally:
        folder_lock.release(tmp_path)


# The second process of a job, as each launcher starts it (runtime/run/launch.py).
LAUNCHED_AS_RANK_ONE = (
    {"TORCHELASTIC_RUN_ID": "job", "RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2"},  # torchrun
    {"SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_JOB_NAME": "train"},  # srun
    {"LOCAL_RANK": "1", "NODE_RANK": "0", "WORLD_SIZE": "2"},  # Lightning's launcher
    {"NODE_RANK": "1"},  # a second machine, started by hand
    {"RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "2"},  # Ray Train's worker
)


def test_only_rank_zero_takes_the_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The other ranks of a run work in its folder on purpose: they neither take nor wait for the lock."""
    other = open(tmp_path / LOCK_FILE, "a+")  # noqa: SIM115
    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    other.write("host h, pid 1\n")
    other.flush()
    for launched in LAUNCHED_AS_RANK_ONE:
        with monkeypatch.context() as env:
            for name, value in launched.items():
                env.setenv(name, value)
            folder_lock.refuse_if_held(tmp_path, "the run")  # no refusal: not rank 0
            folder_lock.hold(tmp_path, "the run")
            assert (tmp_path / LOCK_FILE).read_text() == "host h, pid 1\n"  # neither taken nor written
    with pytest.raises(InputError, match="is in use by host h, pid 1"):  # rank 0 would have been refused
        folder_lock.hold(tmp_path, "the run")
    other.close()


def _started(command: list[str], lock: Path) -> subprocess.Popen[str]:
    process = processes.start(command)

    def locked() -> bool:
        assert process.poll() is None, "the first start ended before it took its lock"
        return f"pid {process.pid}" in (lock.read_text() if lock.is_file() else "")

    processes.until(locked, 120, "the first start taking its lock")
    return process


@pytest.mark.slow
def test_a_second_start_on_a_running_run_is_refused_and_the_first_keeps_every_metric(tmp_path: Path) -> None:
    """The first run is held still (SIGSTOP, in its third epoch) while the others try: however fast it
    trains, it is in use when they start."""
    run = tmp_path / "run"
    longer = ["trainer.max_epochs=6", "trainer.limit_train_batches=30", "logger=none", f"hydra.run.dir={run}"]
    pause = ["+callbacks.pause._target_=faults.HangAt", "+callbacks.pause.step=65", "+callbacks.pause.rank=0"]
    first = _started(processes.python("train.py", "trainer.accelerator=cpu", *longer, *pause), run / LOCK_FILE)
    processes.until(lambda: processes.state(first.pid) == "T", 120, "the first run held still at step 65")
    for attempt in (["trainer.max_epochs=8"], []):  # to train it longer; the same again
        second = run_script("train.py", f"resume={run}", *attempt, timeout=120)
        assert second.returncode == 1
        assert second.stderr.strip() == (
            f"Error: the run {run} is in use by host {os.uname().nodename}, pid {first.pid}: wait for it to "
            "end, or stop it first (a folder takes one process at a time)"
        )
    first.send_signal(signal.SIGCONT)
    output = processes.finish(first)
    assert first.returncode == 0, output[-3000:]
    metrics = json.loads((run / "metrics.json").read_text())
    assert {"val/acc", "val/acc_best", "train/loss", "test/acc"} <= metrics.keys()
    assert [p.name for p in run_folder.checkpoints(run).glob("*-v1.ckpt")] == []  # no second writer's files


@pytest.mark.slow
def test_a_resume_of_a_running_sweep_is_refused(tmp_path: Path) -> None:
    sweep_args = ["-m", "model.optimizer.lr=1e-2,1e-3", "trainer.max_epochs=4", "logger=none", *SHORT[1:]]
    command = processes.python("train.py", *sweep_args, f"paths.log_dir={tmp_path}")
    first = processes.start(command)

    def locked() -> list[Path]:
        assert first.poll() is None, "the sweep ended before it took its lock"
        return list((tmp_path / "train" / "multiruns").glob(f"*/{LOCK_FILE}"))

    processes.until(locked, 120, "the sweep taking its lock")
    (sweep,) = (tmp_path / "train" / "multiruns").iterdir()
    second = run_script("train.py", f"resume={sweep}", timeout=120)
    assert second.returncode == 1
    assert second.stderr.strip().startswith(f"Error: the sweep {sweep} is in use by host {os.uname().nodename}, pid ")
    output = processes.finish(first)
    assert first.returncode == 0, output[-3000:]
    for job in ("0", "1"):
        assert "val/acc_best" in json.loads((sweep / job / "metrics.json").read_text())
