"""Every run owns its folder: runs and sweeps started together get folders of their own, a run deletes
only what it made, continues only its own last.ckpt, and tests only checkpoints it wrote."""

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml

from mnistlab.runtime.checkpointing.checkpoint_io import AtomicCheckpointIO
from mnistlab.runtime.run import run_folder
from mnistlab.runtime.run.failures import InputError
from mnistlab.tasks import train

import processes
from composing import SUITE, compose_config
from running import run_script

ONE_SHORT_EPOCH = ["trainer.max_epochs=1", "trainer.limit_train_batches=4", "trainer.limit_val_batches=2"]
ONE_SHORT_EPOCH += ["trainer.limit_test_batches=2", "trainer.log_every_n_steps=1", "trainer.accelerator=cpu"]
FROZEN = "2026-01-01_00-00-00"
# Started by Python before anything else (site.py imports sitecustomize from the path): every run of
# this process sees the same second, so two runs started together always collide on the name.
FROZEN_CLOCK = f"""
import time
_strftime = time.strftime
time.strftime = lambda format, *t: {FROZEN!r} if format == "%Y-%m-%d_%H-%M-%S" else _strftime(format, *t)
"""


def test_two_claims_of_the_same_second_get_two_folders(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(time, "strftime", lambda *_: FROZEN)
    first, second = (Path(run_folder.claim(str(tmp_path))) for _ in range(2))
    assert (first.name, second.name) == (FROZEN, f"{FROZEN}_2")
    (first / "train.log").write_text("a refused run")
    run_folder.discard_if_unused(first)
    assert not first.exists()
    live = tmp_path / "live"  # a folder this process did not make: never deleted
    live.mkdir()
    (live / "train.log").write_text("a live run")
    run_folder.discard_if_unused(live)
    assert (live / "train.log").is_file()


TASK = [o for o in SUITE if not o.startswith("hydra.")]  # as the log lists a run's overrides (Hydra's apart)


def _start(script: str, *overrides: str, clock: Path) -> subprocess.Popen:
    return processes.start(processes.python(script, *overrides), env=os.environ | {"PYTHONPATH": str(clock)})


def _wait(process: subprocess.Popen) -> str:
    output = processes.finish(process)
    assert process.returncode == 0, output[-3000:]
    return output


@pytest.fixture
def frozen_clock(tmp_path: Path) -> Path:
    (tmp_path / "clock").mkdir()
    (tmp_path / "clock" / "sitecustomize.py").write_text(FROZEN_CLOCK)
    return tmp_path / "clock"


@pytest.mark.slow
def test_two_runs_started_together_each_own_a_folder(frozen_clock: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    runs = [
        _start("train.py", *ONE_SHORT_EPOCH, f"seed={seed}", f"paths.log_dir={out}", clock=frozen_clock)
        for seed in (1, 2)
    ]
    for process in runs:
        _wait(process)
    folders = sorted((out / "train" / "runs").iterdir())
    assert [f.name for f in folders] == [FROZEN, f"{FROZEN}_2"]
    seeds = set()
    for folder in folders:
        (seed,) = [o for o in yaml.safe_load((folder / ".hydra" / "overrides.yaml").read_text()) if "seed=" in o]
        seeds.add(seed)
        assert yaml.safe_load((folder / ".hydra" / "config.yaml").read_text())["seed"] == int(seed.split("=")[1])
        assert f"Overrides: {' '.join([*TASK, *ONE_SHORT_EPOCH])} {seed}" in (folder / "train.log").read_text()
        ckpt = torch.load(run_folder.last_checkpoint(folder), weights_only=True)
        assert ckpt["config"]["seed"] == int(seed.split("=")[1])  # its own run's checkpoint
        events = list((folder / "tensorboard").glob("events.out.tfevents.*"))  # .<time>.<host>.<pid>.<n>
        assert events and len({p.name.split(".")[-2] for p in events}) == 1  # written by one process
        assert not list(folder.rglob("*.partial"))
    assert seeds == {"seed=1", "seed=2"}


@pytest.mark.slow
def test_two_sweeps_started_together_each_own_a_folder(frozen_clock: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    sweeps = [
        _start(
            "train.py",
            "-m",
            *ONE_SHORT_EPOCH,
            "logger=none",
            f"model.optimizer.lr={lrs}",
            f"paths.log_dir={out}",
            clock=frozen_clock,
        )
        for lrs in ("1e-3,2e-3", "3e-3,4e-3")
    ]
    for process in sweeps:
        _wait(process)
    folders = sorted((out / "train" / "multiruns").iterdir())
    assert [f.name for f in folders] == [FROZEN, f"{FROZEN}_2"]
    rates = []
    for folder in folders:
        summary = (folder / "summary.csv").read_text().splitlines()
        assert len(summary) == 3 and all(",ok," in row for row in summary[1:])
        rates.append(sorted(row.split(",")[1] for row in summary[1:]))
    assert sorted(rates) == [["0.001", "0.002"], ["0.003", "0.004"]]  # each table holds its own sweep's jobs


@pytest.mark.slow
def test_a_refused_run_deletes_nothing_of_a_live_runs_folder(tmp_path: Path) -> None:
    live = tmp_path / "live"
    result = run_script("train.py", *ONE_SHORT_EPOCH, f"hydra.run.dir={live}")
    assert result.returncode == 0, result.stderr[-2000:]
    before = sorted(p.relative_to(live) for p in live.rglob("*"))
    refused = run_script("train.py", f"hydra.run.dir={live}", f"ckpt_path={tmp_path / 'missing.ckpt'}")
    assert (
        refused.returncode == 1
        and refused.stderr.strip() == f"Error: ckpt_path={tmp_path / 'missing.ckpt'}: no such file"
    )
    assert sorted(p.relative_to(live) for p in live.rglob("*")) == before


def test_a_run_does_not_continue_a_last_checkpoint_it_did_not_write(tmp_path: Path) -> None:
    train(compose_config("train", tmp_path, [*ONE_SHORT_EPOCH, "logger=none", "test=false"]))
    last = run_folder.last_checkpoint(tmp_path)
    written = last.read_bytes()
    with pytest.raises(InputError, match=f"already holds a run's checkpoints/last.ckpt .* resume={tmp_path}"):
        train(compose_config("train", tmp_path, [*ONE_SHORT_EPOCH, "logger=none", "test=false"]))
    assert last.read_bytes() == written


@pytest.mark.slow
def test_a_run_tests_only_a_best_checkpoint_it_wrote(tmp_path: Path, caplog) -> None:
    train(compose_config("train", tmp_path / "a", [*ONE_SHORT_EPOCH, "logger=none"]))
    (best,) = run_folder.checkpoints(tmp_path / "a").glob("epoch*.ckpt")
    # Nothing left to train (1 epoch, done): ModelCheckpoint's restored state still names run a's best file.
    metrics = train(compose_config("train", tmp_path / "b", [*ONE_SHORT_EPOCH, "logger=none", f"ckpt_path={best}"]))
    assert f"This run wrote no best checkpoint of its own (the best is still {best}): testing its last weights" in (
        caplog.text
    )
    assert "test/acc" in metrics and not list(run_folder.checkpoints(tmp_path / "b").glob("epoch*.ckpt"))


def test_writers_of_one_checkpoint_never_share_a_partial_file(tmp_path: Path) -> None:
    path = tmp_path / "last.ckpt"
    errors = []

    def write(n: int) -> None:
        try:
            for step in range(20):
                AtomicCheckpointIO().save_checkpoint({"writer": n, "step": step, "w": torch.zeros(100_000)}, path)
        except (OSError, RuntimeError) as err:  # the old shared .last.ckpt.partial: one writer renamed the other's away
            errors.append(err)

    writers = [threading.Thread(target=write, args=(n,)) for n in range(2)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    assert not errors
    assert torch.load(path, weights_only=True)["step"] == 19
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]
