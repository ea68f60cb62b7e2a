"""A sweep survives its failed jobs: the others run, the failures are listed, the exit is non-zero."""

import csv
import json
import multiprocessing
import queue
import re
import statistics
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf, open_dict

from mnistlab.runtime.config import hydra_versions
from mnistlab.runtime.run import run_folder
from mnistlab.sweeps import gpu_slots
from mnistlab.sweeps.summary import SweepSummary

from composing import ROOT, SHORT, SUITE_DATA
from running import run_script

pytestmark = pytest.mark.slow


def test_failed_jobs_leave_the_others_running_are_listed_at_the_end_and_the_table_shows_all(tmp_path) -> None:
    lrs = "model.optimizer.lr=1e-3,1e30,-1"  # fine, diverges, refused by the config check
    result = run_script("train.py", "-m", lrs, *SHORT, "logger=none", f"paths.log_dir={tmp_path}")
    assert result.returncode == 1
    (sweep,) = (tmp_path / "train" / "multiruns").iterdir()
    assert (sweep / "0" / "metrics.json").is_file() and (run_folder.last_checkpoint(sweep / "0")).is_file()
    lines = result.stderr.strip().splitlines()[-3:]
    assert lines == [
        f"2 of 3 jobs of the sweep in {sweep} failed:",
        (
            "  1 (model.optimizer.lr=1e+30): The training loss became non-finite (NaN or inf) between steps 0 and 20,"
            " with learning rate 1e+30: lower model.optimizer.lr, or clip gradients (trainer.gradient_clip_val=1.0)."
            " No checkpoint of these weights was written; none was written before"
        ),
        "  2 (model.optimizer.lr=-1): model.optimizer.lr=-1: should be greater than 0 (torch.optim.Adam)",
    ]
    assert "Traceback" not in result.stdout + result.stderr
    assert "Traceback" in (sweep / "1" / "failure.txt").read_text()  # the details, for whoever wants them
    # The table that ends it, printed and as summary.csv, and the best job.
    rows = _summary(sweep)
    assert [(r["job"], r["model.optimizer.lr"], r["status"]) for r in rows] == [
        ("0", "0.001", "ok"),
        ("1", "1e+30", "failed"),
        ("2", "-1", "failed"),
    ]
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0", "1", "2"]  # a folder per job, its config
    assert "lr: 0.001" in (sweep / "0" / ".hydra" / "config.yaml").read_text()
    metric = json.loads((sweep / "0" / "metrics.json").read_text())["val/acc_best"]
    assert float(rows[0]["val/acc_best"]) == pytest.approx(metric, rel=1e-5) and rows[1]["val/acc_best"] == ""
    assert re.search(r"│\s+0 │ 0.001\s+│\s+0\.\d+ │ ok", result.stdout)  # the table, printed
    assert f"Best: job 0, val/acc_best={metric:.6g}: {sweep / '0'}" in result.stdout


def _summary(sweep: Path) -> list[dict[str, str]]:
    with (sweep / "summary.csv").open() as file:
        return list(csv.DictReader(file))


def test_optuna_sweep_over_ddp_jobs_reads_each_jobs_real_metric(tmp_path: Path) -> None:
    """The basic launcher: each job's ranks started from the sweep's own process (a pool of worker processes
    is test_optuna's pruning test)."""
    result = run_script(
        "train.py",
        "-m",
        "hydra/sweeper=optuna",
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.direction=maximize",
        "model.optimizer.lr=interval(1e-4,1e-2)",
        "strategy=ddp",
        "trainer.devices=2",
        *SHORT,
        f"paths.log_dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert [p.name for p in (tmp_path / "train").iterdir()] == ["multiruns"]  # no second tree from the ranks
    (sweep,) = (tmp_path / "train" / "multiruns").iterdir()
    best = {}
    for job in ("0", "1"):
        folder = sweep / job
        assert [p.relative_to(folder).as_posix() for p in folder.rglob("config.yaml")] == [".hydra/config.yaml"]
        (lr,) = [o for o in (folder / ".hydra" / "overrides.yaml").read_text().split() if "optimizer.lr=" in o]
        for rank_log in ("train_ddp_process_0.log", "train_ddp_process_1.log"):  # the sampled lr, on both ranks
            assert lr in (folder / rank_log).read_text()
        metrics = json.loads((folder / "metrics.json").read_text())
        assert (
            metrics["test/samples"] == 5 * SUITE_DATA["batch_size"] and (run_folder.last_checkpoint(folder)).is_file()
        )
        best[lr] = metrics["val/acc_best"]
    results = (sweep / "optimization_results.yaml").read_text()
    assert f"best_value: {max(best.values())}" in results


def test_a_parallel_job_trains_on_a_gpu_no_other_job_holds(tmp_path, monkeypatch) -> None:
    """own_gpu, on a machine that says it has 2 GPUs: two jobs at once get GPU 0 and GPU 1; a CPU job and
    a job on a 1-GPU machine keep their devices."""
    import torch
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    with initialize_config_dir(config_dir=str(ROOT / "conf"), **hydra_versions.BASE):
        sweep = ["hydra/launcher=parallel", f"hydra.sweep.dir={tmp_path}", "trainer.accelerator=gpu"]
        cfg = compose("train", overrides=sweep, return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.mode = RunMode.MULTIRUN
    monkeypatch.setattr(HydraConfig.instance(), "cfg", None)  # restored after the test
    HydraConfig.instance().set_config(cfg)
    jobs = [cfg.copy() for _ in range(3)]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with gpu_slots.own_gpu(jobs[0]), gpu_slots.own_gpu(jobs[1]):
        assert (jobs[0].trainer.devices, jobs[1].trainer.devices) == ([0], [1])
    jobs[2].trainer.accelerator = "cpu"
    with gpu_slots.own_gpu(jobs[2]):
        assert jobs[2].trainer.devices == 1
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with gpu_slots.own_gpu(cfg):
        assert cfg.trainer.devices == 1


def _hold_a_gpu(job: int, folder: Path, held: multiprocessing.Queue, release: Any) -> None:
    with gpu_slots.claim(folder, count=2, poll_s=0.05) as gpu:
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


def test_seeds_are_grouped_into_mean_sd_and_n_best_first(tmp_path) -> None:
    """Replicates (seed; the example's data.fold too) of each setting: one row each, best mean first."""
    sweep_args = ["seed=1,2,3", "model.optimizer.lr=1e-3,3e-3", "test=false"]
    result = run_script("train.py", "-m", *sweep_args, *SHORT, "logger=none", f"paths.log_dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    (sweep,) = (tmp_path / "train" / "multiruns").iterdir()
    with (sweep / "groups.csv").open() as file:
        rows = list(csv.DictReader(file))
    own: dict[str, list[float]] = {}  # each job's own metric, by learning rate
    for job in _summary(sweep):
        metric = json.loads((sweep / job["job"] / "metrics.json").read_text())["val/acc_best"]
        own.setdefault(job["model.optimizer.lr"], []).append(metric)
    assert [row["model.optimizer.lr"] for row in rows] == sorted(own, key=lambda lr: -statistics.fmean(own[lr]))
    for row in rows:
        values = own[row["model.optimizer.lr"]]
        assert (int(row["n"]), int(row["jobs"])) == (3, 3)
        assert float(row["val/acc_best mean"]) == pytest.approx(statistics.fmean(values), rel=1e-5)
        assert float(row["val/acc_best sd"]) == pytest.approx(statistics.stdev(values), rel=1e-4)
    assert "Over seed, data.fold: 2 groups, best first" in result.stdout
    weights = [torch.load(sweep / str(job) / "checkpoints" / "last.ckpt", weights_only=True) for job in range(3)]
    first = next(iter(weights[0]["state_dict"]))
    assert len({float(w["state_dict"][first].sum()) for w in weights}) == 3  # three seeds: three different runs


def _files(folder: Path) -> dict[str, tuple[int, bytes]]:
    """Every file under ``folder``: its modification time and its bytes."""
    return {
        str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.read_bytes()) for p in folder.rglob("*") if p.is_file()
    }


@pytest.mark.parametrize("launcher", ["basic", "parallel"])
def test_a_killed_sweep_resumed_finishes_its_jobs_and_leaves_the_finished_one_untouched(launcher, tmp_path) -> None:
    """Three jobs of 2 epochs of 10 steps (last.ckpt each epoch); SIGKILL in job 1 at step 15, which takes
    the sweep's process down with it (basic: the same process; parallel: joblib's pool gives up)."""
    chosen = [] if launcher == "basic" else ["hydra/launcher=parallel", "hydra.launcher.n_jobs=1"]
    kill = ["+callbacks.kill._target_=faults.KillAt", "+callbacks.kill.step=15", "+callbacks.kill.job=1"]
    lrs, steps = "model.optimizer.lr=1e-3,2e-3,3e-3", ["trainer.limit_train_batches=10", "trainer.limit_val_batches=5"]
    first = run_script(
        "train.py", "-m", *chosen, lrs, "trainer.max_epochs=2", *steps, "logger=none", "test=false", *kill,
        f"paths.log_dir={tmp_path}",
    )  # fmt: skip
    assert first.returncode != 0
    (sweep,) = (tmp_path / "train" / "multiruns").iterdir()
    assert not (sweep / "1" / "metrics.json").exists() and not (sweep / "2").exists()
    assert _load(run_folder.last_checkpoint(sweep / "1"))["global_step"] == 10  # its first epoch's
    before, everything = _files(sweep / "0"), _files(sweep)
    typo = run_script("train.py", f"resume={sweep}", "trainer.max_epochs=abc")  # refused before any job or record
    assert (typo.returncode, typo.stderr.strip()) == (
        1,
        "Error: trainer.max_epochs=abc: should be an integer or null (lightning.pytorch.Trainer)",
    )
    assert _files(sweep) == everything  # bytes and times: multirun.yaml, the jobs' folders
    resumed = run_script("train.py", f"resume={sweep}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _files(sweep / "0") == before  # the finished job: not run again, nothing rewritten
    assert f"Job 0 finished before: kept as it is ({sweep / '0'})" in resumed.stdout
    assert [(r["job"], r["model.optimizer.lr"], r["status"]) for r in _summary(sweep)] == [
        ("0", "0.001", "ok"),
        ("1", "0.002", "ok"),
        ("2", "0.003", "ok"),
    ]  # the whole table, the jobs' own values (the kill, a _target_, was not replayed)
    log = (sweep / "1" / "train.log").read_text()
    assert f"Resuming from {sweep / '1' / 'checkpoints' / 'last.ckpt'}" in log
    assert _load(run_folder.last_checkpoint(sweep / "1"))["global_step"] == 20
    assert _load(run_folder.last_checkpoint(sweep / "2"))["global_step"] == 20
    assert (sweep / "comparison.png").is_file()


def _load(path: Path) -> dict[str, Any]:
    from mnistlab.runtime.checkpointing.checkpoint_io import load_checkpoint

    return load_checkpoint(path)
