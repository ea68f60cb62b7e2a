"""A callback for ``benchmarks/speed.py``: the seconds of each training epoch (validation included),
timed inside the process and written as a JSON list to ``path`` when fit ends (by global rank 0).
Every Lightning row of the benchmark carries it, bare Lightning's too, so its own small dispatch cost
is in all of them alike."""

import json
import time

import lightning as L


class EpochTimer(L.Callback):
    def __init__(self, path: str) -> None:
        self.path, self.seconds, self._start = path, [], 0.0

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start = time.perf_counter()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.seconds.append(time.perf_counter() - self._start)  # validation ran inside the epoch

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            with open(self.path, "w") as file:
                json.dump(self.seconds, file)
