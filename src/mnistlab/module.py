"""The ``LightningModule``: loss, metrics and optimisation around an injected network."""

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities.types import OptimizerConfig, OptimizerLRSchedulerConfig
from torch import Tensor, nn
from torch.optim.lr_scheduler import CosineAnnealingLR
from torchmetrics import MaxMetric, MeanMetric, Metric, SumMetric
from torchmetrics.classification import MulticlassAccuracy

from mnistlab.runtime.batches import PAD_LABEL

log = logging.getLogger(__name__)
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LRScheduler]


class Classifier(L.LightningModule):
    """Cross-entropy classification. Metrics are torchmetrics objects: they accumulate on each rank
    and reduce across ranks once per epoch, when its value is computed and logged."""

    def __init__(
        self,
        net: nn.Module,
        optimizer: OptimizerFactory,
        scheduler: SchedulerFactory | None = None,
        scheduler_interval: str = "epoch",
        num_classes: int = 10,
        compile: bool = False,
    ) -> None:
        super().__init__()
        # Only plain values go into the checkpoint's hyper-parameters, so it loads with
        # weights_only=True; the network's and optimizer's settings travel in ``config``.
        # logger=False: the loggers record the hyperparameters runs are compared by (conf/train.yaml's hparams)
        self.save_hyperparameters(ignore=["net", "optimizer", "scheduler"], logger=False)
        self.net = net
        self.make_optimizer, self.make_scheduler = optimizer, scheduler
        self.config: dict[str, Any] | None = None  # the run's resolved config, stored in checkpoints
        # The epoch's train loss as two plain sums (loss, real rows), reduced over ranks once per epoch.
        # Not torchmetrics: MeanMetric's NaN check syncs a GPU with the host at every step (and with
        # the check off, torchmetrics 1.9 ignores the weights), and two SumMetric updates cost 35 us
        # a step here, 4% of this model's whole step on a CPU, against 5 us for two in-place additions.
        # Not buffers either: DDP would overwrite them with rank 0's at every step.
        self.train_sums = torch.zeros(()), torch.zeros((), dtype=torch.long)  # on_train_start: on the device
        self.planned_horizon: int | None = None  # a cosine schedule's T_max as configured (_replan_schedule)
        self.val_metrics, self.test_metrics = self._eval_metrics(num_classes), self._eval_metrics(num_classes)
        self.val_acc_best = MaxMetric()
        self.val_acc_best.persistent(True)  # in checkpoints: a resumed run (a requeued job) keeps its best

    @staticmethod
    def _eval_metrics(num_classes: int) -> nn.ModuleDict:
        """Per-split metrics, logged as <split>/<name>; ``samples`` counts the images evaluated."""
        accuracy = MulticlassAccuracy(num_classes, average="micro", ignore_index=PAD_LABEL, validate_args=False)
        return nn.ModuleDict({"loss": MeanMetric(), "acc": accuracy, "samples": SumMetric()})

    def setup(self, stage: str) -> None:
        # strategy=ddp_spawn on CPU unpickles this module into every rank with its tensors in shared
        # memory: the ranks would add into one set of metric states (test/samples counted twice over).
        # reset() gives each process fresh ones; the weights are copied by DDP's own broadcast.
        for metric in (*self._metrics("val").values(), *self._metrics("test").values()):
            metric.reset()
        if self.hparams["compile"]:
            self.net.compile()  # in place: the state_dict keys stay those of the plain network

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        total = F.cross_entropy(self.net(x), y, reduction="sum")  # padding rows (PAD_LABEL) count 0
        loss_sum, rows = self.train_sums
        loss_sum.add_(total.detach())
        rows.add_((y != PAD_LABEL).sum())
        # The sum over real rows divided by the full batch: every sample of an epoch weighs the same,
        # and the average over ranks that DDP takes equals one process's loss on the global batch.
        loss = total / y.numel()
        # self.log costs about 0.5 ms a call (benchmarks/speed.py), as much as the step's own compute
        # on a CPU: log this rank's step loss only at the steps the logger writes. No cross-rank sync.
        # (log_every_n_steps is set on the Trainer by Lightning's logger connector, not declared by it)
        if (self.global_step + 1) % self.trainer.log_every_n_steps == 0:  # type: ignore[attr-defined]
            self.log("train/batch_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, self._metrics("val"))

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self._evaluate(batch, self._metrics("test"))  # the logits, for callbacks (pictures.TestPictures)

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self(batch[0]).argmax(dim=1)

    def _metrics(self, split: str) -> Mapping[str, Metric]:
        """The split's metrics (``nn.ModuleDict`` registers them as submodules, and types them as plain modules)."""
        return cast(Mapping[str, Metric], self.val_metrics if split == "val" else self.test_metrics)

    def _evaluate(self, batch: tuple[Tensor, Tensor], metrics: Mapping[str, Metric]) -> Tensor:
        x, y = batch
        logits = self.net(x)
        real = y != PAD_LABEL
        metrics["loss"].update(F.cross_entropy(logits, y, reduction="none"), weight=real)
        metrics["acc"].update(logits, y)
        metrics["samples"].update(real.sum())
        return logits

    def on_train_start(self) -> None:  # also when resuming mid-epoch, unlike on_train_epoch_start
        self.train_sums = torch.zeros((), device=self.device), torch.zeros((), dtype=torch.long, device=self.device)
        self._replan_schedule()

    def _replan_schedule(self) -> None:
        """Keep a resumed cosine schedule on the horizon configured now.

        A checkpoint restores the schedule as it was planned: resumed with more epochs than it was
        started with (``resume=<run> trainer.max_epochs=20``), the rate would reach its minimum at the
        old end and rise again (1 epoch extended to 2: 0.911 test accuracy, where 2 planned epochs
        reach 0.938). So the configured plan wins: the rate becomes what it would be at this epoch
        had the run been planned for the new horizon from its start, and follows that plan on.
        """
        for config in self.trainer.lr_scheduler_configs:
            scheduler, planned = config.scheduler, self.planned_horizon
            if not isinstance(scheduler, CosineAnnealingLR) or planned in (None, scheduler.T_max):
                continue
            log.info(
                "The schedule restored from the checkpoint ended at %s %d; re-planned for %d, from %s %d on",
                *(config.interval, scheduler.T_max, planned, config.interval, scheduler.last_epoch),
            )
            scheduler.T_max = planned
            rates = scheduler._get_closed_form_lr()  # torch's own formula of the rate at last_epoch
            for group, rate in zip(scheduler.optimizer.param_groups, rates, strict=True):
                group["lr"] = rate
            scheduler._last_lr = rates

    def on_train_epoch_end(self) -> None:
        loss_sum, rows = (self.trainer.strategy.reduce(s, reduce_op="sum") for s in self.train_sums)
        self.log("train/loss", loss_sum / rows, sync_dist=True)  # summed over ranks already: global
        for s in self.train_sums:
            s.zero_()

    def on_validation_epoch_end(self) -> None:
        accuracy = self._metrics("val")["acc"].compute()
        self._log_epoch("val", self._metrics("val"))
        if not self.trainer.sanity_checking:  # a few batches before training are no epoch's result
            self.val_acc_best.update(accuracy)
            self.log("val/acc_best", self.val_acc_best.compute(), sync_dist=True)  # over all epochs so far

    def on_test_epoch_end(self) -> None:
        self._log_epoch("test", self._metrics("test"))

    def _log_epoch(self, split: str, metrics: Mapping[str, Metric]) -> None:
        """Log the epoch's values as <split>/<name>, reduced over all ranks, and start afresh."""
        # compute() syncs the states of every rank; sync_dist only tells Lightning they are global.
        values = {f"{split}/{name}": metric.compute() for name, metric in metrics.items()}
        self.log_dict(values, prog_bar=True, sync_dist=True)
        for metric in metrics.values():
            metric.reset()

    def configure_optimizers(self) -> OptimizerConfig | OptimizerLRSchedulerConfig:
        optimizer = self.make_optimizer(self.parameters())
        if self.make_scheduler is None:
            return {"optimizer": optimizer}
        scheduler = self.make_scheduler(optimizer)
        # As configured; a checkpoint may restore another. Not on the scheduler: its state_dict holds
        # every attribute, so a checkpoint would restore this one too.
        self.planned_horizon = getattr(scheduler, "T_max", None)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {
                "scheduler": scheduler,
                "interval": self.hparams["scheduler_interval"],
                "monitor": "val/loss",
            },
        }

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.config is not None:
            checkpoint["config"] = self.config
