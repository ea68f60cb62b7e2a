"""Runs that are signalled or diverge stop between two steps, keep what is good and say what to do."""

import re
import signal
from pathlib import Path

import pytest
import torch

from mnistlab.runtime.run import run_folder
from mnistlab.runtime.run.failures import RunStopped
from mnistlab.tasks import train

import processes
from composing import DETERMINISTIC, EQUIVALENCE, compose_config
from running import assert_same_training, assert_trained_as_one_process, one_run, run_script
from running import last_checkpoint as _last

# last.ckpt every 10 steps; the loss checked every 25.
RUN = [
    *DETERMINISTIC,
    "trainer.log_every_n_steps=25",
    "callbacks.last_checkpoint.every_n_train_steps=10",
    "callbacks.last_checkpoint.every_n_epochs=null",
    "logger=csv",
]


@pytest.fixture(scope="session")  # computed once a worker: see test_ray.cluster
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, float]]:
    out = tmp_path_factory.mktemp("uninterrupted")
    return out, train(compose_config("train", out, RUN))


# (signal, the step it arrives at): mid-epoch, at the last step of epoch 0 (30 steps each: the stop waits for the
# epoch's end, its validation and checkpoints), at the first of epoch 1.
@pytest.mark.slow
@pytest.mark.parametrize("name,step", [("SIGTERM", 42), ("SIGUSR1", 29), ("SIGTERM", 30)])
def test_a_signal_saves_at_the_next_step_and_the_resumed_run_ends_the_same(name, step, uninterrupted, tmp_path) -> None:
    signalled = [*RUN, "+callbacks.signal._target_=faults.SignalAt", f"+callbacks.signal.step={step}"]
    signalled.append(f"+callbacks.signal.signal={name}")
    with pytest.raises(RunStopped) as stop:
        train(compose_config("train", tmp_path, signalled))
    assert stop.value.exit_code == 128 + signal.Signals[name].value
    saved = f"saved {tmp_path / 'checkpoints' / 'last.ckpt'}"
    assert f"Stopped by {name} at step {step + 1} (epoch {step // 30}); {saved}" in str(stop.value)
    assert f"Continue with: python train.py resume={tmp_path}" in str(stop.value)
    assert _last(tmp_path)["global_step"] == step + 1  # the step the signal arrived in, not the last epoch end
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL  # handlers restored

    resumed = train(compose_config("train", tmp_path, [*RUN, f"resume={tmp_path}"]))  # what resume= composes
    whole, metrics = uninterrupted
    assert_same_training(_last(whole), _last(tmp_path))
    assert resumed["test/acc"] == metrics["test/acc"]
    assert resumed["test/loss"] == pytest.approx(metrics["test/loss"], rel=1e-6)


def test_a_diverging_run_stops_soon_and_writes_no_checkpoint_of_broken_weights(tmp_path: Path) -> None:
    poisoned = [*RUN, "+callbacks.poison._target_=faults.PoisonAt", "+callbacks.poison.step=32"]
    with pytest.raises(RunStopped, match=r"non-finite \(NaN or inf\) between steps 30 and 40") as stop:
        train(compose_config("train", tmp_path, poisoned))
    assert stop.value.exit_code == 1
    assert "lower model.optimizer.lr, or clip gradients (trainer.gradient_clip_val=1.0)" in str(stop.value)
    last = _last(tmp_path)
    assert last["global_step"] == 30  # step 40's checkpoint would have held NaN: not written
    assert all(value.isfinite().all() for name, value in last["state_dict"].items() if name.startswith("net."))
    (best,) = [p for p in run_folder.checkpoints(tmp_path).glob("epoch*.ckpt")]
    assert best.name.startswith("epoch000")  # epoch 1's validation never ran on the broken weights


@pytest.mark.slow
def test_a_nan_learning_rate_run_exits_non_zero_with_one_line(tmp_path: Path) -> None:
    result = run_script("train.py", "model.optimizer.lr=1e30", "trainer.max_epochs=1", f"paths.log_dir={tmp_path}")
    assert result.returncode == 1
    assert re.search(r"The training loss became non-finite \(NaN or inf\) between steps 0 and \d+, ", result.stdout)
    assert "Traceback" not in result.stdout + result.stderr
    (run,) = (tmp_path / "train" / "runs").iterdir()
    assert not list(run.rglob("*.ckpt"))


@pytest.mark.slow
def test_a_signal_before_training_stops_the_run_at_its_first_step(tmp_path: Path) -> None:
    """SIGUSR1 during the sanity check would end the process (Python's default); it stops at step 1."""
    early = [*RUN, "+callbacks.signal._target_=faults.SignalAt", "+callbacks.signal.step=-1"]
    with pytest.raises(RunStopped, match=r"Stopped by SIGUSR1 at step 1 \(epoch 0\); saved"):
        train(compose_config("train", tmp_path, [*early, "+callbacks.signal.signal=SIGUSR1"]))
    assert _last(tmp_path)["global_step"] == 1
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL  # handlers as before the run


def _catches(pid: int, signum: int) -> bool:
    """The process has a handler for the signal (the caught-signals mask Linux shows in /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(mask >> (signum - 1) & 1)


def _signalled_while_importing(tmp_path: Path, *overrides: str) -> tuple[int, str]:
    """Run train.py, send it SIGUSR1 while it still imports torch; its exit status and output."""
    run = processes.start(
        processes.python("train.py", *RUN, "trainer.accelerator=cpu", f"paths.log_dir={tmp_path}", *overrides)
    )

    def listening() -> bool:  # train.py listens before it imports torch
        assert run.poll() is None
        return _catches(run.pid, signal.SIGUSR1)

    processes.until(listening, 30, "train.py listening for signals", every=0.01)
    assert "torch" not in Path(f"/proc/{run.pid}/maps").read_text()  # still before its import
    run.send_signal(signal.SIGUSR1)
    output = processes.finish(run, timeout=120)
    return run.returncode, output


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads the signal mask in /proc (Linux)")
def test_a_signal_while_the_process_still_imports_stops_the_run_at_its_first_step(tmp_path: Path) -> None:
    """SLURM's warning can come at any time: during the seconds it takes to import torch, too."""
    exit_code, output = _signalled_while_importing(tmp_path)
    assert exit_code == 128 + signal.SIGUSR1, output
    assert re.search(
        r"Stopped by SIGUSR1 at step 1 \(epoch 0\); saved .*Continue with: python train.py resume=", output
    )
    (folder,) = (tmp_path / "train" / "runs").iterdir()
    assert _last(folder)["global_step"] == 1


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads the signal mask in /proc (Linux)")
def test_without_safe_stop_a_signal_ends_the_process_as_it_would_anyway(tmp_path: Path) -> None:
    """Nothing would act on the noted signal: it gets its default action once the trainer is built."""
    exit_code, output = _signalled_while_importing(tmp_path, "callbacks.safe_stop=null")
    assert exit_code == -signal.SIGUSR1, output[-2000:]
    (folder,) = (tmp_path / "train" / "runs").iterdir()
    assert not list(folder.rglob("*.ckpt"))


@pytest.mark.slow
def test_ctrl_c_saves_at_the_next_step_and_twice_aborts_at_once(tmp_path: Path) -> None:
    interrupted = [*RUN, "+callbacks.signal._target_=faults.SignalAt", "+callbacks.signal.step=42"]
    once = run_script("train.py", *interrupted, "+callbacks.signal.signal=SIGINT", f"paths.log_dir={tmp_path / 'once'}")
    (run,) = (tmp_path / "once" / "train" / "runs").iterdir()
    assert once.returncode == 128 + signal.SIGINT, once.stderr[-2000:]
    assert f"Stopped by SIGINT at step 43 (epoch 1); saved {run / 'checkpoints' / 'last.ckpt'}" in once.stdout
    assert f"Continue with: python train.py resume={run}" in once.stdout
    assert _last(run)["global_step"] == 43 and "Traceback" not in once.stdout + once.stderr

    twice = [*interrupted, "+callbacks.signal.signal=SIGINT", "+callbacks.signal.times=2"]
    aborted = run_script("train.py", *twice, f"paths.log_dir={tmp_path / 'twice'}")
    (run,) = (tmp_path / "twice" / "train" / "runs").iterdir()
    assert aborted.returncode == 1 and "Detected KeyboardInterrupt" in aborted.stdout + aborted.stderr
    assert _last(run)["global_step"] == 40  # the last one written every 10 steps: nothing saved at step 43


DDP_RUN = [
    "strategy=ddp",
    "trainer.devices=2",
    "trainer.max_epochs=2",
    "trainer.limit_train_batches=40",
    "trainer.limit_val_batches=5",
    "trainer.limit_test_batches=5",
    "trainer.log_every_n_steps=10",
    "callbacks.last_checkpoint.every_n_train_steps=10",
    "callbacks.last_checkpoint.every_n_epochs=null",
]


@pytest.mark.slow
def test_ddp_ranks_stop_together_on_a_signal_to_rank_0(tmp_path: Path) -> None:
    """SIGUSR1 to rank 0 at step 5 of 2 ranks: both stop at the next check and save there. (That a DDP run
    stopped mid-epoch resumes to the uninterrupted run's weights: the signal to rank 1 below, whose stop is
    mid-epoch too.)"""
    signalled = [
        "+callbacks.signal._target_=faults.SignalAt",
        "+callbacks.signal.step=5",
        "+callbacks.signal.signal=SIGUSR1",
    ]
    ddp = ["strategy=ddp", "trainer.devices=2", "trainer.log_every_n_steps=10"]  # the ranks agree every 10 steps
    result = run_script("train.py", *EQUIVALENCE, *ddp, *signalled, f"paths.log_dir={tmp_path}")
    assert result.returncode == 128 + 10, result.stderr[-3000:]
    run = one_run(tmp_path)
    # The ranks agree at the next check (every trainer.log_every_n_steps=10 steps): step 10.
    assert result.stdout.count("Stopped by SIGUSR1 at step 10 (epoch 0)") == 1  # rank 0's console only
    assert "Stopped by SIGUSR1 at step 10" in (run / "train_ddp_process_1.log").read_text()  # the other rank, too
    assert _last(run)["global_step"] == 10


@pytest.mark.slow
def test_ddp_ranks_stop_together_when_one_diverges(tmp_path: Path) -> None:
    poisoned = ["+callbacks.poison._target_=faults.PoisonAt", "+callbacks.poison.step=12", "+callbacks.poison.rank=1"]
    result = run_script("train.py", *DDP_RUN, *poisoned, f"paths.log_dir={tmp_path}", timeout=180)
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stdout.count("The training loss became non-finite (NaN or inf) between steps 10 and 20") == 1
    run = one_run(tmp_path)
    assert "became non-finite" in (run / "train_ddp_process_1.log").read_text()
    assert torch.load(run_folder.last_checkpoint(run), weights_only=True)["global_step"] == 10


@pytest.mark.slow
def test_a_signal_that_reaches_one_rank_during_validation_stops_both_at_the_next_check(one_process, tmp_path) -> None:
    """SIGUSR1 to rank 1 alone as the validation after epoch 0 starts: Lightning's own handling would leave
    the ranks waiting on each other there. Both finish validating, stop at the next check (step 30), and
    the resumed run ends with the uninterrupted single-process run's weights and optimizer state."""
    signalled = ["+callbacks.signal._target_=faults.SignalAt", "+callbacks.signal.step=20"]
    signalled += ["+callbacks.signal.rank=1", "+callbacks.signal.validating=true", "+callbacks.signal.signal=SIGUSR1"]
    ddp = ["strategy=ddp", "trainer.devices=2", "trainer.log_every_n_steps=10"]  # the ranks agree every 10 steps
    result = run_script("train.py", *EQUIVALENCE, *ddp, *signalled, f"paths.log_dir={tmp_path}", timeout=180)
    assert result.returncode == 128 + signal.SIGUSR1, result.stderr[-3000:]
    run = one_run(tmp_path)
    assert result.stdout.count("Stopped by SIGUSR1 at step 30 (epoch 1)") == 1  # rank 0's console
    assert "Stopped by SIGUSR1 at step 30 (epoch 1)" in (run / "train_ddp_process_1.log").read_text()
    assert _last(run)["global_step"] == 30
    resumed = run_script("train.py", f"resume={run}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_trained_as_one_process(run, one_process)
