# Part of the MNIST example: a project generated without it has no such file.
"""What each part of the default config costs a training step: ``speed.py --costs``.

The default ``train.py`` runs under Lightning's ``SimpleProfiler`` (``debug=profiler``), which times
every hook call of every callback and of the module; the ``HookTimes`` callback below adds the
logger's calls and writes the totals of the steady-state epochs (the second on) when training ends.
Each callback's cost is the time its hooks took, epoch-end work (checkpoint writes, metric
reduction) spread over the epoch's steps. Timed inside one process, these are steadier than the
difference of two runs' epochs: this machine's epochs vary by 3-10% between runs, 20-80 us a step,
more than most single callbacks cost. The profiler adds about 1 us to each timed call; the rows
count the calls a step, so that can be taken off. The run adds ``callbacks=ema`` (no default): its row,
``EMAWeightAveraging``, is what a moving average of the weights costs a step (its update after each
optimizer step, its swaps around each validation)."""

import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from timing import EPOCHS, ROOT, wall


class HookTimes(L.Callback):
    """Seconds and calls per profiled action during epochs 2..N, written as JSON to ``path``."""

    def __init__(self, path: str) -> None:
        self.path, self.start, self.logged = path, {}, defaultdict(list)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for logger in trainer.loggers:  # the loggers' own calls, which the profiler does not time
            for name in ("log_metrics", "save"):
                setattr(logger, name, self._timed(f"[Logger]{type(logger).__name__}", getattr(logger, name)))

    def _timed(self, label: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.logged[label].append(time.perf_counter() - start)

        return timed

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == 1:  # the first epoch warms up: count from the second on
            durations = trainer.profiler.recorded_durations | self.logged
            self.start = {action: len(times) for action, times in durations.items()}

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        labels = {f"[Callback]{c.state_key}.": _label(c) for c in trainer.callbacks}
        totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
        for action, times in (trainer.profiler.recorded_durations | self.logged).items():
            new = times[self.start.get(action, 0) :]
            owner = next((label for prefix, label in labels.items() if action.startswith(prefix)), _owner(action))
            if owner is None:
                continue
            totals[owner][0] += sum(new)
            totals[owner][1] += len(new)
        steps = len(trainer.profiler.recorded_durations["run_training_batch"]) - self.start["run_training_batch"]
        Path(self.path).write_text(json.dumps({"steps": steps, "totals": totals}))


def _label(callback: L.Callback) -> str:
    name = type(callback).__name__
    return f"{name} ({callback.filename})" if isinstance(callback, ModelCheckpoint) else name


def _owner(action: str) -> str | None:
    """The row of an action that is no callback's: the logger's calls, the module's epoch-end hooks (its
    metrics reduced and logged); None for the loop's, the strategy's and the step's own, which bare
    Lightning pays too and which nest (an epoch holds its steps)."""
    if action.startswith("[Logger]"):
        return action.removeprefix("[Logger]")
    if action.startswith("[LightningModule]") and action.endswith("_epoch_end"):
        return "the module's epoch ends (metrics)"
    return None


def measure(repeats: int, gpu: bool) -> dict[str, object]:
    """Per callback (and the module's hooks, the logger): medians over ``repeats`` runs, in us a step."""
    samples: dict[str, list[float]] = defaultdict(list)
    with tempfile.TemporaryDirectory() as out:
        times = Path(out) / "hook_times.json"
        command = [sys.executable, "train.py", f"trainer.accelerator={'gpu' if gpu else 'cpu'}", "test=false"]
        command += [f"paths.log_dir={out}", f"trainer.max_epochs={EPOCHS}", "debug=profiler", "callbacks=ema"]
        command += ["+callbacks.hook_times._target_=step_costs.HookTimes", f"+callbacks.hook_times.path={times}"]
        for _ in range(repeats):
            wall(["env", f"PYTHONPATH={ROOT / 'benchmarks'}", *command])
            result = json.loads(times.read_text())
            for owner, (seconds, calls) in result["totals"].items():
                samples[owner].append(seconds / result["steps"] * 1e6)
                samples[f"{owner} calls"].append(calls / result["steps"])
    rows = {name: statistics.median(values) for name, values in samples.items()}
    owners = sorted((n for n in rows if not n.endswith(" calls")), key=lambda n: -rows[n])
    return {f"us a step: {n} ({rows[f'{n} calls']:.2f} calls)": round(rows[n], 1) for n in owners}
