"""A placeholder for your data: random 28 x 28 images of 10 classes, each class a fixed random pattern
under noise, so that everything else (training, checkpoints, resume, DDP, sweeps) runs and learns
before your data is here. Replace it with your ``LightningDataModule``, and ``conf/data/`` with it (its
keys are checked against your class's arguments). What the rest of the project relies on: ``batch_size``
is the global batch (all devices together), and the loaders shard each batch over the ranks
(``runtime/data/in_memory.py``; a ``DataLoader`` with Lightning's distributed sampler works too)."""

import torch
from torch import Tensor

from mnistlab.runtime.data.in_memory import InMemoryDataModule
from mnistlab.runtime.run.failures import InputError

# Pixel noise against class patterns of standard deviation 1: the default train.py reaches 98.5% test
# accuracy in two epochs (89% after 20 steps), so metrics move as on real data rather than sit at 1.0.
NOISE = 6.0


class PlaceholderDataModule(InMemoryDataModule):
    def __init__(
        self,
        batch_size: int = 64,
        train_size: int = 60_000,
        val_size: int = 5_000,
        test_size: int = 10_000,
        num_classes: int = 10,
        data_seed: int = 0,
        split_seed: int = 12345,
        shuffle_seed: int = 0,
        prepare_data_per_node: bool = True,
    ) -> None:
        super().__init__()
        if val_size >= train_size:
            raise InputError(f"data.val_size={val_size} leaves no training images of data.train_size={train_size}")
        self.prepare_data_per_node = prepare_data_per_node  # Lightning's: where prepare_data runs (nothing here)
        self.batch_size, self.shuffle_seed = batch_size, shuffle_seed
        self.train_size, self.val_size, self.test_size = train_size, val_size, test_size
        self.num_classes, self.data_seed, self.split_seed = num_classes, data_seed, split_seed

    def setup(self, stage: str) -> None:
        """On every rank: the same images everywhere (seeded), each rank's shard of every batch."""
        if stage in ("fit", "validate") and "val" not in self.loaders:
            images, labels = self._draw(self.train_size, split=0)
            order = torch.randperm(self.train_size, generator=torch.Generator().manual_seed(self.split_seed))
            train, val = order[: -self.val_size], order[-self.val_size :]
            self.loaders["train"] = self._loader(images[train], labels[train], shuffle=True)
            self.loaders["val"] = self._loader(images[val], labels[val], shuffle=False)
        if stage in ("test", "predict") and "test" not in self.loaders:
            self.loaders["test"] = self._loader(*self._draw(self.test_size, split=1), shuffle=False)

    def _draw(self, count: int, split: int) -> tuple[Tensor, Tensor]:
        """``count`` images (N, 1, 28, 28) and labels of one split (0: training, 1: test): the same class
        patterns for both, each split its own labels and noise, so a stage draws only what it uses."""
        patterns = torch.randn(self.num_classes, 1, 28, 28, generator=torch.Generator().manual_seed(self.data_seed))
        generator = torch.Generator().manual_seed(self.data_seed + 1 + split)
        labels = torch.randint(self.num_classes, (count,), generator=generator)
        return patterns[labels] + NOISE * torch.randn(count, 1, 28, 28, generator=generator), labels
