"""``python tests/fixed_batch.py [key=value ...] +fixed.out=<file> +fixed.steps=N``: train the task conf/
composes (the user's, by default) for N steps on one fixed global batch, on as many processes as
``trainer.devices`` with ``strategy=ddp`` says, then test on the data module's whole test split, and save
the weights and the test metrics. The contract test runs ``train`` on one process (its own) and this script
on two: a module whose loss and metrics are right under DDP ends with the same weights, and a data module whose test loader gives each
rank its own samples (none repeated, none left out) with the same test metrics.

Each rank trains on its share of the batch (rows rank, rank + world, ...), as the template's loaders
shard every global batch. Dropout is switched off (each rank would draw its own masks) and batch norm
is synchronised across ranks (``sync_batchnorm``), so that only the module's own arithmetic is compared.
"""

import itertools
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import torch
from hydra.utils import instantiate
from lightning.fabric.utilities.apply_func import apply_to_collection
from omegaconf import DictConfig
from torch import Tensor, nn

from mnistlab.runtime.config import hydra_versions

ROOT = Path(__file__).resolve().parents[1]


class Repeated:
    """One batch, ``times`` times: an iterable Lightning trains on (a list would be taken for several loaders)."""

    def __init__(self, batch: Any, times: int) -> None:
        self.batch, self.times = batch, times

    def __iter__(self) -> Iterator[Any]:
        return itertools.repeat(self.batch, self.times)

    def __len__(self) -> int:
        return self.times


class FixedBatch(L.LightningDataModule):
    def __init__(self, batch: Any, steps: int) -> None:
        super().__init__()
        self.batch, self.steps = batch, steps

    def train_dataloader(self) -> Repeated:
        assert self.trainer is not None
        rank, world = self.trainer.global_rank, self.trainer.world_size
        return Repeated(apply_to_collection(self.batch, Tensor, lambda t: t[rank::world]), self.steps)


@hydra.main(config_path=str(ROOT / "conf"), config_name="train", **hydra_versions.MAIN)
def main(cfg: DictConfig) -> None:
    with hydra_versions.allowed(["suite_task.*"]):  # the suite's own task, where the test composes it
        train(cfg)


def train(cfg: DictConfig) -> None:
    """Train on the fixed batch, test, and save (rank 0) to ``cfg.fixed.out``."""
    L.seed_everything(cfg.seed, workers=True)
    data = instantiate(cfg.data)
    data.prepare_data()
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))  # no trainer yet: the whole global batch, as one process sees it
    model = instantiate(cfg.model)
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    trainer = L.Trainer(
        accelerator="cpu",
        devices=cfg.trainer.devices,
        strategy="ddp" if cfg.trainer.devices > 1 else "auto",
        max_steps=cfg.fixed.steps,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        sync_batchnorm=cfg.trainer.devices > 1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, datamodule=FixedBatch(batch, cfg.fixed.steps))
    # Then the whole test split, as the data module serves it to each rank: its metrics on two ranks are
    # one process's only if every sample counts once.
    tested = trainer.test(model, datamodule=instantiate(cfg.data), verbose=False)[0]
    if trainer.is_global_zero:
        torch.save({"state_dict": model.state_dict(), "tested": tested}, cfg.fixed.out)


if __name__ == "__main__":
    sys.exit(main())
