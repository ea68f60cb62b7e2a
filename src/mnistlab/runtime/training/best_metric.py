"""``<monitor>_best``: the best value of the monitored metric over a run's validations, for any module.

The monitored metric and its mode are set once (``monitor`` and ``mode`` in ``conf/run.yaml``); the
checkpoint callback, early stopping, this callback, pruning and the sweep table follow them. This
callback turns them into ``val/acc_best`` (max) or ``val/loss_best`` (min): the value ``train.py``
returns to a sweeper, logged beside the metric itself, and kept in checkpoints so that a resumed run
goes on from its best so far.

Checkpoints also keep the metrics of the last validation (with the best so far): a run continued after
its training had ended (its test, or its ``metrics.json``, cut short by a kill) trains nothing more, and
without them would report its test metrics alone, and no ``<monitor>_best`` to rank it by in a sweep.
"""

import logging
import math
from typing import Any, Literal

import lightning as L
import torch

log = logging.getLogger(__name__)


class BestMetric(L.Callback):
    def __init__(self, monitor: str, mode: Literal["min", "max"]) -> None:
        self.monitor, self.mode = monitor, mode
        self.best: float | None = None
        self.logged: dict[str, float] = {}  # the last epoch's metrics, with the best so far
        self._warned = False

    @property
    def name(self) -> str:
        return f"{self.monitor}_best"

    @property
    def state_key(self) -> str:
        return self._generate_state_key(monitor=self.monitor, mode=self.mode)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """After the module logged the epoch's metrics (its hooks run after the callbacks' until here), and
        before ModelCheckpoint, which Lightning runs last, and the callbacks listed after this one."""
        if trainer.sanity_checking:  # a few batches before training are no epoch's result
            return
        logged = trainer.callback_metrics.get(self.monitor)
        if logged is None:
            if not self._warned:
                log.warning("monitor=%s was not logged at this validation: %s is not tracked", self.monitor, self.name)
                self._warned = True
            return
        value = float(logged)  # the same on every rank: logged with sync_dist, or a torchmetrics value
        if not math.isnan(value) and (
            self.best is None or (value > self.best if self.mode == "max" else value < self.best)
        ):
            self.best = value
        if self.best is None:
            return
        trainer.callback_metrics[self.name] = torch.tensor(self.best)  # what train(cfg) returns, and callbacks see
        self._remember(trainer)
        for logger in trainer.loggers:  # each logs on global rank 0 alone
            logger.log_metrics({self.name: self.best}, step=trainer.global_step)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The epoch's training metrics too (train/loss): aggregated after its validation, before the
        checkpoint callbacks that save at the epoch's end (listed after this one)."""
        if self.best is not None:
            self._remember(trainer)

    def _remember(self, trainer: L.Trainer) -> None:
        self.logged = {name: float(value) for name, value in trainer.callback_metrics.items() if value.numel() == 1}

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """What this fit did not log itself (it restored a run whose training had ended): the last
        validation's metrics, as the checkpoint it restored kept them."""
        for name, value in self.logged.items():
            trainer.callback_metrics.setdefault(name, torch.tensor(value))

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "logged": self.logged}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best = state_dict["best"]
        self.logged = state_dict.get("logged", {})  # a checkpoint of an earlier version: none
