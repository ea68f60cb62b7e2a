"""Repeats of one setting, aggregated: jobs of a sweep that differ only by ``seed`` or by ``data.fold``
(cross-validation) are one group, shown as the mean +- standard deviation of their metric and their
count, best group first: a table after the sweep's own, and ``groups.csv`` beside ``summary.csv``."""

import csv
import io
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from rich.console import Console
from rich.table import Table

from mnistlab.runtime.run import atomic

REPEATS = ("seed", "data.fold")  # what a repetition varies


class Result(Protocol):  # a job of the sweep's table (summary.Job)
    params: dict[str, str]
    metric: float | None


@dataclass
class Group:
    setting: tuple[str, ...]  # the values of the varied keys that are not repeats
    metrics: list[float] = field(default_factory=list)  # of its jobs that have one
    jobs: int = 0

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.metrics) if self.metrics else None

    @property
    def sd(self) -> float | None:  # the sample standard deviation (n - 1); 0 for one job
        return statistics.stdev(self.metrics) if len(self.metrics) > 1 else 0.0 if self.metrics else None


def of(jobs: Iterable[Result], varied: list[str], maximize: bool) -> tuple[list[str], list[Group]] | None:
    """The sweep's groups (the keys that tell them apart, the groups best first), or None when no repeat key varied."""
    if not any(key in REPEATS for key in varied):
        return None
    keys = [key for key in varied if key not in REPEATS]
    found: dict[tuple[str, ...], Group] = {}
    for job in jobs:
        setting = tuple(job.params.get(key, "") for key in keys)
        group = found.setdefault(setting, Group(setting))
        group.jobs += 1
        if job.metric is not None:
            group.metrics.append(job.metric)
    sign = -1 if maximize else 1
    ranked = sorted(found.values(), key=lambda g: (g.mean is None, sign * (g.mean or 0.0)))
    return keys, ranked


def show(keys: list[str], groups: list[Group], metric: str) -> None:
    repeats = ", ".join(REPEATS)
    table = Table(title=f"Over {repeats}: {len(groups)} groups, best first", title_justify="left")
    for column in [*keys, f"{metric} mean", "sd", "n"]:
        table.add_column(column, justify="left" if column in keys else "right")
    for group in groups:
        table.add_row(*group.setting, *_figures(group))
    Console(soft_wrap=True).print(table)


def write_csv(path: Path, keys: list[str], groups: list[Group], metric: str) -> None:
    text = io.StringIO()
    out = csv.writer(text)
    out.writerow([*keys, f"{metric} mean", f"{metric} sd", "n", "jobs"])
    for group in groups:
        mean, sd = ("" if v is None else f"{v:.6g}" for v in (group.mean, group.sd))
        out.writerow([*group.setting, mean, sd, len(group.metrics), group.jobs])
    atomic.write_text(path, text.getvalue())


def _figures(group: Group) -> list[str]:
    """Mean, sd and n of a group, as shown: n counts the jobs with a metric (of ``jobs``)."""
    if group.mean is None or group.sd is None:
        return ["", "", f"0 of {group.jobs}"]
    n = str(len(group.metrics)) if len(group.metrics) == group.jobs else f"{len(group.metrics)} of {group.jobs}"
    return [f"{group.mean:.6g}", f"{group.sd:.6g}", n]
