"""The test suite's own small task: the machinery's tests train this, never the example, so that they
pass whatever a user does to ``network.py``, ``module.py``, ``data.py``, ``conf/data/`` and ``conf/model/``.

Selected by config (``tests/conf/``, on Hydra's search path in the tests: ``composing.SUITE``): each class
is what a user might write, with keys of its own. Small RGB images of a few classes, each class a fixed
random pattern under noise, so that metrics move as on real data and a few steps already learn.
"""

import json
from collections.abc import Callable, Iterable

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics import MeanMetric, SumMetric
from torchmetrics.classification import MulticlassAccuracy

from mnistlab.runtime.data.in_memory import InMemoryDataModule

IGNORE = -100  # torch's ignore_index: the rows that pad the in-memory loaders' last global batch


class Patterns(InMemoryDataModule):
    """``classes`` fixed patterns of shape (channels, size, size), each sample one of them under noise;
    the same on every rank and run (seeded), each rank served its shard of every global batch."""

    def __init__(
        self,
        batch_size: int = 32,
        train_size: int = 1024,
        val_size: int = 256,
        test_size: int = 256,
        classes: int = 4,
        channels: int = 3,
        size: int = 8,
        noise: float = 2.0,
        seed: int = 0,
        shuffle_seed: int = 0,
    ) -> None:
        super().__init__()
        self.batch_size, self.shuffle_seed = batch_size, shuffle_seed
        self.sizes = {"train": train_size, "val": val_size, "test": test_size}
        self.classes, self.shape, self.noise, self.seed = classes, (channels, size, size), noise, seed

    def setup(self, stage: str) -> None:
        for split in ("train", "val") if stage in ("fit", "validate") else ("test",):
            if split not in self.loaders:
                self.loaders[split] = self._loader(*self._draw(split), shuffle=split == "train")

    def _draw(self, split: str) -> tuple[Tensor, Tensor]:
        return draw(self.sizes, split, self.classes, self.shape, self.noise, self.seed)


def draw(
    sizes: dict[str, int], split: str, classes: int, shape: tuple[int, ...], noise: float, seed: int
) -> tuple[Tensor, Tensor]:
    """The samples and labels of one split: the same class patterns for every split, each its own noise."""
    patterns = torch.randn(classes, *shape, generator=torch.Generator().manual_seed(seed))
    generator = torch.Generator().manual_seed(seed + 1 + list(sizes).index(split))
    labels = torch.randint(classes, (sizes[split],), generator=generator)
    return patterns[labels] + noise * torch.randn(len(labels), *shape, generator=generator), labels


class LoaderPatterns(L.LightningDataModule):
    """The same samples in plain ``DataLoader``s, as most data modules serve them: ``batch_size`` is each
    process's (Lightning gives each rank a ``DistributedSampler``)."""

    def __init__(
        self,
        batch_size: int = 16,
        train_size: int = 1024,
        val_size: int = 256,
        test_size: int = 256,
        classes: int = 4,
        channels: int = 3,
        size: int = 8,
        noise: float = 3.0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.batch_size, self.sizes = batch_size, {"train": train_size, "val": val_size, "test": test_size}
        self.classes, self.shape, self.noise, self.seed = classes, (channels, size, size), noise, seed

    def _loader(self, split: str) -> DataLoader:
        samples = TensorDataset(*draw(self.sizes, split, self.classes, self.shape, self.noise, self.seed))
        return DataLoader(samples, batch_size=self.batch_size, shuffle=split == "train")

    def train_dataloader(self) -> DataLoader:
        return self._loader("train")

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")


class Net(nn.Module):
    """A small CNN: any input size and channel count."""

    def __init__(self, channels: int = 3, hidden: int = 16, classes: int = 4) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv2d(channels, hidden, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),  # 4 x 4 whatever the input's size
            nn.Flatten(),
            nn.Linear(hidden * 16, classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)


class Classifier(L.LightningModule):
    """Cross-entropy with torchmetrics, as a user writes one: val/ and test/ loss, acc and samples."""

    def __init__(
        self,
        net: nn.Module,
        optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer],
        scheduler: Callable[[torch.optim.Optimizer], torch.optim.lr_scheduler.LRScheduler] | None = None,
        classes: int = 4,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["net", "optimizer", "scheduler"], logger=False)
        self.net, self.make_optimizer, self.make_scheduler = net, optimizer, scheduler
        self.train_loss = MeanMetric()
        self.evaluation = nn.ModuleDict({split: self._metrics(classes) for split in ("val", "test")})

    @staticmethod
    def _metrics(classes: int) -> nn.ModuleDict:
        accuracy = MulticlassAccuracy(classes, average="micro", ignore_index=IGNORE)
        return nn.ModuleDict({"loss": MeanMetric(), "acc": accuracy, "samples": SumMetric()})

    def setup(self, stage: str) -> None:
        for metrics in self.evaluation.values():  # ddp_spawn shares the pickled states: each rank its own
            for metric in metrics.values():
                metric.reset()

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        loss = F.cross_entropy(self.net(x), y, reduction="sum") / y.numel()  # padding counts 0
        self.train_loss.update(loss)
        self.log("train/loss", self.train_loss, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        return self._evaluate(batch, "test")  # the logits: the test pictures read them

    def _evaluate(self, batch: tuple[Tensor, Tensor], split: str) -> Tensor:
        x, y = batch
        logits, real, metrics = self.net(x), y != IGNORE, self.evaluation[split]
        metrics["loss"].update(F.cross_entropy(logits, y, reduction="none"), weight=real)
        metrics["acc"].update(logits, y)
        metrics["samples"].update(real.sum())
        return logits

    def on_validation_epoch_end(self) -> None:
        self._log_epoch("val")

    def on_test_epoch_end(self) -> None:
        self._log_epoch("test")

    def _log_epoch(self, split: str) -> None:
        metrics = self.evaluation[split]
        self.log_dict({f"{split}/{name}": metric.compute() for name, metric in metrics.items()}, sync_dist=True)
        for metric in metrics.values():
            metric.reset()

    def configure_optimizers(self) -> dict:
        optimizer = self.make_optimizer(self.parameters())
        if self.make_scheduler is None:
            return {"optimizer": optimizer}
        return {"optimizer": optimizer, "lr_scheduler": self.make_scheduler(optimizer)}


class SampleRecorder(Classifier):
    """The classifier, fed batches of (inputs, targets, sample ids): each rank appends the ids it trains on, a
    line a step, to ``samples_rank<global rank>.jsonl`` in the run's folder (flushed: a killed run keeps them)."""

    def training_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        x, y, ids = batch
        line = {"epoch": self.current_epoch, "step": self.global_step, "ids": ids.tolist()}
        with open(f"{self.trainer.default_root_dir}/samples_rank{self.global_rank}.jsonl", "a") as file:
            file.write(json.dumps(line) + "\n")
        return super().training_step((x, y), batch_idx)

    def validation_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> None:
        self._evaluate(batch[:2], "val")

    def test_step(self, batch: tuple[Tensor, ...], batch_idx: int) -> Tensor:
        return self._evaluate(batch[:2], "test")
