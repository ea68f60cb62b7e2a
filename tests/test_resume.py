"""``resume=<run folder>``: a stopped or killed run goes on in its folder and ends as if never stopped."""

import json
import os
import random
import re
import signal
import sys
from pathlib import Path

import pytest
import torch

from mnistlab.runtime.checkpointing import resume
from mnistlab.runtime.run import folder_lock, run_folder
from mnistlab.runtime.run.failures import InputError
from mnistlab.runtime.run.launch import RUN_ID
from mnistlab.runtime.run.run_folder import RESUMES, SWEEP_FILE
from mnistlab.tasks import train

import processes
from composing import DETERMINISTIC, EVERY_7_STEPS, SUITE, SUITE_DATA, compose_config
from running import (
    assert_same_training,
    assert_same_weights,
    assert_trained_as_one_process,
    one_process_reference,
    one_run,
    run_script,
    train_like_one_process,
)
from running import last_checkpoint as _last

# model.net.hidden: an override the resumed run must take from the run's folder (the checkpoint
# would not load into the default width).
RUN = [*DETERMINISTIC, "model.net.hidden=64"]


def _one_run(log_dir: Path) -> Path:
    (run,) = (log_dir / "train" / "runs").iterdir()
    return run


@pytest.mark.slow
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
    launch = (run / ".hydra" / "overrides.yaml").read_text()
    assert (_last(run)["epoch"], _last(run)["global_step"]) == (1, 60)
    (stopping,) = [state for name, state in _last(run)["callbacks"].items() if name.startswith("EarlyStopping")]
    assert stopping["patience"] == 5 and stopping["wait_count"] in (0, 1)  # the patience travels in last.ckpt

    # A new learning rate does not change a resumed run: the optimizer comes back as it was.
    on_top = ["trainer.num_sanity_val_steps=0", "model.optimizer.lr=0.5"]
    result = run_script("train.py", f"resume={run}", *on_top, f"paths.log_dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert _one_run(tmp_path) == run  # the same folder, no second run
    log = (run / "train.log").read_text()
    assert f"Resuming the run in {run}; its overrides: " in log and "model.net.hidden=64" in log
    task = [o for o in SUITE if not o.startswith("hydra.")]  # given again (the search path is Hydra's: not replayed)
    given = " ".join([*task, "trainer.accelerator=cpu", *on_top])
    assert f"Overrides given now, on top: {given}" in log
    assert f"Restored all states from the checkpoint at {run / 'checkpoints' / 'last.ckpt'}" in log
    assert_same_weights(_last(tmp_path / "whole"), _last(run))
    tested = torch.load(next(run_folder.checkpoints(run).glob("epoch*.ckpt")), weights_only=True)
    assert (
        tested["epoch"]
        == torch.load(next(run_folder.checkpoints(tmp_path / "whole").glob("epoch*.ckpt")), weights_only=True)["epoch"]
    )
    metrics = (run / "metrics.json").read_text()
    assert f'"test/acc": {whole["test/acc"]}' in metrics
    # TensorBoard: one run, its events continued in the same folder (no version_N beside it).
    assert {p.parent for p in run.rglob("events.out.tfevents.*")} == {run / "tensorboard"}

    # Each resume is recorded beside the launch: a second one replays the first's record, then its own.
    again = run_script("train.py", f"resume={run}", "trainer.max_epochs=4", f"paths.log_dir={tmp_path}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert (run / ".hydra" / "overrides.yaml").read_text() == launch  # the launch's record stays
    records = sorted((run / RESUMES).glob("*/overrides.yaml"))
    assert len(records) == 2 and "model.optimizer.lr=0.5" in records[0].read_text()
    assert "model.optimizer.lr=0.5" in records[1].read_text() and "trainer.max_epochs=4" in records[1].read_text()
    assert _last(run)["epoch"] == 3  # a fourth epoch


def test_overrides_given_when_resuming_replace_the_runs_own(tmp_path: Path) -> None:
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text("- model.net.hidden=64\n- trainer.max_epochs=3\n")
    run_folder.checkpoints(tmp_path).mkdir()
    torch.save({"state_dict": {}}, run_folder.last_checkpoint(tmp_path))
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


def _a_file(path: Path) -> Path:
    path.write_bytes(b"PK")
    return path


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda p: p / "nope", "no such folder"),
        (
            lambda p: _a_file(p / "last.ckpt"),
            "last.ckpt is a file, not a run folder: name the folder that holds the run's .hydra/; to start from "
            + "a checkpoint file, give ckpt_path=",
        ),
        (lambda p: p, "is not a run folder (no .hydra/overrides.yaml in it)"),
        (
            lambda p: (p / ".hydra").mkdir() or (p / ".hydra" / "overrides.yaml").write_text("[]") and p,
            "no checkpoints",
        ),
        (
            lambda p: (
                (p / "multirun.yaml").write_text("hydra: {sweeper: {_target_: hydra_plugins.x.OptunaSweeper}}") and p
            ),
            "is an Optuna study: run its command again and the study goes on from its storage",
        ),
    ],
)
def test_resume_refuses_what_is_not_a_resumable_run(make, message: str, tmp_path: Path) -> None:
    with pytest.raises(InputError, match=re.escape(message)):
        resume.expand(["train.py", f"resume={make(tmp_path)}"])


@pytest.mark.slow
def test_resume_refusal_is_one_line(tmp_path: Path) -> None:
    result = run_script("train.py", f"resume={tmp_path}", timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip() == f"Error: resume={tmp_path} is not a run folder (no .hydra/overrides.yaml in it)"


@pytest.mark.slow
def test_killed_at_random_steps_the_resumed_run_ends_as_if_never_killed(tmp_path: Path) -> None:
    """SIGKILL three times at steps drawn at random: first inside the checkpoint writer, halfway through a
    checkpoint, then twice as a batch starts; each time resumed with resume=. last.ckpt every 5 steps.
    A failure prints its seed: KILL_SEED=<seed> pytest ... draws the same steps again."""
    seed = int(os.environ.get("KILL_SEED", random.randrange(2**32)))
    print(f"KILL_SEED={seed}")
    rng = random.Random(seed)
    writing = rng.randrange(10, 145, 5)  # a last.ckpt of its own: not an epoch's end (150), where more are saved
    kills = [writing, rng.randrange(writing + 1, 300), rng.randrange(300, 440)]
    steps = [*RUN, "trainer.limit_train_batches=150", "callbacks.last_checkpoint.every_n_train_steps=5"]
    steps.append(f"data.train_size={150 * SUITE_DATA['batch_size']}")  # 150 batches an epoch
    steps.append("callbacks.last_checkpoint.every_n_epochs=null")
    train(compose_config("train", tmp_path / "whole", steps))
    out = f"paths.log_dir={tmp_path / 'killed'}"
    run = None
    for number, step in enumerate(kills):
        kill = ["+callbacks.kill._target_=faults.KillAt", f"+callbacks.kill.step={step}"]
        kill.append(f"+callbacks.kill.writing={number == 0}")
        killed = run_script("train.py", *(steps if run is None else [f"resume={run}"]), *kill, out)
        assert killed.returncode == -signal.SIGKILL, f"not killed at step {step} (KILL_SEED={seed}): {killed.stderr}"
        run = _one_run(tmp_path / "killed")
        saved = step - 5 if number == 0 else step - step % 5  # whole, as written before the kill
        assert _last(run)["global_step"] == saved, f"KILL_SEED={seed}"
    assert list(run_folder.checkpoints(run).glob(".last.ckpt.*.partial")), "the write that was killed left its part"
    final = run_script("train.py", f"resume={run}", out)
    assert final.returncode == 0, final.stderr[-3000:]
    assert _last(run)["global_step"] == 3 * 150
    assert_same_training(_last(tmp_path / "whole"), _last(run))


def test_resume_from_a_broken_last_checkpoint_names_the_whole_ones_and_touches_nothing(tmp_path: Path) -> None:
    run = tmp_path / "run"
    train(compose_config("train", run, [*RUN, "trainer.max_epochs=1", "logger=none", "test=false"]))
    (run / ".hydra").mkdir()
    (run / ".hydra" / "overrides.yaml").write_text("- model.net.hidden=64\n")
    last = run_folder.last_checkpoint(run)
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])  # cut short: a disk that filled, a copy stopped
    (run / "metrics.json").unlink()  # and the run ended there, unfinished
    (best,) = run_folder.checkpoints(run).glob("epoch*.ckpt")
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


def test_a_resumed_cosine_schedule_follows_the_new_number_of_epochs(tmp_path: Path) -> None:
    """1 epoch, resumed to 2: the rate at epoch 1 is what a 2-epoch plan has there (half the initial rate),
    not the 1-epoch plan's minimum followed by a rise (runtime/training/schedule_horizon.py)."""
    short = [
        *RUN,
        "logger=csv",
        "test=false",
        "callbacks.lr_monitor.logging_interval=epoch",
        "model/scheduler=suite_cosine",
    ]
    cfg = compose_config("train", tmp_path, [*short, "trainer.max_epochs=1"])
    train(cfg)
    train(compose_config("train", tmp_path, [*short, "trainer.max_epochs=2", f"resume={tmp_path}"]))
    rates = [row.split(",")[1] for row in (tmp_path / "csv" / "metrics.csv").read_text().splitlines()[1:]]
    resumed = [float(rate) for rate in rates if rate]  # the resumed epoch's (the CSV restarts on resume)
    assert resumed == [pytest.approx(cfg.model.optimizer.lr / 2)]
    scheduler = _last(tmp_path)["lr_schedulers"][0]
    assert (scheduler["T_max"], scheduler["last_epoch"]) == (2, 2)
    assert _last(tmp_path)["optimizer_states"][0]["param_groups"][0]["lr"] == pytest.approx(0.0, abs=1e-12)


@pytest.mark.slow
def test_a_ddp_run_resumes_on_another_number_of_processes(one_process, tmp_path: Path) -> None:
    """The first epoch on 2 processes, the second on 1 (ckpt_path=): the single-process run's weights and
    optimizer state, as if never stopped. (On the same 2: tests/test_stopping.py's signal to rank 1 resumes
    its run so, and the torchrun and streaming tests theirs.)"""
    first = train_like_one_process(tmp_path / "two", "trainer.max_epochs=1", "strategy=ddp", "trainer.devices=2")
    assert _last(first)["global_step"] == 20
    run = one_process_reference(tmp_path / "one", f"ckpt_path={run_folder.last_checkpoint(first)}")  # in this one
    assert_trained_as_one_process(run, one_process)


@pytest.mark.slow
def test_torchrun_restarts_a_killed_worker_from_the_runs_last_checkpoint(tmp_path: Path) -> None:
    longer = [
        *["strategy=ddp", "trainer.devices=2", "trainer.accelerator=cpu", "trainer.max_epochs=2"],
        *["trainer.limit_train_batches=200", "trainer.limit_val_batches=5", "trainer.limit_test_batches=5"],
        f"data.train_size={200 * SUITE_DATA['batch_size']}",  # 200 batches an epoch
        *["callbacks.last_checkpoint.every_n_train_steps=20", "callbacks.last_checkpoint.every_n_epochs=null"],
    ]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--max-restarts=1", "--nproc_per_node=2"]
    console = (tmp_path / "console.txt").open("w")  # not a pipe: nobody reads it while the test waits
    agent = processes.start([*torchrun, "train.py", *SUITE, *longer, f"paths.log_dir={tmp_path}"], output=console)
    processes.until(
        lambda: list(tmp_path.glob(f"train/runs/*/{run_folder.CHECKPOINTS}/last.ckpt")), 120, "last.ckpt", 0.05
    )
    workers = Path(f"/proc/{agent.pid}/task/{agent.pid}/children").read_text().split()
    assert len(workers) == 2, workers
    os.kill(int(workers[1]), signal.SIGKILL)  # one worker dies mid-training
    processes.finish(agent)
    assert agent.returncode == 0, (tmp_path / "console.txt").read_text()[-3000:]
    run = one_run(tmp_path)
    log = (run / "train.log").read_text()
    assert f"Resuming from {run / 'checkpoints' / 'last.ckpt'}, this run folder's last checkpoint" in log
    assert torch.load(run_folder.last_checkpoint(run), weights_only=True)["global_step"] == 400
    assert json.loads((run / "metrics.json").read_text())["test/samples"] == 5 * SUITE_DATA["batch_size"]


@pytest.mark.parametrize("checkpoints", ["checkpoints", "weights"])
def test_a_run_folder_with_a_last_checkpoint_resumes_from_it(
    checkpoints: str, tmp_path: Path, caplog, monkeypatch
) -> None:
    """As a requeued SLURM job or a restarted torchrun job does: same folder, same command, same launch. And
    with the checkpoints' folder named otherwise in its one place (run_folder.CHECKPOINTS), conf/ too."""
    monkeypatch.setattr(run_folder, "CHECKPOINTS", checkpoints)
    monkeypatch.setenv(RUN_ID, "slurm-1234")  # what a requeued job's ranks are given again (launch.py)
    overrides = ["trainer.limit_train_batches=10", "trainer.limit_val_batches=2", "test=false", "logger=none"]
    first = train(compose_config("train", tmp_path, [*overrides, "trainer.max_epochs=1"]))
    assert "Restored all states" not in caplog.text
    last_checkpoint = tmp_path / checkpoints / "last.ckpt"
    assert [path.name for path in tmp_path.iterdir() if path.is_dir()] == [checkpoints]
    saved = torch.load(last_checkpoint, weights_only=True)["callbacks"]
    (best,) = [state["best"] for name, state in saved.items() if name.startswith("BestMetric")]
    assert best == pytest.approx(
        first["val/acc_best"]
    )  # the best so far travels along (runtime/training/best_metric.py)
    second = train(compose_config("train", tmp_path, [*overrides, "trainer.max_epochs=2"]))
    assert f"Restored all states from the checkpoint at {last_checkpoint}" in caplog.text
    last = torch.load(last_checkpoint, weights_only=True)
    assert (last["epoch"], last["global_step"]) == (1, 20)
    assert second["val/acc_best"] == max(first["val/acc_best"], second["val/acc"])  # over both runs' epochs


def test_resuming_mid_epoch_continues_with_the_same_batches(tmp_path: Path) -> None:
    """Stop after 14 of an epoch's 20 steps, resume: the weights end exactly as without the stop."""
    short = [
        "trainer.max_epochs=1",
        "trainer.limit_train_batches=20",
        "trainer.limit_val_batches=2",
        "test=false",
        "logger=none",
    ]
    train(compose_config("train", tmp_path / "whole", short))
    train(compose_config("train", tmp_path / "stopped", [*short, *EVERY_7_STEPS]))
    mid_epoch = run_folder.checkpoints(tmp_path / "stopped") / "step14.ckpt"
    assert torch.load(mid_epoch, weights_only=True)["global_step"] == 14
    train(compose_config("train", tmp_path / "resumed", [*short, f"ckpt_path={mid_epoch}"]))
    whole, resumed = (
        torch.load(run_folder.last_checkpoint(tmp_path / run), weights_only=True) for run in ("whole", "resumed")
    )
    assert resumed["global_step"] == 20
    for name, value in whole["state_dict"].items():
        torch.testing.assert_close(resumed["state_dict"][name], value, rtol=0, atol=0)


def _contents(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _finished_run(folder: Path, *overrides: str) -> tuple[dict[str, float], Path]:
    """A run trained to its end in ``folder``, with the records train.py keeps (.hydra/)."""
    from omegaconf import OmegaConf

    cfg = compose_config("train", folder, [*RUN, "trainer.max_epochs=1", "logger=none", *overrides])
    metrics = train(cfg)
    (folder / ".hydra").mkdir()
    (folder / ".hydra" / "overrides.yaml").write_text("- model.net.hidden=64\n")
    OmegaConf.save(cfg, folder / ".hydra" / "config.yaml")
    return metrics, folder


def test_a_finished_run_given_to_resume_is_refused_in_one_line_and_changes_nothing(tmp_path: Path) -> None:
    metrics, run = _finished_run(tmp_path / "run")
    before = _contents(run)
    for again in ([], ["trainer.max_epochs=1"], ["trainer.max_epochs=abc"], ["trainer.limit_train_batches=5"]):
        with pytest.raises(InputError) as refused:
            resume.expand(["train.py", f"resume={run}", *again])
        assert str(refused.value) == (
            f"resume={run}: that run finished (its results are in metrics.json), so there is nothing to continue "
            "and nothing was changed; to train it longer, give it more epochs (more than its 1: trainer.max_epochs=2)"
        )
    assert _contents(run) == before
    # More epochs than it had: it continues, and its metrics.json keeps every metric, the best over both epochs.
    assert "trainer.max_epochs=2" in resume.expand(["train.py", f"resume={run}", "trainer.max_epochs=2"])
    longer = train(compose_config("train", run, [*RUN, "trainer.max_epochs=2", "logger=none", f"resume={run}"]))
    assert metrics.keys() <= longer.keys()
    assert longer["val/acc_best"] >= metrics["val/acc_best"]
    assert json.loads((run / "metrics.json").read_text()) == pytest.approx(longer)
    assert _last(run)["epoch"] == 1


def test_resuming_with_fewer_epochs_than_trained_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """Lightning would refuse it while restoring, after the loggers and the resume's record had written."""
    _, run = _finished_run(tmp_path / "run", "trainer.max_epochs=2", "logger=tensorboard")
    (run / "metrics.json").unlink()  # stopped after its second epoch
    before = _contents(run)
    for fewer, named in ((f"resume={run}", f"resume={run}"), (f"ckpt_path={_last_path(run)}", "ckpt_path=")):
        with pytest.raises(InputError) as refused:
            train(compose_config("train", run, [*RUN, "trainer.max_epochs=1", fewer]))
        assert str(refused.value).startswith(named)
        assert str(refused.value).endswith(
            "has trained 2 epochs, more than trainer.max_epochs=1: nothing was changed; give trainer.max_epochs=3 or "
            "more to train it further"
        )
    assert {k: v for k, v in _contents(run).items() if k != folder_lock.LOCK_FILE} == {
        k: v for k, v in before.items() if k != folder_lock.LOCK_FILE
    }


def test_a_resume_record_left_by_a_refused_resume_of_an_older_version_is_told_how_to_go_on(tmp_path: Path) -> None:
    """Older versions recorded a resume with fewer epochs before Lightning refused it; its record is replayed."""
    _, run = _finished_run(tmp_path / "run", "trainer.max_epochs=2")
    (run / "metrics.json").unlink()
    record = run / RESUMES / "2026-01-01_00-00-00"
    record.mkdir(parents=True)
    (record / "overrides.yaml").write_text("- model.net.hidden=64\n- trainer.max_epochs=1\n")
    replayed = resume.expand(["train.py", f"resume={run}"])
    assert "trainer.max_epochs=1" in replayed
    with pytest.raises(
        InputError, match="more than trainer.max_epochs=1: nothing was changed; give trainer.max_epochs=3"
    ):
        train(compose_config("train", run, [*RUN, "logger=none", "trainer.max_epochs=1", f"resume={run}"]))
    again = resume.expand(["train.py", f"resume={run}", "trainer.max_epochs=3"])  # as the line says
    assert again[-4:-2] == [f"resume='{run}'", "trainer.max_epochs=3"]
    metrics = train(compose_config("train", run, [*RUN, "logger=none", "trainer.max_epochs=3", f"resume={run}"]))
    assert _last(run)["epoch"] == 2 and metrics["val/acc_best"] > 0


def _last_path(run: Path) -> Path:
    return run_folder.last_checkpoint(run)


def test_a_run_continued_after_its_training_ended_reports_every_metric(tmp_path: Path) -> None:
    """Killed after training, before its metrics.json: continued, it trains nothing more, tests, and reports
    the training's metrics too (kept in its checkpoint), not the test's alone."""
    metrics, run = _finished_run(tmp_path / "run")
    (run / "metrics.json").unlink()
    again = train(compose_config("train", run, [*RUN, "trainer.max_epochs=1", "logger=none", f"resume={run}"]))
    assert again == pytest.approx(metrics)
    assert json.loads((run / "metrics.json").read_text()) == pytest.approx(metrics)


@pytest.mark.parametrize(
    "damage",
    [b"5\n", b"", b"a: [\n", b"- [1]\n", bytes(range(256))],
    ids=["a number", "empty", "invalid YAML", "not strings", "binary"],
)
def test_a_damaged_overrides_record_is_refused_in_one_line_and_changes_nothing(damage: bytes, tmp_path: Path) -> None:
    _, run = _finished_run(tmp_path / "run")
    (run / "metrics.json").unlink()  # unfinished: its record is what a resume reads
    (run / ".hydra" / "overrides.yaml").write_bytes(damage)
    before = _contents(run)
    with pytest.raises(InputError) as refused:
        resume.expand(["train.py", f"resume={run}"])
    assert str(refused.value).startswith(
        f"resume={run}: {run / '.hydra' / 'overrides.yaml'} is damaged; it should hold the overrides the run was "
        "started with, a YAML list of key=value strings"
    )
    assert _contents(run) == before


SWEEP_RECORD = """\
hydra:
  sweeper:
    _target_: hydra._internal.core_plugins.basic_sweeper.BasicSweeper
  overrides:
    hydra:
    - hydra.mode=MULTIRUN
    task:
    - model.optimizer.lr=1e-2,1e-3
    - trainer.max_epochs=1
  job:
    name: train
  runtime:
    version: 1.3.2
task_name: train
"""


def _sweep(folder: Path, record: bytes) -> Path:
    """A sweep folder as Hydra leaves it (its record), with a finished job."""
    (folder / "0" / ".hydra").mkdir(parents=True)
    (folder / "0" / ".hydra" / "overrides.yaml").write_text("- model.optimizer.lr=1e-2\n- trainer.max_epochs=1\n")
    (folder / "0" / "metrics.json").write_text('{"val/acc_best": 0.5}')
    (folder / SWEEP_FILE).write_bytes(record)
    return folder


@pytest.mark.parametrize(
    "damage",
    [
        b"",
        b"[1, 2]\n",
        b"hydra: {overrides: {task: model.optimizer.lr=1e-2}}\n",
        b"hydra: [\n",
        SWEEP_RECORD[: SWEEP_RECORD.index("  job:")].encode(),  # cut short: valid YAML, the sweep's end missing
        bytes(range(256)),
    ],
    ids=["empty", "a list", "task a string", "invalid YAML", "cut short", "binary"],
)
def test_a_damaged_sweep_record_is_refused_in_one_line_and_changes_nothing(damage: bytes, tmp_path: Path) -> None:
    sweep = _sweep(tmp_path, damage)
    before = _contents(sweep)
    with pytest.raises(InputError) as refused:
        resume.expand(["train.py", f"resume={sweep}"])
    assert str(refused.value).startswith(f"resume={sweep}: its multirun.yaml is damaged; it should hold the sweep's")
    assert _contents(sweep) == before


@pytest.mark.parametrize(
    "typo,message",
    [
        ("trainer.max_epochs=abc", "trainer.max_epochs=abc: should be an integer or null (lightning.pytorch.Trainer)"),
        ("model.optimizer.lr=-1", "model.optimizer.lr=-1"),
        ("data.batch_sise=8", "Could not override 'data.batch_sise'."),
    ],
)
def test_a_sweep_resumed_with_a_bad_override_is_refused_before_anything_is_written(
    typo: str, message: str, tmp_path: Path
) -> None:
    sweep = _sweep(tmp_path, SWEEP_RECORD.encode())
    before = _contents(sweep)
    with pytest.raises(InputError, match=re.escape(message)):
        resume.expand(["train.py", f"resume={sweep}", *SUITE, typo])
    assert _contents(sweep) == before  # its record, and the finished job's folder
    assert resume.expand(["train.py", f"resume={sweep}", *SUITE])  # without the typo: the record and task are sound
    folder_lock.release(sweep)


def test_a_sweep_resumed_with_its_launchers_settings_is_checked_without_them(tmp_path: Path) -> None:
    """hydra.launcher.* given again (no hydra.* value is replayed) shape how jobs run, not a job: not refused."""
    sweep = _sweep(tmp_path, SWEEP_RECORD.replace("- hydra.mode=MULTIRUN", "- hydra/launcher=slurm").encode())
    given = ["hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=1"]
    expanded = resume.expand(["train.py", f"resume={sweep}", *SUITE, *given])
    assert "hydra/launcher=slurm" in expanded and all(arg in expanded for arg in given)
    folder_lock.release(sweep)
