"""At the end of a sweep: a table of its jobs (what each varied, its metric, how it ended), the best
job's folder, the same table as ``summary.csv`` in the sweep folder; then one line per failed job and
a non-zero exit when any failed.

Read back from the job folders (``.hydra/overrides.yaml``, the ``metrics.json`` rank 0 writes,
``failure.txt``): the one place every launcher (basic, joblib workers, SLURM jobs) shares with the
sweep's process. Hydra hands a sweep's results to its callbacks for none of them.
"""

import csv
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from mnistlab.failures import FAILURE_FILE
from mnistlab.launch import METRICS_FILE

SUMMARY_FILE = "summary.csv"


@dataclass
class Job:
    folder: Path
    params: dict[str, str]  # key=value overrides of this job
    metric: float | None  # its optimized_metric; None when it has none
    failure: str | None  # the first line of failure.txt

    @property
    def status(self) -> str:
        return "failed" if self.failure else "ok" if self.metric is not None else "no result"


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
        finished = [job for job in jobs if job.metric is not None]
        if finished:
            pick = max if config.optimized_direction == "maximize" else min
            best = pick(finished, key=lambda job: job.metric)
            print(f"Best: job {best.folder.name}, {config.optimized_metric}={best.metric:.6g}: {best.folder}")
        _report_failures(sweep, jobs, varied)


def _read_jobs(sweep: Path, metric: str) -> list[Job]:
    jobs = []
    for overrides in sweep.rglob(".hydra/overrides.yaml"):
        folder = overrides.parent.parent
        params = dict(o.split("=", 1) for o in OmegaConf.load(overrides) if "=" in o)
        metrics = folder / METRICS_FILE
        value = json.loads(metrics.read_text()).get(metric) if metrics.is_file() else None
        failure = folder / FAILURE_FILE
        reason = failure.read_text().partition("\n")[0] if failure.is_file() else None
        jobs.append(Job(folder, params, value, reason))
    return jobs


def _number(name: str) -> tuple[int, str]:
    return (int(name), "") if name.isdigit() else (sys.maxsize, name)


def _write_csv(path: Path, jobs: list[Job], varied: list[str], metric: str) -> None:
    with path.open("w", newline="") as file:
        out = csv.writer(file)
        out.writerow(["job", *varied, metric, "status", "folder"])
        for job in jobs:
            value = "" if job.metric is None else f"{job.metric:.6g}"
            out.writerow([job.folder.name, *(job.params.get(k, "") for k in varied), value, job.status, job.folder])


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
