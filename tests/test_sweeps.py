"""A sweep survives its failed jobs: the others run, the failures are listed, the exit is non-zero."""

import csv
import json
import multiprocessing
import queue
import re
from pathlib import Path
from typing import Any

import optuna
import pytest
from omegaconf import OmegaConf

from mnistlab import parallel
from mnistlab.sweep_summary import SweepSummary

from conftest import OPTUNA_BOTH_VALUES, SHORT, run_script

pytestmark = pytest.mark.slow


def test_failed_jobs_leave_the_others_running_and_are_listed_at_the_end(tmp_path) -> None:
    lrs = "model.optimizer.lr=1e-3,1e30,-1"  # fine, diverges, refused by the config check
    result = run_script("train.py", "-m", lrs, *SHORT, "logger=none", f"paths.log_dir={tmp_path}")
    assert result.returncode == 1
    (sweep,) = (tmp_path / "train" / "multiruns").iterdir()
    assert (sweep / "0" / "metrics.json").is_file() and (sweep / "0" / "checkpoints" / "last.ckpt").is_file()
    lines = result.stderr.strip().splitlines()[-3:]
    assert lines == [
        f"2 of 3 jobs of the sweep in {sweep} failed:",
        (
            "  1 (model.optimizer.lr=1e+30): The training loss became non-finite (NaN or inf) between steps 0 and 20,"
            " with learning rate 1e+30: lower model.optimizer.lr, or clip gradients (trainer.gradient_clip_val=1.0)."
            " No checkpoint of these weights was written; none was written before"
        ),
        "  2 (model.optimizer.lr=-1): model.optimizer.lr=-1: should be greater than 0",
    ]
    assert "Traceback" not in result.stdout + result.stderr
    assert "Traceback" in (sweep / "1" / "failure.txt").read_text()  # the details, for whoever wants them


def test_an_optuna_trial_that_fails_is_recorded_as_failed_and_the_study_goes_on(tmp_path) -> None:
    result = run_script(
        "train.py",
        "-m",
        "hydra/sweeper=optuna",
        *OPTUNA_BOTH_VALUES,
        "model.optimizer.lr=choice(1e30,1e-3)",
        *SHORT,
        "logger=none",
        f"paths.log_dir={tmp_path}",
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stdout.count("Failed experiment") == 1  # Optuna's word for a trial it records as failed
    (sweep,) = (tmp_path / "train" / "multiruns").iterdir()
    best = OmegaConf.load(sweep / "optimization_results.yaml")
    assert best.best_params["model.optimizer.lr"] == 1e-3 and best.best_value > 0.5
    assert f"1 of 2 jobs of the sweep in {sweep} failed:" in result.stderr


def _summary(sweep: Path) -> list[dict[str, str]]:
    with (sweep / "summary.csv").open() as file:
        return list(csv.DictReader(file))


def test_a_sweep_ends_with_a_table_of_its_jobs_and_the_best_one(tmp_path) -> None:
    result = run_script(
        "train.py", "-m", "model.optimizer.lr=1e-3,1e30", *SHORT, "logger=none", f"paths.log_dir={tmp_path}"
    )
    assert result.returncode == 1
    (sweep,) = (tmp_path / "train" / "multiruns").iterdir()
    rows = _summary(sweep)
    assert [(r["job"], r["model.optimizer.lr"], r["status"]) for r in rows] == [
        ("0", "0.001", "ok"),
        ("1", "1e+30", "failed"),
    ]
    metric = json.loads((sweep / "0" / "metrics.json").read_text())["val/acc_best"]
    assert float(rows[0]["val/acc_best"]) == pytest.approx(metric, rel=1e-5) and rows[1]["val/acc_best"] == ""
    assert re.search(r"│\s+0 │ 0.001\s+│\s+0\.\d+ │ ok", result.stdout)  # the table, printed
    assert f"Best: job 0, val/acc_best={metric:.6g}: {sweep / '0'}" in result.stdout


def test_hparams_search_stores_its_optuna_study_and_the_same_command_continues_it(tmp_path) -> None:
    search = ["-m", "hparams_search=mnist_optuna", "hydra.sweeper.n_trials=2", *SHORT, "logger=none"]
    for _ in range(2):
        result = run_script("train.py", *search, f"paths.log_dir={tmp_path}")
        assert result.returncode == 0, result.stderr[-3000:]
    study = optuna.load_study(study_name="mnist_optuna", storage=f"sqlite:///{tmp_path}/train/multiruns/optuna.db")
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 4  # the second command added to the first's
    sweeps = sorted(p for p in (tmp_path / "train" / "multiruns").iterdir() if p.is_dir())
    values = [float(row["val/acc_best"]) for sweep in sweeps for row in _summary(sweep)]
    assert [t.value for t in study.trials] == pytest.approx(values, rel=1e-5)  # each trial got its job's metric
    assert set(study.trials[0].params) == {"model.optimizer.lr", "data.batch_size", "model.net.hidden"}


def test_hparams_search_trials_run_as_ddp_jobs(tmp_path) -> None:
    search = ["-m", "hparams_search=mnist_optuna", "hydra.sweeper.n_trials=1", "strategy=ddp", "trainer.devices=2"]
    result = run_script(
        "train.py", *search, "trainer.accelerator=cpu", *SHORT, "logger=none", f"paths.log_dir={tmp_path}"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (sweep,) = (p for p in (tmp_path / "train" / "multiruns").iterdir() if p.is_dir())
    assert "Starting with 2 processes" in (sweep / "0" / "train_ddp_process_0.log").read_text()
    (row,) = _summary(sweep)
    assert row["status"] == "ok"


def test_parallel_jobs_run_side_by_side_and_end_in_one_table(tmp_path) -> None:
    lrs = "model.optimizer.lr=1e-3,3e-3,1e-2"
    result = run_script(
        "train.py", "-m", "hydra/launcher=parallel", lrs, *SHORT, "logger=none", f"paths.log_dir={tmp_path}"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (sweep,) = (tmp_path / "train" / "multiruns").iterdir()
    assert [row["status"] for row in _summary(sweep)] == ["ok"] * 3
    assert "Joblib.Parallel(n_jobs=2" in result.stdout  # two worker processes


def _hold_a_gpu(job: int, folder: Path, held: multiprocessing.Queue, release: Any) -> None:
    with parallel.claim(folder, count=2, poll_s=0.05) as gpu:
        held.put((job, gpu))
        release.wait(30)


def test_each_parallel_job_holds_a_gpu_no_other_job_holds(tmp_path) -> None:
    """Three jobs, two GPUs: the first two get one each, the third waits and gets the one given back."""
    spawn = multiprocessing.get_context("spawn")
    held, release = spawn.Queue(), [spawn.Event() for _ in range(3)]
    jobs = [spawn.Process(target=_hold_a_gpu, args=(i, tmp_path, held, release[i])) for i in range(3)]
    for job in jobs[:2]:
        job.start()
    gpus = dict([held.get(timeout=30), held.get(timeout=30)])
    assert sorted(gpus.values()) == [0, 1]
    jobs[2].start()
    with pytest.raises(queue.Empty):
        held.get(timeout=1)  # both taken: the third waits
    release[1].set()  # the second job ends
    assert held.get(timeout=30) == (2, gpus[1])
    for event in release:
        event.set()
    for job in jobs:
        job.join(timeout=30)
        assert job.exitcode == 0


def test_a_broken_result_file_reads_as_no_result_and_the_table_still_comes(tmp_path, capsys) -> None:
    """A metrics.json cut short (a job killed mid-write before writes were atomic, a full disk), an
    empty failure.txt, overrides that are not YAML: each job still gets its row."""
    jobs = {
        "0": ("- model.optimizer.lr=0.001\n", '{"val/acc_best": 0.9}'),
        "1": ("- model.optimizer.lr=0.002\n", ""),  # empty metrics.json
        "2": ("- model.optimizer.lr=0.003\n", '{"val/acc_best": 0.'),  # cut short
        "3": ("- [unclosed\n", '{"val/acc_best": "high"}'),  # not YAML; a metric that is no number
    }
    for name, (overrides, metrics) in jobs.items():
        (tmp_path / name / ".hydra").mkdir(parents=True)
        (tmp_path / name / ".hydra" / "overrides.yaml").write_text(overrides)
        (tmp_path / name / "metrics.json").write_text(metrics)
    config = OmegaConf.create(
        {
            "optimized_metric": "val/acc_best",
            "optimized_direction": "maximize",
            "hydra": {"sweep": {"dir": str(tmp_path)}},
        }
    )
    SweepSummary().on_multirun_end(config)
    rows = (tmp_path / "summary.csv").read_text().splitlines()
    assert [row.split(",")[-3:-1] for row in rows[1:]] == [
        ["0.9", "ok"],
        ["", "no result"],
        ["", "no result"],
        ["", "no result"],
    ]
    assert f"Best: job 0, val/acc_best=0.9: {tmp_path / '0'}" in capsys.readouterr().out
