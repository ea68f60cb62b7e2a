"""``hydra/sweeper=optuna``: an Optuna study run through Hydra's launcher, ``n_jobs`` trials at a time
(see this package's docstring; the config is ``conf/hydra/sweeper/optuna.yaml``)."""

import logging
import math
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Literal

from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from mnistlab.runtime.run import internals

from hydra_plugins.mnistlab_optuna import search_space

log = logging.getLogger(__name__)
RESULTS_FILE = "optimization_results.yaml"  # in the sweep's folder: the best trial (hydra-optuna-sweeper's file)


class OptunaSweeper(Sweeper):
    def __init__(
        self,
        sampler: Any,
        pruner: Any,
        direction: Literal["minimize", "maximize", "min", "max"],  # min | max: as the run config's mode
        storage: str | None,
        study_name: str | None,
        n_trials: int,
        n_jobs: int,
        params: DictConfig | None,
        trial_key: str | None,
        heartbeat_interval: int | None,
        grace_period: int | None,
        max_retry: int | None,
    ) -> None:
        self.sampler, self.pruner = _built(sampler), _built(pruner)
        self.direction: Literal["minimize", "maximize"] = "minimize" if direction in ("min", "minimize") else "maximize"
        self.storage, self.study_name, self.trial_key = storage, study_name, trial_key
        self.n_trials, self.n_jobs = n_trials, n_jobs
        self.params = {str(key): str(value) for key, value in (params or {}).items()}
        self.heartbeat_interval, self.grace_period, self.max_retry = heartbeat_interval, grace_period, max_retry
        self.job_idx = 0

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.sweep_dir = Path(config.hydra.sweep.dir)
        self.launcher: Launcher = Plugins.instance().instantiate_launcher(
            config=config, hydra_context=hydra_context, task_function=task_function
        )

    def sweep(self, arguments: list[str]) -> None:
        _quiet_heartbeat_notices()
        space, fixed = search_space.parse([*(f"{key}={value}" for key, value in self.params.items()), *arguments])
        study, storage = self._study(space)
        n_trials = min(self.n_trials, _grid_size(space)) if _is_grid(self.sampler) else self.n_trials
        finished = 0
        while finished < n_trials:
            trials = [study.ask(space) for _ in range(min(self.n_jobs, n_trials - finished))]
            with _heartbeats(storage, trials, self.heartbeat_interval):
                returns = self.launcher.launch([self._overrides(t, fixed) for t in trials], self.job_idx)
            self.job_idx += len(returns)
            for trial, result in zip(trials, returns, strict=True):
                _tell(study, trial, result)
            finished += len(trials)
        _report(study, self.sweep_dir)

    def _study(self, space: dict[str, Any]) -> tuple[Any, Any]:
        """The study, loaded if the storage has it; its trials a killed sweep left RUNNING marked FAIL
        and queued again (their heartbeat stopped more than ``grace_period`` s ago)."""
        import optuna

        optuna.logging.enable_propagation()  # Optuna's records through Hydra's logging (console and the sweep's log)
        optuna.logging.disable_default_handler()
        storage = None
        if self.storage:
            retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=self.max_retry)
            storage = optuna.storages.RDBStorage(
                self.storage,
                heartbeat_interval=self.heartbeat_interval,
                grace_period=self.grace_period,
                heartbeat_stale_trial_callback=retry,
            )
        sampler = self.sampler(search_space=_grid(space)) if _is_grid(self.sampler) else self.sampler
        study = optuna.create_study(
            storage=storage,
            study_name=self.study_name,
            sampler=sampler,
            pruner=self.pruner,
            direction=self.direction,
            load_if_exists=True,
        )
        optuna.storages.fail_stale_trials(study)
        log.info("Study %s (%s): %d trials so far", study.study_name, self.storage or "in memory", len(study.trials))
        return study, storage

    def _overrides(self, trial: Any, fixed: list[str]) -> list[str]:
        chosen = [f"{key}={value}" for key, value in trial.params.items()]
        return [*fixed, *chosen, *([f"{self.trial_key}={trial.number}"] if self.trial_key else [])]


def _quiet_heartbeat_notices() -> None:
    """Optuna calls its heartbeat API experimental (since 2.8, unchanged through 5.1) at every use, and warns
    at every ``ask`` that heartbeats are meant for ``study.optimize``: this sweeper records them itself."""
    for notice in ("is experimental", "is an experimental feature", "Heartbeat of storage is supposed to be used"):
        warnings.filterwarnings("ignore", message=f".*{notice}")


def _built(node: Any) -> Any:
    """A sampler or pruner: Hydra 1.3 builds a plugin's nested ``_target_`` nodes, Hydra 1.4 hands them over
    as configs (.ci/hydra-next)."""
    return instantiate(node) if isinstance(node, DictConfig) else node


def _tell(study: Any, trial: Any, result: JobReturn) -> None:
    """The job's result into the study: its value, or FAIL; a trial its job ended as PRUNED stays so."""
    from optuna.trial import TrialState

    if trial.number in {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.PRUNED,))}:
        return
    value = result.return_value if result.status is JobStatus.COMPLETED else None
    ok = isinstance(value, int | float) and math.isfinite(value)
    if not ok:  # a failed job (train.py recorded why in its failure.txt), or no number to optimise
        log.warning("Trial %d failed (its job returned %r): recorded as FAIL, the study goes on", trial.number, value)
    try:
        study.tell(trial, value if ok else None, state=TrialState.COMPLETE if ok else TrialState.FAIL)
    except RuntimeError as err:
        # GridSampler stops the study once every point is asked, a call Optuna allows inside optimize()
        # only; the trial's state is stored by then (Optuna stores it in a finally).
        if "Study.stop" not in str(err):
            raise


@contextmanager
def _heartbeats(storage: Any, trials: list[Any], interval: int | None) -> Iterator[None]:
    """Record the trials' heartbeats while their jobs run. Optuna's own heartbeat thread serves
    ``study.optimize``, whose trials run in its process; these run wherever the launcher put them."""
    if storage is None or not interval:
        yield
        return
    stop = threading.Event()

    def beat() -> None:
        while True:
            for trial in trials:
                storage.record_heartbeat(internals.optuna_trial_id(trial))
            if stop.wait(interval):
                return

    thread = threading.Thread(target=beat, name="optuna-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _is_grid(sampler: Any) -> bool:
    return isinstance(sampler, partial) and sampler.func.__name__ == "GridSampler"


def _grid(space: dict[str, Any]) -> dict[str, list[Any]]:
    """GridSampler's points: every value of each choice and range."""
    from optuna import distributions as d

    grid = {}
    for key, distribution in space.items():
        if isinstance(distribution, d.CategoricalDistribution):
            grid[key] = list(distribution.choices)
        elif distribution.step is not None and not distribution.log:
            count = round((distribution.high - distribution.low) / distribution.step) + 1
            grid[key] = [distribution.low + i * distribution.step for i in range(count)]
        else:
            raise ValueError(f"hydra/sweeper/sampler=grid: {key} is an interval; give it as choice(...) or range(...)")
    return grid


def _grid_size(space: dict[str, Any]) -> int:
    return math.prod(len(values) for values in _grid(space).values())


def _report(study: Any, sweep_dir: Path) -> None:
    """The study's trials by state and its best trial, in the log and in the sweep's
    ``optimization_results.yaml`` (hydra-optuna-sweeper's file: name, best_params, best_value)."""
    from optuna.trial import TrialState

    counts = {state.name.lower(): len(study.get_trials(deepcopy=False, states=(state,))) for state in TrialState}
    summary = ", ".join(f"{count} {state}" for state, count in counts.items() if count)
    if not counts["complete"]:
        log.info("Study %s: %s; no trial completed", study.study_name, summary)
        return
    best = study.best_trial
    log.info("Study %s: %s; best trial %d: %.6g, %s", study.study_name, summary, best.number, best.value, best.params)
    results = {"name": "optuna", "study_name": study.study_name, "best_trial": best.number}
    OmegaConf.save({**results, "best_params": best.params, "best_value": best.value}, sweep_dir / RESULTS_FILE)
