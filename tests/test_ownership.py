"""A start writes only into a folder of its own: refused in another run's or sweep's folder before anything
is written there, however it names that folder (runtime/checkpointing/ownership.py)."""

import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from mnistlab.runtime.checkpointing.ownership import OwnFolder
from mnistlab.runtime.run import run_folder
from mnistlab.runtime.run.failures import InputError
from mnistlab.runtime.run.launch import RUN_ID
from mnistlab.runtime.run.run_folder import LOCK_FILE

import processes
from composing import DETERMINISTIC
from running import run_script


def _contents(folder: Path) -> dict[str, bytes]:
    """Every file of ``folder`` and its bytes; the lock's file aside: it names the process that last held it."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()} | {
        LOCK_FILE: b""
    }


@pytest.mark.parametrize("name", ["2026-12-06_17-00-00_ab12cd", "slurm-1234", "my.job_1", "x" * 255])
def test_a_run_id_that_is_one_name_names_a_folder_inside_its_parent(name: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(RUN_ID, name)
    assert run_folder.bad_run_id(name) is None
    assert Path(run_folder.claim(str(tmp_path))) == tmp_path / name


@pytest.mark.parametrize("name", ["../../elsewhere", "/tmp/abs", "a/b", ".", "..", "x" * 256, "a b", "é"])
def test_a_run_id_that_is_not_one_name_is_refused_in_one_line(name: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(RUN_ID, name)
    problem = run_folder.bad_run_id(name)
    assert problem and problem.startswith(f"{RUN_ID}={name!r} is not a folder's name")
    with pytest.raises(SystemExit, match="^Error: " + RUN_ID):
        OwnFolder().on_run_start(_config(tmp_path / "unused"))
    with pytest.raises(InputError):
        run_folder.claim(str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def _config(folder: Path, output_subdir: str | None = ".hydra", **keys: str) -> OmegaConf:
    return OmegaConf.create({"hydra": {"run": {"dir": str(folder)}, "output_subdir": output_subdir}, **keys})


def _holding(folder: Path, *files: str) -> Path:
    folder.mkdir()
    for name in files:
        (folder / name).write_text("mine")
    return folder


def _run(folder: Path) -> Path:
    (folder / ".hydra").mkdir(parents=True)
    (folder / run_folder.SAVED_OVERRIDES).write_text("- model.optimizer.lr=0.002\n")
    return folder


@pytest.mark.parametrize(
    "make,refused",
    [
        (lambda p: p / "new", None),
        (lambda p: _holding(p), None),  # empty
        (lambda p: _holding(p, "train_ddp_process_1.log"), None),  # another rank's log: it may start first
        (lambda p: _holding(p, "notes.txt"), "which exists and is not a run folder"),
        (_run, "which already holds a run: nothing was written there. Continue that run with"),
    ],
)
def test_a_run_starts_only_in_a_free_folder(make, refused: str | None, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(RUN_ID, raising=False)
    folder = make(tmp_path / "run")
    before = _contents(folder) if folder.exists() else None
    if refused is None:
        OwnFolder().on_run_start(_config(folder))
    else:
        with pytest.raises(SystemExit, match=f"^Error: hydra.run.dir={folder}, {refused}"):
            OwnFolder().on_run_start(_config(folder))
    assert (_contents(folder) if folder.exists() else None) == before


def test_a_process_that_joins_a_run_saves_no_config_and_may_start_in_its_folder(tmp_path: Path) -> None:
    """The ranks beyond 0, a sweep job re-run in fresh processes, resume=: all start with output_subdir null."""
    OwnFolder().on_run_start(_config(_run(tmp_path / "run"), output_subdir=None))


def test_the_launch_that_named_a_folder_may_start_in_it_again(tmp_path: Path, monkeypatch) -> None:
    """A restarted pod or torchrun round, a requeued SLURM job (no last.ckpt yet: it starts the run again)."""
    monkeypatch.setenv(RUN_ID, "job-1")
    OwnFolder().on_run_start(_config(_run(tmp_path / "job-1")))
    with pytest.raises(SystemExit, match=f"^Error: {RUN_ID}=job-1 names .*/job-2, which already holds a run"):
        monkeypatch.setenv(RUN_ID, "job-1")
        OwnFolder().on_run_start(_config(_run(tmp_path / "job-2")))


def test_a_sweep_starts_only_in_a_free_folder_unless_it_resumes_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(RUN_ID, raising=False)
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / run_folder.SWEEP_FILE).write_text("hydra: {}\n")
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}, "resume": None})
    with pytest.raises(SystemExit, match=f"^Error: hydra.sweep.dir={sweep}, which already holds a sweep"):
        OwnFolder().on_multirun_start(config)
    config.resume = str(sweep)
    OwnFolder().on_multirun_start(config)


@pytest.fixture(scope="session")  # computed once a worker: see test_ray.cluster
def stopped_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of train.py that trained 2 of its 3 epochs, then stopped (its metrics.json never written)."""
    log_dir = tmp_path_factory.mktemp("log")
    result = run_script("train.py", *DETERMINISTIC, "trainer.max_epochs=2", f"paths.log_dir={log_dir}")
    assert result.returncode == 0, result.stderr
    (run,) = (log_dir / "train" / "runs").iterdir()
    (run / run_folder.METRICS_FILE).unlink()
    return run


@pytest.mark.slow
def test_every_way_into_another_runs_folder_is_refused_in_one_line_and_changes_no_byte(
    stopped_run: Path, tmp_path: Path
) -> None:
    run, before = stopped_run, _contents(stopped_run)
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / run_folder.SWEEP_FILE).write_text("hydra: {}\n")
    (sweep / "0").mkdir()
    sweep_before = _contents(sweep)
    named_by_id = {**os.environ, RUN_ID: run.name}
    ways = [  # (overrides, environment, the folder, what the one line says)
        ([f"hydra.run.dir={run}", "model.optimizer.lr=0.5"], None, run, f"hydra.run.dir={run}, which already holds"),
        ([f"paths.log_dir={run.parents[2]}", "data.batch_size=64"], named_by_id, run, f"{RUN_ID}={run.name} names"),
        ([f"resume={run}", "trainer.max_epochs=1"], None, run, f"resume={run} has trained 2 epochs, more than"),
        ([f"resume={run}", "data.batch_sise=3"], None, run, "batch_sise"),
        (["-m", f"hydra.sweep.dir={sweep}", "seed=1,2"], None, sweep, f"hydra.sweep.dir={sweep}, which already holds"),
    ]
    for overrides, env, folder, says in ways:
        command = processes.python("train.py", *overrides, "trainer.accelerator=cpu")
        result = processes.run(command, env=env, timeout=120)
        assert result.returncode == 1, (overrides, result.stderr[-2000:])
        assert says in result.stderr, (overrides, result.stderr[-2000:])
        assert (_contents(run), _contents(sweep)) == (before, sweep_before), overrides
    assert not (run / ".hydra" / "resumes").exists()  # a refused resume is not recorded
