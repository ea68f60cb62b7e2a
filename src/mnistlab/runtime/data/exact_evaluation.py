"""Whether a DDP run's validation and test count each sample once, said where they do not.

The in-memory loaders (``runtime/data/in_memory.py``) shard every global batch and pad the last one with rows that
count nowhere: on any number of ranks each sample is evaluated once. A plain ``DataLoader`` gets
Lightning's ``DistributedSampler`` instead, which repeats samples until every rank has as many; the
epoch's metrics then count those twice. Said once per split, with how many and what to do.
"""

import logging
from typing import Any

import lightning as L
from torch.utils.data import DistributedSampler

log = logging.getLogger(__name__)


class ExactEvaluation(L.Callback):
    def __init__(self) -> None:
        self._said: set[str] = set()

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._look(trainer, "validation", trainer.val_dataloaders)

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._look(trainer, "test", trainer.test_dataloaders)

    def _look(self, trainer: L.Trainer, split: str, loaders: Any) -> None:
        if trainer.world_size == 1 or split in self._said or not trainer.is_global_zero:
            return
        for loader in loaders if isinstance(loaders, list | tuple) else [loaders]:
            sampler = getattr(loader, "sampler", None)
            if not isinstance(sampler, DistributedSampler) or sampler.drop_last:
                continue
            count = len(sampler.dataset)  # type: ignore[arg-type]
            if repeated := sampler.total_size - count:
                self._said.add(split)
                log.warning(
                    "The %s set's %d samples do not divide among %d ranks: Lightning's DistributedSampler repeats "
                    "%d of them, and the %s metrics count those twice. For exact numbers evaluate on one process "
                    "(python eval.py ckpt_path=<checkpoint> trainer.devices=1), or serve the data from memory "
                    "(runtime/data/in_memory.py: InMemoryDataModule shards without repeating)",
                    *(split, count, trainer.world_size, repeated, split),
                )
