# Part of the MNIST example: a project generated without it has no such file.
"""A callback for ``benchmarks/speed.py``: the seconds of each training epoch, from its start to the
next one's (to the end of training for the last), timed inside the process and written as a JSON list
to ``path`` when fit ends (by global rank 0). Start to start holds all of an epoch's work: validation,
checkpoint writes, the module's and the loggers' epoch-end work that runs after ``on_train_epoch_end``
callbacks. Every Lightning row of the benchmark carries it, bare Lightning's too, so its own small
dispatch cost is in all of them alike."""

import json
import time

import lightning as L


class EpochTimer(L.Callback):
    def __init__(self, path: str) -> None:
        self.path, self.starts = path, []

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.starts.append(time.perf_counter())

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.starts.append(time.perf_counter())  # after the last epoch's checkpoints and logging

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            seconds = [end - start for start, end in zip(self.starts, self.starts[1:], strict=False)]
            with open(self.path, "w") as file:
                json.dump(seconds, file)
