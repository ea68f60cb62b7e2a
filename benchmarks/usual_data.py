# Part of the MNIST example: a project generated without it has no such file.
"""MNIST fed the way most Lightning templates feed it, for the benchmark's comparison row:
torchvision's ``MNIST`` dataset decoding a PIL image per sample, ``ToTensor`` + ``Normalize``
transforms, and a ``DataLoader`` with the workers a user would pick (one per core), persistent.

Selected by ``train.py data._target_=usual_data.TorchvisionMNIST`` with ``benchmarks/`` on the path:
everything else (the LightningModule, callbacks, logger) is train.py's own. It takes the data
group's keys, and splits the same 55,000/5,000 images as ``MNISTDataModule``.
"""

import os
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Subset
from torchvision import transforms
from torchvision.datasets import MNIST


class TorchvisionMNIST(L.LightningDataModule):
    def __init__(
        self, data_dir: str, batch_size: int, val_size: int, split_seed: int, mean: float, std: float, **_: Any
    ) -> None:
        super().__init__()
        self.data_dir, self.batch_size, self.val_size, self.split_seed = data_dir, batch_size, val_size, split_seed
        self.transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((mean,), (std,))])
        self.workers = os.cpu_count() or 1

    def setup(self, stage: str) -> None:
        train = MNIST(self.data_dir, train=True, transform=self.transform)
        split = torch.randperm(len(train), generator=torch.Generator().manual_seed(self.split_seed))
        self.train, self.val = Subset(train, split[: -self.val_size]), Subset(train, split[-self.val_size :])
        self.test = MNIST(self.data_dir, train=False, transform=self.transform)

    def _loader(self, dataset: Any, shuffle: bool) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=shuffle,
            num_workers=self.workers,
            persistent_workers=True,
            pin_memory=torch.cuda.is_available(),
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test, shuffle=False)
