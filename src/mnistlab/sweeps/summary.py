"""At the end of a sweep: a table of its jobs (what each varied, its metric, how it ended), the best
job's folder, the same table as ``summary.csv`` in the sweep folder (and, where seeds or folds varied,
their groups: ``groups.py``); then one line per failed job and a non-zero exit when any failed.

Read back from the job folders (``.hydra/overrides.yaml``, the ``metrics.json`` rank 0 writes,
``failure.txt``, an Optuna trial's ``pruned.txt``): the one place every launcher (basic, joblib workers, SLURM jobs) shares with the
sweep's process. Hydra hands a sweep's results to its callbacks for none of them.
"""

import csv
import io
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from hydra.experimental.callback import Callback
from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from mnistlab.runtime import atomic
from mnistlab.runtime.failures import FAILURE_FILE
from mnistlab.runtime.launch import METRICS_FILE
from mnistlab.sweeps import groups

SUMMARY_FILE = "summary.csv"
PRUNED_FILE = "pruned.txt"  # in the folder of a job an Optuna pruner stopped (sweeps/pruning.py writes it)


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


class SweepSummary(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep = Path(config.hydra.sweep.dir)
        jobs = sorted(_read_jobs(sweep, config.optimized_metric), key=lambda job: _number(job.folder.name))
        if not jobs:
            return
        keys = dict.fromkeys(key for job in jobs for key in job.params)  # in command-line order
        varied = [key for key in keys if len({job.params.get(key) for job in jobs}) > 1]
        _write_csv(sweep / SUMMARY_FILE, jobs, varied, config.optimized_metric)
        _print_table(jobs, varied, config.optimized_metric)
        if grouped := groups.of(jobs, varied, maximize=config.optimized_direction == "maximize"):
            groups.show(*grouped, config.optimized_metric)
            groups.write_csv(sweep / groups.GROUPS_FILE, *grouped, config.optimized_metric)
        finished = [(job, job.metric) for job in jobs if job.metric is not None]
        if finished:
            pick = max if config.optimized_direction == "maximize" else min
            best, value = pick(finished, key=lambda pair: pair[1])
            print(f"Best: job {best.folder.name}, {config.optimized_metric}={value:.6g}: {best.folder}")
        _report_failures(sweep, jobs, varied)


def _read_jobs(sweep: Path, metric: str) -> list[Job]:
    jobs = []
    for overrides in sweep.rglob(".hydra/overrides.yaml"):
        folder = overrides.parent.parent
        # Plain YAML: OmegaConf would resolve the interpolations in a job's overrides while they are read.
        params = dict(str(o).split("=", 1) for o in _read(overrides, _yaml) or [] if "=" in str(o))
        value = (_read(folder / METRICS_FILE, lambda p: json.loads(p.read_text())) or {}).get(metric)
        reason = _read(folder / FAILURE_FILE, lambda p: p.read_text().partition("\n")[0])
        number = value if isinstance(value, int | float) else None
        jobs.append(Job(folder, params, number, reason, (folder / PRUNED_FILE).is_file()))
    return jobs


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


def _write_csv(path: Path, jobs: list[Job], varied: list[str], metric: str) -> None:
    text = io.StringIO()
    out = csv.writer(text)
    out.writerow(["job", *varied, metric, "status", "folder"])
    for job in jobs:
        value = "" if job.metric is None else f"{job.metric:.6g}"
        out.writerow([job.folder.name, *(job.params.get(k, "") for k in varied), value, job.status, job.folder])
    atomic.write_text(path, text.getvalue())


def _print_table(jobs: list[Job], varied: list[str], metric: str) -> None:
    table = Table(title=f"Sweep: {len(jobs)} jobs", title_justify="left")
    for column in ["job", *varied, metric, "status"]:
        table.add_column(column, justify="right" if column in ("job", metric) else "left")
    for job in jobs:
        value = "" if job.metric is None else f"{job.metric:.6g}"
        table.add_row(job.folder.name, *(job.params.get(k, "") for k in varied), value, job.status)
    Console(soft_wrap=True).print(table)


def _report_failures(sweep: Path, jobs: list[Job], varied: list[str]) -> None:
    failed = [job for job in jobs if job.failure]
    if not failed:
        return
    lines = [f"{len(failed)} of {len(jobs)} jobs of the sweep in {sweep} failed:"]
    for job in failed:
        own = " ".join(f"{key}={job.params[key]}" for key in varied if key in job.params)
        lines.append(f"  {job.folder.relative_to(sweep)} ({own}): {job.failure}")
    print("\n".join(lines), file=sys.stderr)
    raise SystemExit(1)
