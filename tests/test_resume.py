"""``resume=<run folder>``: a stopped or killed run goes on in its folder and ends as if never stopped."""

import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mnistlab import resume
from mnistlab.checks import InputError
from mnistlab.tasks import train

from conftest import DETERMINISTIC, ROOT, assert_same_weights, compose_config, run_script
from conftest import last_checkpoint as _last

# model.net.hidden: an override the resumed run must take from the run's folder (the checkpoint
# would not load into the default width).
RUN = [*DETERMINISTIC, "model.net.hidden=64"]


def _one_run(log_dir: Path) -> Path:
    (run,) = (log_dir / "train" / "runs").iterdir()
    return run


def test_resume_continues_a_killed_run_in_its_folder_with_its_overrides(tmp_path: Path) -> None:
    whole = train(compose_config("train", tmp_path / "whole", RUN))
    # Killed (SIGKILL: no chance to save anything) as epoch 2 starts: last.ckpt is epoch 1's.
    killed = [
        *RUN,
        "+callbacks.kill._target_=faults.SignalAt",
        "+callbacks.kill.step=60",
        "+callbacks.kill.signal=SIGKILL",
    ]
    result = run_script("train.py", *killed, f"paths.log_dir={tmp_path}")
    assert result.returncode == -signal.SIGKILL
    run = _one_run(tmp_path)
    assert (_last(run)["epoch"], _last(run)["global_step"]) == (1, 60)

    result = run_script("train.py", f"resume={run}", "trainer.num_sanity_val_steps=0", f"paths.log_dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert _one_run(tmp_path) == run  # the same folder, no second run
    log = (run / "train.log").read_text()
    assert f"Resuming the run in {run}; its overrides: " in log and "model.net.hidden=64" in log
    assert "Overrides given now, on top: trainer.num_sanity_val_steps=0" in log
    assert f"Restored all states from the checkpoint at {run / 'checkpoints' / 'last.ckpt'}" in log
    assert_same_weights(_last(tmp_path / "whole"), _last(run))
    tested = torch.load(next((run / "checkpoints").glob("epoch*.ckpt")), weights_only=True)
    assert (
        tested["epoch"]
        == torch.load(next((tmp_path / "whole" / "checkpoints").glob("epoch*.ckpt")), weights_only=True)["epoch"]
    )
    metrics = (run / "metrics.json").read_text()
    assert f'"test/acc": {whole["test/acc"]}' in metrics
    # TensorBoard: one run, its events continued in the same folder (no version_N beside it).
    assert {p.parent for p in run.rglob("events.out.tfevents.*")} == {run / "tensorboard"}


def test_overrides_given_when_resuming_replace_the_runs_own(tmp_path: Path) -> None:
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text("- model.net.hidden=64\n- trainer.max_epochs=3\n")
    (tmp_path / "checkpoints").mkdir()
    torch.save({"state_dict": {}}, tmp_path / "checkpoints" / "last.ckpt")
    argv = resume.expand(["train.py", f"resume={tmp_path}", "trainer.max_epochs=5"])
    assert argv == [
        "train.py",
        "model.net.hidden=64",
        f"resume='{tmp_path}'",
        "trainer.max_epochs=5",
        f"hydra.run.dir='{tmp_path}'",
        "hydra.output_subdir=null",  # this attempt's config is recorded once it is known to work
    ]
    assert resume.split(argv[1:-2]) == (["model.net.hidden=64"], ["trainer.max_epochs=5"])


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda p: p / "nope", "no such folder"),
        (lambda p: p, "is not a run folder (no .hydra/overrides.yaml in it)"),
        (
            lambda p: (p / ".hydra").mkdir() or (p / ".hydra" / "overrides.yaml").write_text("[]") and p,
            "no checkpoints",
        ),
        (lambda p: (p / "multirun.yaml").write_text("{}") and p, "is a sweep's folder; name one of its jobs"),
    ],
)
def test_resume_refuses_what_is_not_a_resumable_run(make, message: str, tmp_path: Path) -> None:
    with pytest.raises(InputError, match=re.escape(message)):
        resume.expand(["train.py", f"resume={make(tmp_path)}"])


def test_resume_refusal_is_one_line(tmp_path: Path) -> None:
    result = run_script("train.py", f"resume={tmp_path}", timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip() == f"Error: resume={tmp_path} is not a run folder (no .hydra/overrides.yaml in it)"


@pytest.mark.slow
def test_killed_at_random_moments_the_resumed_run_ends_as_if_never_killed(tmp_path: Path) -> None:
    """SIGKILL three times: once halfway through writing a checkpoint, twice at a random moment;
    each time resumed with resume=. last.ckpt is written every 5 steps."""
    steps = [*RUN, "trainer.limit_train_batches=150", "callbacks.last_checkpoint.every_n_train_steps=5"]
    steps.append("callbacks.last_checkpoint.every_n_epochs=null")
    train(compose_config("train", tmp_path / "whole", steps))
    plugin = "trainer.plugins=[{_target_:faults.KilledMidWrite,step:55}]"
    first = run_script("train.py", *steps, plugin, f"paths.log_dir={tmp_path / 'killed'}")
    assert first.returncode == -signal.SIGKILL
    run = _one_run(tmp_path / "killed")
    assert _last(run)["global_step"] == 50 and (run / "checkpoints" / ".last.ckpt.partial").is_file()
    rng = random.Random()
    for _ in range(2):
        _kill_after_next_checkpoint(run, delay=rng.uniform(0, 1.0))
    final = run_script("train.py", f"resume={run}", f"paths.log_dir={tmp_path / 'killed'}")
    assert final.returncode == 0, final.stderr[-3000:]
    assert _last(run)["global_step"] == 3 * 150
    assert_same_weights(_last(tmp_path / "whole"), _last(run))


def _kill_after_next_checkpoint(run: Path, delay: float) -> None:
    """Resume the run and SIGKILL it ``delay`` seconds after it has written its first new checkpoint."""
    last = run / "checkpoints" / "last.ckpt"
    before = last.stat().st_mtime_ns
    command = [sys.executable, str(ROOT / "train.py"), f"resume={run}"]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while last.stat().st_mtime_ns == before and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(delay)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)


def test_resume_from_a_broken_last_checkpoint_names_the_whole_ones_and_touches_nothing(tmp_path: Path) -> None:
    run = tmp_path / "run"
    train(compose_config("train", run, [*RUN, "trainer.max_epochs=1", "logger=none", "test=false"]))
    (run / ".hydra").mkdir()
    (run / ".hydra" / "overrides.yaml").write_text("- model.net.hidden=64\n")
    last = run / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[:100_000])  # cut short: a disk that filled, a copy that stopped
    (best,) = (run / "checkpoints").glob("epoch*.ckpt")
    records = {p: p.read_bytes() for p in (run / ".hydra").iterdir()}
    with pytest.raises(InputError) as refused:
        resume.expand(["train.py", f"resume={run}"])
    assert str(refused.value).startswith(f"resume={run}: its checkpoints/last.ckpt is not a whole checkpoint (")
    assert str(refused.value).endswith(
        f"the whole checkpoints beside it, newest first: {best.name}; continue from one with "
        f"python train.py resume={run} ckpt_path={best}"
    )
    assert {p: p.read_bytes() for p in (run / ".hydra").iterdir()} == records  # the run's records untouched
    # The suggested command passes the check: ckpt_path= names the checkpoint to continue from.
    assert f"ckpt_path={best}" in resume.expand(["train.py", f"resume={run}", f"ckpt_path={best}"])


@pytest.mark.slow
def test_each_resume_is_recorded_beside_the_launch(tmp_path: Path) -> None:
    first = run_script("train.py", *RUN, "trainer.max_epochs=1", "logger=none", f"paths.log_dir={tmp_path}")
    assert first.returncode == 0, first.stderr[-2000:]
    run = _one_run(tmp_path)
    launch = (run / ".hydra" / "overrides.yaml").read_text()
    for epochs in (2, 3):
        again = run_script(
            "train.py", f"resume={run}", f"trainer.max_epochs={epochs}", "trainer.num_sanity_val_steps=0"
        )
        assert again.returncode == 0, again.stderr[-2000:]
    assert (run / ".hydra" / "overrides.yaml").read_text() == launch  # the launch's record stays
    records = sorted((run / resume.HISTORY).glob("*/overrides.yaml"))
    assert len(records) == 2 and "trainer.max_epochs=3" in records[-1].read_text()
    assert _last(run)["epoch"] == 2  # 3 epochs: the second resume replayed the first's record, then its own


def test_a_resumed_cosine_schedule_follows_the_new_number_of_epochs(tmp_path: Path) -> None:
    """1 epoch, resumed to 2: the rate at epoch 1 is what a 2-epoch plan has there (half of 1e-3), not
    the 1-epoch plan's minimum followed by a rise."""
    short = [*RUN, "logger=csv", "test=false", "callbacks.lr_monitor.logging_interval=epoch"]
    train(compose_config("train", tmp_path, [*short, "trainer.max_epochs=1"]))
    train(compose_config("train", tmp_path, [*short, "trainer.max_epochs=2", f"resume={tmp_path}"]))
    rates = [row.split(",")[1] for row in (tmp_path / "csv" / "metrics.csv").read_text().splitlines()[1:]]
    assert [float(rate) for rate in rates if rate] == [5e-4]  # the resumed epoch's (the CSV restarts on resume)
    scheduler = _last(tmp_path)["lr_schedulers"][0]
    assert (scheduler["T_max"], scheduler["last_epoch"]) == (2, 2)
    assert _last(tmp_path)["optimizer_states"][0]["param_groups"][0]["lr"] == pytest.approx(0.0, abs=1e-12)
