"""At the end of a sweep: a table of its jobs (what each varied, its metric, how it ended), the best
job's folder, the same table as ``summary.csv`` in the sweep folder (and, where seeds or folds varied,
their groups: ``groups.py``), a figure comparing the jobs beside it (``comparison.py``); then one line
per failed job and a non-zero exit when any failed. The jobs are read back from their folders (``jobs.py``).
"""

import csv
import io
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig
from rich.console import Console
from rich.table import Table

from mnistlab.runtime.run import atomic
from mnistlab.runtime.run.run_folder import FIGURE_FILE, GROUPS_FILE, SUMMARY_FILE
from mnistlab.sweeps import groups
from mnistlab.sweeps.jobs import Job, read_jobs, varied


class SweepSummary(Callback):
    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep = Path(config.hydra.sweep.dir)
        jobs = read_jobs(sweep, config.optimized_metric)
        if not jobs:
            return
        keys = varied(jobs)
        _write_csv(sweep / SUMMARY_FILE, jobs, keys, config.optimized_metric)
        _print_table(jobs, keys, config.optimized_metric)
        maximize = config.get("mode", "max") == "max"  # the run config's: which value of monitor is better
        if grouped := groups.of(jobs, keys, maximize=maximize):
            groups.show(*grouped, config.optimized_metric)
            groups.write_csv(sweep / GROUPS_FILE, *grouped, config.optimized_metric)
        finished = [(job, job.metric) for job in jobs if job.metric is not None]
        if finished:
            pick = max if maximize else min
            best, value = pick(finished, key=lambda pair: pair[1])
            print(f"Best: job {best.folder.name}, {config.optimized_metric}={value:.6g}: {best.folder}")
        # Here, not at the top: this callback is loaded by every run, and matplotlib (with what Lightning
        # and torchmetrics then import beside it) added 0.3 s to train.py's start-up (measured, -X importtime).
        from mnistlab.sweeps import comparison

        comparison.save(sweep / FIGURE_FILE, jobs, keys, config.optimized_metric)
        _report_failures(sweep, jobs, keys)


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
