"""Batches served straight from memory: whole-batch indexing, sharded across ranks, resumable.

A ``DataLoader`` over a map-style dataset builds every batch from per-sample ``__getitem__``
calls and a collate; for a data set that sits in memory as one tensor that is most of an
epoch's time. Here a batch is one indexing operation on that tensor, on the model's device.
"""

import math
from collections.abc import Iterator
from typing import Any

import lightning as L
import torch
from torch import Tensor

from mnistlab.runtime.config.checks import indivisible_batch
from mnistlab.runtime.run.failures import InputError

PAD_LABEL = -100
"""Label of padding rows: torch's default ``ignore_index``, so they count in no loss and no metric."""


class ShardedOrder:
    """Which samples each rank gets at each step: the sampler of :class:`InMemoryLoader`.

    Each step consumes one *global* batch of ``batch_size`` samples from one ordering of the data
    set, shuffled from ``seed + epoch`` and identical on every rank. Rank ``r`` takes positions
    ``r, r + world_size, ...`` of it, so shards never overlap and together they are exactly the
    batch one process would see. The last global batch is padded (index -1) rather than filled
    with repeated samples: every rank runs the same number of steps on the same shape, and every
    sample counts exactly once.
    """

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = False,
        seed: int = 0,
    ) -> None:
        if batch_size < 1 or batch_size % world_size:
            raise InputError(indivisible_batch(batch_size, world_size))
        assert 0 <= rank < world_size, f"rank {rank} outside world of {world_size}"
        self.num_samples, self.batch_size = num_samples, batch_size
        self.rank, self.world_size = rank, world_size
        self.shuffle, self.seed = shuffle, seed
        self.epoch = 0
        self.start = 0  # first step of the epoch to serve: non-zero only when resuming mid-epoch

    def __len__(self) -> int:
        return math.ceil(self.num_samples / self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """Called by Lightning before each epoch; a new epoch starts from its first step."""
        if epoch != self.epoch:
            self.epoch, self.start = epoch, 0

    def indices(self) -> Tensor:
        """This rank's sample indices for the epoch, shape (steps, batch_size // world_size); -1 pads."""
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.num_samples, generator=generator)
        else:
            order = torch.arange(self.num_samples)
        padded = torch.full((len(self) * self.batch_size,), -1, dtype=torch.long)
        padded[: self.num_samples] = order
        return padded.view(len(self), -1, self.world_size)[:, :, self.rank].contiguous()


class InMemoryLoader:
    """An iterable of ``(inputs, targets)`` batches for Lightning, with the state to resume mid-epoch.

    ``inputs`` and ``targets`` hold the whole split, as the model takes it, on the device the model
    runs on. Padding rows carry :data:`PAD_LABEL`.
    """

    def __init__(
        self,
        inputs: Tensor,
        targets: Tensor,
        sampler: ShardedOrder,
    ) -> None:
        assert len(inputs) == len(targets) == sampler.num_samples
        self.inputs, self.targets = inputs, targets
        self.sampler = sampler  # the attribute name Lightning looks for to call ``set_epoch``
        self.batch_sampler = None  # Lightning reads it wherever it finds a ``sampler``
        self.served = 0  # steps of the current epoch handed out so far

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        # A generator: the order is drawn at the first ``next``, after Lightning has set the epoch.
        rows = self.sampler.indices().to(self.inputs.device)
        padding = rows < 0
        rows = rows.clamp(min=0)
        targets = self.targets[rows].masked_fill(padding, PAD_LABEL)
        start, self.sampler.start = self.sampler.start, 0
        for step in range(start, len(rows)):
            self.served = step + 1
            yield self.inputs[rows[step]], targets[step]

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.sampler.epoch, "served": self.served, "seed": self.sampler.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.epoch, self.sampler.seed = state["epoch"], state["seed"]
        self.sampler.start = self.served = state["served"]


class InMemoryDataModule(L.LightningDataModule):
    r"""What a data module held in memory shares: its splits as :class:`InMemoryLoader`\ s in ``loaders``
    (``setup`` fills them through :meth:`_loader`), each sharded for this rank and on the model's device.
    ``batch_size`` and ``shuffle_seed`` are set by the subclass."""

    batch_size: int
    shuffle_seed: int

    def __init__(self) -> None:
        super().__init__()
        self.loaders: dict[str, InMemoryLoader] = {}

    def train_dataloader(self) -> InMemoryLoader:
        return self.loaders["train"]

    def val_dataloader(self) -> InMemoryLoader:
        return self.loaders["val"]

    def test_dataloader(self) -> InMemoryLoader:
        return self.loaders["test"]

    def predict_dataloader(self) -> InMemoryLoader:
        return self.loaders["test"]

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        return batch  # the loaders serve batches on the model's device already

    def on_device(self, inputs: Tensor) -> Tensor:
        """A split's inputs once on the model's device, before batching: e.g. normalised there, once."""
        return inputs

    def _loader(self, inputs: Tensor, labels: Tensor, shuffle: bool) -> InMemoryLoader:
        trainer = self.trainer
        rank, world_size = (trainer.global_rank, trainer.world_size) if trainer else (0, 1)
        device = trainer.strategy.root_device if trainer else torch.device("cpu")
        # Training needs the batch to divide (refused otherwise); evaluation counts every sample once whatever
        # the batch (padding rows count nowhere), so its batch is rounded up to the next multiple instead.
        batch_size = self.batch_size if shuffle else -(-self.batch_size // world_size) * world_size
        order = ShardedOrder(len(labels), batch_size, rank, world_size, shuffle, self.shuffle_seed)
        return InMemoryLoader(self.on_device(inputs.to(device)), labels.to(device), order)
