"""A sweep's jobs, read back from their folders (``.hydra/overrides.yaml``, the ``metrics.json`` rank 0
writes, ``failure.txt``, an Optuna trial's ``pruned.txt``): the one place every launcher (basic, joblib
workers, SLURM jobs) shares with the sweep's process. Hydra hands a sweep's results to its callbacks for
none of them. The sweep's table (``summary``) and the figure comparing runs (``comparison``) read them here.
"""

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from mnistlab.runtime.run import run_folder
from mnistlab.runtime.run.run_folder import FAILURE_FILE, METRICS_FILE, PRUNED_FILE


@dataclass
class Job:
    folder: Path
    params: dict[str, str]  # key=value overrides of this job
    metric: float | None  # its optimized_metric; None when it has none
    failure: str | None  # the first line of failure.txt
    pruned: bool = False  # stopped early by an Optuna pruner (pruned.txt): no failure

    @property
    def status(self) -> str:
        if self.failure:
            return "failed"
        return "pruned" if self.pruned else "ok" if self.metric is not None else "no result"


def read_jobs(folder: Path, metric: str) -> list[Job]:
    """The runs in ``folder``: a sweep's jobs, in job order, or the one run whose folder it is."""
    jobs = []
    for overrides in folder.rglob(str(run_folder.SAVED_OVERRIDES)):
        job = overrides.parent.parent
        # Plain YAML: OmegaConf would resolve the interpolations in a job's overrides while they are read.
        saved = _read(overrides, _yaml)
        params = dict(str(o).split("=", 1) for o in saved if "=" in str(o)) if isinstance(saved, list) else {}
        metrics = _read(job / METRICS_FILE, lambda p: json.loads(p.read_text()))
        value = metrics.get(metric) if isinstance(metrics, dict) else None  # a list, a number: not a result
        reason = _read(job / FAILURE_FILE, lambda p: p.read_text().partition("\n")[0])
        number = value if isinstance(value, int | float) else None
        jobs.append(Job(job, params, number, reason, (job / PRUNED_FILE).is_file()))
    return sorted(jobs, key=lambda job: _number(job.folder.name))


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _read(path: Path, parse: Callable[[Path], Any]) -> Any:
    """A job's file, or None where it is missing or unreadable (cut short, not what it should be): the
    table shows "no result" for it rather than failing the whole sweep's report."""
    try:
        return parse(path) if path.is_file() else None
    except (OSError, ValueError, yaml.YAMLError):  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None


def _number(name: str) -> tuple[int, str]:
    return (int(name), "") if name.isdigit() else (sys.maxsize, name)


def varied(jobs: list[Job]) -> list[str]:
    """The keys whose values differ between ``jobs`` (absent from some counts), in command-line order."""
    keys = dict.fromkeys(key for job in jobs for key in job.params)
    return [key for key in keys if len({_value(job.params.get(key)) for job in jobs}) > 1]


def _value(given: str | None) -> str | None:
    """An override's value as YAML reads it: a sweep's ``test=False`` and a run's ``test=false`` agree."""
    try:
        return None if given is None else repr(yaml.safe_load(given))
    except yaml.YAMLError:
        return given
