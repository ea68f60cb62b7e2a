"""Runs side by side, in one figure: the optimized metric against each hyperparameter the runs vary (a
log axis where its values span a decade or more, categories where they are not numbers), and the
validation curves of all runs overlaid. A sweep ends with it (``comparison.png`` beside ``summary.csv``);
``python compare.py <run or sweep folders...>`` draws it for any runs.

The curves are read from what the run's logger left in its folder: TensorBoard's event files
(``logger=tensorboard``, the default) or ``csv/metrics.csv`` (``logger=csv``); a run logged elsewhere
(MLflow, W&B, none) has its point in the figure but no curve.
"""

import csv
import io
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import yaml
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from mnistlab.runtime.run import atomic, run_folder
from mnistlab.runtime.run.failures import InputError
from mnistlab.runtime.run.run_folder import FIGURE_FILE
from mnistlab.sweeps.jobs import read_jobs, varied

LEGEND_AT_MOST = 12  # runs: more than this many, and the curves go unlabelled
MARKED_AT_MOST = 8  # values of a key: up to this many, each is a tick, written as given (an Optuna study's are not)


class ComparedRun(Protocol):  # a job of the sweep's table (summary.Job)
    folder: Path
    params: dict[str, str]
    metric: float | None


def compare(
    folders: Sequence[Path], metric: str | None = None, curve: str | None = None, out: Path | None = None
) -> Path:
    """compare.py: the figure of the runs in ``folders`` (run or sweep folders); where it was saved."""
    for folder in folders:
        if not folder.is_dir():
            raise InputError(
                f"{folder}: no such folder; name run or sweep folders, e.g. outputs/train/multiruns/<date>_<time>"
            )
        if not (folder / run_folder.SAVED).is_dir() and not any(folder.glob(f"*/{run_folder.SAVED_OVERRIDES}")):
            raise InputError(f"{folder} is neither a run's folder nor a sweep's (no .hydra/ in it or in its jobs)")
    path = out or (folders[0] / FIGURE_FILE if len(folders) == 1 else Path(FIGURE_FILE))
    _check_writable(path)
    metric = metric or _optimized_metric(folders[0])
    runs = [run for folder in folders for run in read_jobs(folder, metric)]
    if all(run.metric is None for run in runs):
        raise InputError(f"none of the {len(runs)} runs has {metric} in its metrics.json: name another with --metric")
    try:
        return save(path, runs, varied(runs), metric, curve)
    except OSError as err:  # the disk filled, the folder went away while it was drawn
        raise InputError(f"cannot write {path}: {err.strerror or err}") from None


def _check_writable(path: Path) -> None:
    """Refuse, before any work, a figure that could not be written."""
    if path.is_dir():
        raise InputError(f"--out {path} is a folder: name the PNG to write, e.g. --out {path / FIGURE_FILE}")
    if not path.parent.is_dir():
        raise InputError(f"--out {path}: no folder {path.parent} to write it in")
    if not os.access(path.parent, os.W_OK):
        raise InputError(f"--out {path}: the folder {path.parent} cannot be written (its permissions)")


def _optimized_metric(folder: Path) -> str:
    """What the runs were optimised for (their config's optimized_metric), read as plain YAML: data. Hydra
    saves it unresolved (``${monitor}_best``)."""
    config = next(iter(sorted(folder.glob(f"**/{run_folder.SAVED_CONFIG}"))), None)
    saved = (yaml.safe_load(config.read_text()) or {}) if config else {}
    try:  # the saved config's references to its own keys: OmegaConf resolves them, as the run did
        found = OmegaConf.select(OmegaConf.create(saved), "optimized_metric") if isinstance(saved, dict) else None
    except OmegaConfBaseException:  # a reference to something else (an environment variable, Hydra's own)
        found = None
    if not isinstance(found, str):
        raise InputError(f"{folder}: no optimized_metric in its {run_folder.SAVED_CONFIG}; name one with --metric")
    return found


def curve_of(metric: str) -> str:
    """The per-epoch curve behind a run's optimized metric: val/acc behind val/acc_best."""
    return metric.removesuffix("_best")


def read_curve(folder: Path, name: str) -> list[tuple[int, float]]:
    """(step, value) of ``name`` as the run's logger wrote it; empty where it wrote none here."""
    if events := sorted((folder / run_folder.TENSORBOARD).glob("events.out.tfevents.*")):
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        points: dict[int, float] = {}
        for path in events:  # a resumed run adds a file: later values of a step win
            scalars = EventAccumulator(str(path), size_guidance={"scalars": 0}).Reload()
            if name in scalars.Tags()["scalars"]:
                points |= {event.step: event.value for event in scalars.Scalars(name)}
        return sorted(points.items())
    if (table := folder / "csv" / "metrics.csv").is_file():
        with table.open(newline="") as file:
            return [(int(row["step"]), float(row[name])) for row in csv.DictReader(file) if row.get(name)]
    return []


def draw(runs: Sequence[ComparedRun], varied: list[str], metric: str, curve: str | None = None) -> Figure:
    """One panel per varied key (``metric`` against its values), then the runs' ``curve`` overlaid; each
    run has one colour in every panel."""
    curve = curve or curve_of(metric)
    panels = len(varied) + 1
    columns = min(panels, 3)
    rows = math.ceil(panels / columns)
    # A figure of its own, not pyplot's: no backend to choose, nothing global (as runtime/reporting/pictures.py)
    figure = Figure(figsize=(4.2 * columns, 3.4 * rows), layout="tight")
    axes = figure.subplots(rows, columns, squeeze=False)
    colours = [f"C{i % 10}" for i in range(len(runs))]  # matplotlib's default cycle
    for key, ax in zip(varied, axes.flat, strict=False):
        points = [(run.params.get(key, ""), run.metric, c) for run, c in zip(runs, colours, strict=True)]
        _against(ax, [(value, y, c) for value, y, c in points if y is not None], key, metric)
    _curves(axes.flat[len(varied)], runs, colours, _labels(runs, varied), curve)
    for ax in axes.flat[panels:]:
        ax.set_visible(False)
    return figure


def save(path: Path, runs: Sequence[ComparedRun], varied: list[str], metric: str, curve: str | None = None) -> Path:
    png = io.BytesIO()
    # bbox_inches: the legend beside the curves is drawn in full
    draw(runs, varied, metric, curve).savefig(png, format="png", dpi=110, bbox_inches="tight")
    atomic.write_bytes(path, png.getvalue())
    return path


def _against(ax: Axes, points: list[tuple[str, float, str]], key: str, metric: str) -> None:
    numbers = [_number(value) for value, _, _ in points]
    if points and all(x is not None for x in numbers):
        xs = [x for x in numbers if x is not None]
        if min(xs) > 0 and max(xs) / min(xs) >= 10:  # a decade or more: a learning rate, a weight decay
            ax.set_xscale("log")
        if len(ticks := dict(zip(xs, (value for value, _, _ in points), strict=True))) <= MARKED_AT_MOST:
            ax.set_xticks(list(ticks), list(ticks.values()))  # a sweep's few values, as given
            ax.xaxis.set_minor_locator(NullLocator())
    else:  # not all numbers: one category per value, in the order first seen
        categories = list(dict.fromkeys(value for value, _, _ in points))
        xs = [float(categories.index(value)) for value, _, _ in points]
        ax.set_xticks(range(len(categories)), categories, rotation=30, ha="right")
    ax.scatter(xs, [y for _, y, _ in points], c=[c for _, _, c in points], s=30, alpha=0.85)
    ax.set(xlabel=key, ylabel=metric, title=f"{metric} by {key}")
    ax.grid(alpha=0.3)


def _curves(ax: Axes, runs: Sequence[ComparedRun], colours: list[str], labels: list[str], curve: str) -> None:
    drawn = 0
    for run, colour, label in zip(runs, colours, labels, strict=True):
        if points := read_curve(run.folder, curve):
            ax.plot(*zip(*points, strict=True), marker=".", color=colour, label=label)
            drawn += 1
    ax.set(xlabel="step", ylabel=curve, title=f"{curve} of {drawn} of {len(runs)} runs")
    if not drawn:
        note = "no curves: logged by neither\nTensorBoard nor the CSV logger"
        ax.text(0.5, 0.5, note, ha="center", va="center", transform=ax.transAxes)
    elif drawn <= LEGEND_AT_MOST:
        ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.02, 1), frameon=False)
    ax.grid(alpha=0.3)


def _labels(runs: Sequence[ComparedRun], varied: list[str]) -> list[str]:
    """Each run by its varied values, under the keys' last parts where those tell them apart (lr=0.001)."""
    short = [key.rpartition(".")[2] for key in varied]
    names = short if len(set(short)) == len(short) else varied
    return [
        " ".join(f"{n}={run.params.get(k, '')}" for n, k in zip(names, varied, strict=True)) or run.folder.name
        for run in runs
    ]


def _number(value: str) -> float | None:
    try:
        return float(value)
    except ValueError:
        return None
