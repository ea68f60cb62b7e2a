"""The ``LightningModule``: loss, metrics and optimisation around an injected network."""

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import cast

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities.types import OptimizerConfig, OptimizerLRSchedulerConfig
from torch import Tensor, nn
from torchmetrics import MeanMetric, Metric, SumMetric
from torchmetrics.classification import MulticlassAccuracy

log = logging.getLogger(__name__)
# torch's default ignore_index: rows labelled so count in no loss and no metric. The in-memory loaders pad
# the last global batch with them (every rank steps on the same shape; no sample is counted twice).
IGNORE = -100
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LRScheduler]


class Classifier(L.LightningModule):
    """Cross-entropy classification. Metrics are torchmetrics objects: they accumulate on each rank
    and reduce across ranks once per epoch, when its value is computed and logged. The machinery
    around it (conf/callbacks/) tracks the best of the monitored metric, draws the test's pictures from
    ``test_step``'s logits, and keeps a resumed cosine schedule on its configured horizon."""

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
        # weights_only=True; the network's and optimizer's settings travel in the run's config, which the
        # machinery adds to every checkpoint.
        # logger=False: the loggers record the hyperparameters runs are compared by (conf/train.yaml's hparams)
        self.save_hyperparameters(ignore=["net", "optimizer", "scheduler"], logger=False)
        self.net = net
        self.make_optimizer, self.make_scheduler = optimizer, scheduler
        # The epoch's train loss as two plain sums (loss, real rows), reduced over ranks once per epoch.
        # Not torchmetrics: MeanMetric's NaN check syncs a GPU with the host at every step (and with
        # the check off, torchmetrics 1.9 ignores the weights), and two SumMetric updates cost 35 us
        # a step here, 4% of this model's whole step on a CPU, against 5 us for two in-place additions.
        # Not buffers either: DDP would overwrite them with rank 0's at every step.
        self.train_sums = torch.zeros(()), torch.zeros((), dtype=torch.long)  # on_train_start: on the device
        self.val_metrics, self.test_metrics = self._eval_metrics(num_classes), self._eval_metrics(num_classes)

    @staticmethod
    def _eval_metrics(num_classes: int) -> nn.ModuleDict:
        """Per-split metrics, logged as <split>/<name>; ``samples`` counts the images evaluated."""
        accuracy = MulticlassAccuracy(num_classes, average="micro", ignore_index=IGNORE, validate_args=False)
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
        total = F.cross_entropy(self.net(x), y, reduction="sum")  # padding rows (IGNORE) count 0
        loss_sum, rows = self.train_sums
        loss_sum.add_(total.detach())
        rows.add_((y != IGNORE).sum())
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
        real = y != IGNORE
        metrics["loss"].update(F.cross_entropy(logits, y, reduction="none"), weight=real)
        metrics["acc"].update(logits, y)
        metrics["samples"].update(real.sum())
        return logits

    def on_train_start(self) -> None:  # also when resuming mid-epoch, unlike on_train_epoch_start
        self.train_sums = torch.zeros((), device=self.device), torch.zeros((), dtype=torch.long, device=self.device)

    def on_train_epoch_end(self) -> None:
        loss_sum, rows = (self.trainer.strategy.reduce(s, reduce_op="sum") for s in self.train_sums)
        self.log("train/loss", loss_sum / rows, sync_dist=True)  # summed over ranks already: global
        for s in self.train_sums:
            s.zero_()

    def on_validation_epoch_end(self) -> None:
        self._log_epoch("val", self._metrics("val"))

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
        return {
            "optimizer": optimizer,
            "lr_scheduler": {
                "scheduler": scheduler,
                "interval": self.hparams["scheduler_interval"],
                "monitor": "val/loss",
            },
        }
