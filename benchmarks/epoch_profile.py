# Part of the MNIST example: a project generated without it has no such file.
"""A callback for ``benchmarks/speed.py --profile``: cProfile over the training epochs alone (not
imports or start-up), from the first epoch's start to the end of training (so the epochs' end work,
checkpoint writes included, is in it), written to ``path`` when fit ends. It is one more callback in the list, so
Lightning's dispatch of it is in the numbers too (about 2 us a hook call)."""

import cProfile

import lightning as L


class EpochProfile(L.Callback):
    def __init__(self, path: str) -> None:
        self.path, self.profiler = path, cProfile.Profile()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.profiler.enable()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.profiler.disable()

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.profiler.dump_stats(self.path)
