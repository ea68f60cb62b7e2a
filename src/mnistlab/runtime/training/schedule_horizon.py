"""A resumed cosine schedule keeps the horizon configured now, not the one it was started with.

A checkpoint restores a learning-rate schedule as it was planned: resumed with more epochs than it was
started with (``resume=<run> trainer.max_epochs=20``), a cosine rate would reach its minimum at the old
end and rise again (1 epoch extended to 2: 0.911 test accuracy, where 2 planned epochs reach 0.938).
So the configured plan wins: the rate becomes what it would be at this epoch had the run been planned
for the new horizon from its start, and follows that plan on. Any module's ``CosineAnnealingLR``.
"""

import logging

import lightning as L
from torch.optim.lr_scheduler import CosineAnnealingLR

from mnistlab.runtime.run import internals

log = logging.getLogger(__name__)


class ScheduleHorizon(L.Callback):
    def __init__(self) -> None:
        self._planned: list[int | None] = []

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """After configure_optimizers, before a checkpoint restores the schedulers: the plan as configured."""
        self._planned = [getattr(config.scheduler, "T_max", None) for config in trainer.lr_scheduler_configs]

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for config, planned in zip(trainer.lr_scheduler_configs, self._planned, strict=False):
            scheduler = config.scheduler
            if not isinstance(scheduler, CosineAnnealingLR) or planned in (None, scheduler.T_max):
                continue
            log.info(
                "The schedule restored from the checkpoint ended at %s %d; re-planned for %d, from %s %d on",
                *(config.interval, scheduler.T_max, planned, config.interval, scheduler.last_epoch),
            )
            scheduler.T_max = planned
            rates = internals.rates_at_last_step(scheduler)  # torch's own formula of the rate at last_epoch
            for group, rate in zip(scheduler.optimizer.param_groups, rates, strict=True):
                group["lr"] = rate
