"""Hyperparameter search on today's Optuna (hydra/sweeper=optuna, src/hydra_plugins/mnistlab_optuna): the
search space read from Hydra's syntax, studies stored and continued, failed trials recorded, hopeless
trials pruned on every rank of a job, a killed sweep's trial failed and run again, the dashboard."""

import csv
import json
import os
import re
import signal
import sqlite3
import time
import urllib.request
from contextlib import closing
from datetime import datetime
from pathlib import Path

import optuna
import pytest
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import OmegaConf
from optuna import distributions as d
from optuna.trial import TrialState

from mnistlab.runtime.run import run_folder

from hydra_plugins.mnistlab_optuna import search_space
from hydra_plugins.mnistlab_optuna.optuna_sweeper import _grid

import processes
from composing import ROOT, SHORT, compose_config
from running import free_port, run_script


def test_the_search_space_is_read_from_hydras_sweep_syntax() -> None:
    space, fixed = search_space.parse(
        [
            "a=choice(32, 64)",
            "b=range(32, 257, 32)",
            "c=tag(log, interval(1e-4, 1e-2))",
            "d=interval(0, 1)",
            "e=range(0.5, 2.0, 0.5)",
            "trainer.max_epochs=3",
            "f='quoted value'",
        ]
    )
    assert space == {
        "a": d.CategoricalDistribution([32, 64]),
        "b": d.IntDistribution(32, 256, step=32),  # range's stop is left out, as in Python
        "c": d.FloatDistribution(1e-4, 1e-2, log=True),
        "d": d.FloatDistribution(0.0, 1.0),
        "e": d.FloatDistribution(0.5, 1.5, step=0.5),
    }
    assert fixed == ["trainer.max_epochs=3", "f='quoted value'"]  # passed on as written
    assert _grid({"a": space["a"], "b": space["b"]}) == {"a": [32, 64], "b": [32, 64, 96, 128, 160, 192, 224, 256]}
    with pytest.raises(ValueError, match="c is an interval"):
        _grid(space)


# Two trials of hydra/sweeper=optuna that draw both values of a two-value choice(...): the grid sampler, seeded.
OPTUNA_BOTH_VALUES = [
    "hydra/sweeper/sampler=grid",
    "hydra.sweeper.sampler.seed=0",
    "hydra.sweeper.n_trials=2",
    "hydra.sweeper.direction=maximize",
]
SWEEPER = ROOT / "conf" / "hydra" / "sweeper"


@pytest.mark.parametrize("sampler", sorted(p.stem for p in (SWEEPER / "sampler").glob("*.yaml")))
@pytest.mark.parametrize("pruner", sorted(p.stem for p in (SWEEPER / "pruner").glob("*.yaml")))
def test_every_sampler_and_pruner_builds_with_the_search(sampler: str, pruner: str, tmp_path: Path) -> None:
    """hparams_search=mnist_optuna with each sampler and pruner: the sweeper, its sampler and pruner are
    built as the sweep builds them, and the job's pruning callback gets the same pruner."""
    overrides = ["hparams_search=mnist_optuna", f"hydra/sweeper/sampler={sampler}", f"hydra/sweeper/pruner={pruner}"]
    cfg = compose_config("train", tmp_path, overrides, hydra=True)
    sweeper = instantiate(cfg.hydra.sweeper)
    assert type(sweeper.pruner) is type(instantiate(cfg.hydra.sweeper.pruner))
    assert sweeper.params.keys() == {"model.optimizer.lr", "data.batch_size", "model.net.hidden"}
    space, _ = search_space.parse([f"{k}={v}" for k, v in sweeper.params.items() if sampler != "grid" or "lr" not in k])
    built = sweeper.sampler(search_space=_grid(space)) if sampler == "grid" else sweeper.sampler
    assert isinstance(built, optuna.samplers.BaseSampler) and isinstance(sweeper.pruner, optuna.pruners.BasePruner)
    HydraConfig.instance().set_config(cfg)  # as in a job: the callback reads the sweeper's settings through it
    try:
        callback = instantiate(cfg.callbacks.optuna_pruning)
    finally:
        HydraConfig.instance().cfg = None  # no job after this test
    assert type(callback.pruner) is type(sweeper.pruner) and callback.storage == sweeper.storage


def _study(tmp_path: Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path}/train/multiruns/optuna.db")


def _states_so_far(tmp_path: Path) -> list[str]:
    """The trials' states while a sweep runs, read from its SQLite file read-only: opening it with Optuna
    would create the tables the sweep may be creating itself (CI once met a database without its study)."""
    database = tmp_path / "train" / "multiruns" / "optuna.db"
    if not database.exists():
        return []
    try:
        with closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=5)) as connection:
            return [state for (state,) in connection.execute("SELECT state FROM trials ORDER BY number")]
    except sqlite3.OperationalError:  # no table yet
        return []


def _sweeps(tmp_path: Path) -> list[Path]:
    return sorted(p for p in (tmp_path / "train" / "multiruns").iterdir() if p.is_dir())


def _rows(sweep: Path) -> list[dict[str, str]]:
    with (sweep / "summary.csv").open() as file:
        return list(csv.DictReader(file))


@pytest.mark.slow
def test_hparams_search_stores_its_optuna_study_and_the_same_command_continues_it(tmp_path) -> None:
    search = ["-m", "hparams_search=mnist_optuna", "hydra.sweeper.n_trials=2", *SHORT, "logger=none"]
    for _ in range(2):
        result = run_script("train.py", *search, f"paths.log_dir={tmp_path}")
        assert result.returncode == 0, result.stderr[-3000:]
    study = _study(tmp_path, "mnist_optuna")
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 4  # the second command added to the first's
    values = [float(row["val/acc_best"]) for sweep in _sweeps(tmp_path) for row in _rows(sweep)]
    assert [t.value for t in study.trials] == pytest.approx(values, rel=1e-5)  # each trial got its job's metric
    space = study.trials[0].distributions  # conf/hparams_search/mnist_optuna.yaml, as the README states it
    assert space == {
        "model.optimizer.lr": d.FloatDistribution(1e-4, 1e-2, log=True),
        "data.batch_size": d.CategoricalDistribution([32, 64, 128, 256]),
        "model.net.hidden": d.CategoricalDistribution([64, 128, 256, 512]),
    }
    numbers = [[row["optuna_trial"] for row in _rows(sweep)] for sweep in _sweeps(tmp_path)]
    assert numbers == [["0", "1"], ["2", "3"]]  # each job knew its trial, and reported to it:
    assert [t.intermediate_values for t in study.trials] == [{0: pytest.approx(t.value)} for t in study.trials]


@pytest.mark.slow
def test_an_optuna_trial_that_fails_is_recorded_as_failed_and_the_study_goes_on(tmp_path) -> None:
    """One trial diverges (lr=1e30), one trial at a time: the study in its storage holds it as failed, the
    other completes, and the sweep's table and optimization_results.yaml name the completed one."""
    storage = f"sqlite:///{tmp_path}/optuna.db"
    result = run_script(
        "train.py", "-m", "hydra/sweeper=optuna", *OPTUNA_BOTH_VALUES, "hydra.sweeper.n_jobs=1",
        f"hydra.sweeper.storage={storage}", "hydra.sweeper.study_name=one_fails",
        "model.optimizer.lr=choice(1e-3,1e30)", *SHORT, "logger=none", f"paths.log_dir={tmp_path}",
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-3000:]
    study = optuna.load_study(study_name="one_fails", storage=storage)
    trials = sorted((t.params["model.optimizer.lr"], t.state.name) for t in study.trials)
    assert trials == [(1e-3, "COMPLETE"), (1e30, "FAIL")]
    (sweep,) = _sweeps(tmp_path)
    good = next(t for t in study.trials if t.state is TrialState.COMPLETE)
    best = OmegaConf.load(sweep / "optimization_results.yaml")
    assert best.best_params["model.optimizer.lr"] == 1e-3 and best.best_value == pytest.approx(good.value)
    metrics = json.loads((sweep / str(good.number) / "metrics.json").read_text())
    assert best.best_value == pytest.approx(metrics["val/acc_best"])
    assert f"1 of 2 jobs of the sweep in {sweep} failed:" in result.stderr


# A search that prunes for certain: a grid of two good learning rates and a hopeless one, walked in an order
# where the hopeless one comes last (the grid's seed), judged from the first epoch on against the median
# of the two before it.
PRUNES_THE_LAST = [
    "-m", "hparams_search=mnist_optuna", "hydra.sweeper.params=null", "model.optimizer.lr=choice(3e-3,1e-2,1e-7)",
    "hydra/sweeper/sampler=grid", "hydra.sweeper.sampler.seed=3", "hydra.sweeper.n_trials=3",
    "hydra.sweeper.pruner.n_startup_trials=2", "hydra.sweeper.pruner.n_warmup_steps=0",
    "trainer.max_epochs=3", *SHORT[1:], "logger=none",
]  # fmt: skip


def check_pruned(tmp_path: Path, result) -> Path:
    """The last trial (lr=1e-7) PRUNED after its first epoch, the others complete; the sweep ends well."""
    assert result.returncode == 0, result.stderr[-3000:]
    study = _study(tmp_path, "mnist_optuna")
    states = [(t.params["model.optimizer.lr"], t.state.name) for t in study.trials]
    assert states[-1] == (1e-7, "PRUNED") and [s for _, s in states[:-1]] == ["COMPLETE", "COMPLETE"], states
    pruned = study.trials[-1]
    assert list(pruned.intermediate_values) == [0] and pruned.value == pruned.intermediate_values[0]
    (sweep,) = _sweeps(tmp_path)
    job = sweep / str(pruned.number)
    assert (job / "pruned.txt").read_text().startswith("pruned after epoch 0: val/acc_best=")
    assert torch.load(run_folder.last_checkpoint(job), weights_only=True)["epoch"] == 0  # it stopped there
    assert [row["status"] for row in _rows(sweep)] == ["ok", "ok", "pruned"]
    assert "failed" not in result.stderr
    return sweep


@pytest.mark.slow
def test_a_hopeless_trial_is_pruned_the_study_records_it_and_the_dashboard_shows_it(tmp_path) -> None:
    result = run_script("train.py", *PRUNES_THE_LAST, f"paths.log_dir={tmp_path}")
    check_pruned(tmp_path, result)
    port = free_port()
    storage = f"sqlite:///{tmp_path}/train/multiruns/optuna.db"
    dashboard = processes.start(["optuna-dashboard", storage, "--port", port, "--host", "127.0.0.1"])
    studies = _get(f"http://127.0.0.1:{port}/api/studies", dashboard)["study_summaries"]
    assert [s["study_name"] for s in studies] == ["mnist_optuna"]
    trials = _get(f"http://127.0.0.1:{port}/api/studies/{studies[0]['study_id']}", dashboard)["trials"]
    assert [t["state"] for t in trials] == ["Complete", "Complete", "Pruned"]
    assert [len(t["intermediate_values"]) for t in trials] == [3, 3, 1]


def _get(url: str, server) -> dict:
    """GET ``url`` as JSON, waiting up to 60 s for ``server`` to answer."""

    def answer() -> dict | None:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return json.loads(response.read())
        except OSError:
            assert server.poll() is None, processes.finish(server)
            return None

    return processes.until(answer, 60, f"{url} answering", every=0.5)


@pytest.mark.slow
def test_pruning_stops_both_ranks_of_a_ddp_job_in_parallel_jobs(tmp_path) -> None:
    """Two DDP jobs of 2 ranks side by side in a pool of worker processes (hydra/launcher=parallel, n_jobs=2:
    their logs overlap in time), then the hopeless one: its rank 0 asks the pruner, both ranks stop after
    the first epoch (a rank left training would hang on the next collective, and the test with it). Each
    job's ranks are its own: both ran its learning rate, into its folder alone."""
    search = [
        *PRUNES_THE_LAST,
        "hydra/launcher=parallel",
        "hydra.sweeper.n_jobs=2",
        "strategy=ddp",
        "trainer.devices=2",
    ]
    result = run_script("train.py", *search, f"paths.log_dir={tmp_path}")
    sweep = check_pruned(tmp_path, result)
    assert [p.name for p in (tmp_path / "train").iterdir()] == ["multiruns"]  # no second tree from the ranks
    for job in ("0", "1", "2"):
        folder = sweep / job
        assert [p.relative_to(folder).as_posix() for p in folder.rglob("config.yaml")] == [".hydra/config.yaml"]
        (lr,) = [o for o in (folder / ".hydra" / "overrides.yaml").read_text().split() if "optimizer.lr=" in o]
        for rank_log in ("train_ddp_process_0.log", "train_ddp_process_1.log"):  # the sampled lr, on both ranks
            assert lr.removeprefix("- ") in (folder / rank_log).read_text(), (job, rank_log)
    rank_1 = (sweep / "2" / "train_ddp_process_1.log").read_text()
    assert "model.optimizer.lr=1e-07" in rank_1 and "pruned after epoch 0" not in rank_1  # rank 0 alone reports
    assert "Joblib.Parallel(n_jobs=2" in result.stdout  # two worker processes
    (start0, end0), (start1, end1) = _active(sweep / "0"), _active(sweep / "1")
    assert max(start0, start1) < min(end0, end1), "jobs 0 and 1 did not run at the same time"


def _active(job: Path) -> tuple[datetime, datetime]:
    """When a job's rank 0 began and ended: its log's first and last lines' timestamps."""
    log = (job / "train_ddp_process_0.log").read_text()
    stamps = re.findall(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]", log, re.MULTILINE)
    return tuple(datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f") for stamp in (stamps[0], stamps[-1]))


@pytest.mark.slow
def test_a_sweep_killed_mid_trial_fails_that_trial_and_runs_it_again(tmp_path) -> None:
    """SIGKILL to the sweep while its second trial trains: its heartbeat stops, and the same command run
    again marks it FAIL, runs its parameters again (RetryHeartbeatStaleTrialCallback) and goes on."""
    search = [
        "-m", "hparams_search=mnist_optuna", "hydra.sweeper.heartbeat_interval=1",
        "hydra.sweeper.grace_period=3", "hydra/sweeper/pruner=none", *SHORT[1:], "logger=none",
        f"paths.log_dir={tmp_path}", "trainer.accelerator=cpu",
    ]  # fmt: skip
    with open(tmp_path / "first.log", "w") as log:
        first = processes.python("train.py", *search, "hydra.sweeper.n_trials=2", "trainer.max_epochs=15")
        sweep = processes.start(first, output=log)
    processes.until(
        lambda: _states_so_far(tmp_path)[1:2] == ["RUNNING"],
        300,
        lambda: f"the second trial running: {(tmp_path / 'first.log').read_text()[-3000:]}",
        every=0.5,
    )
    os.killpg(sweep.pid, signal.SIGKILL)  # while its job trains
    sweep.wait()
    killed = time.monotonic()  # the grace period is a span of the clock from the last heartbeat: none to poll
    processes.until(lambda: time.monotonic() - killed > 4, 5, "the grace period passing")
    again = run_script("train.py", *search, "hydra.sweeper.n_trials=1", "trainer.max_epochs=1")
    assert again.returncode == 0, again.stderr[-3000:]
    trials = _study(tmp_path, "mnist_optuna").trials
    assert [t.state.name for t in trials] == ["COMPLETE", "FAIL", "COMPLETE"]
    assert trials[2].params == trials[1].params  # the dead trial's parameters, run again
