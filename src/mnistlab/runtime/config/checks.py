"""Refusing bad user input early, with a message that says what to change."""

from collections.abc import Mapping
from pathlib import Path

from omegaconf import DictConfig


class InputError(ValueError):
    """A wrong override, a missing or corrupt file: the user's to fix, so entry points print one line."""


def group_set_to_null(argv: list[str], conf: Path) -> None:
    """``logger=null``, ``model/scheduler=null``: Hydra takes a config group's choice as a file's name only,
    and ends in a traceback. Switching a group off is its ``none`` option where it has one, else ``~group``."""
    for arg in argv[1:]:
        key, equals, value = arg.partition("=")
        group = key.lstrip("+")
        if equals and value.strip() in ("null", "~") and group and (conf / group).is_dir():
            off = f"{group}=none" if (conf / group / "none.yaml").is_file() else f"~{group}"
            raise InputError(f"{arg}: a group's choice is a file of conf/{group}/; to switch {group} off, write {off}")


def indivisible_batch(batch_size: int, world_size: int, named_by: str = "trainer.devices x trainer.num_nodes") -> str:
    """What to say of a global batch that the processes cannot share (schema.py, batches.py); ``named_by``:
    the settings that make the world size."""
    return (
        f"data.batch_size={batch_size} is the global batch (all devices of all nodes) and must be a multiple "
        f"of the world size {world_size} ({named_by}), at least {world_size}"
    )


def check_devices(cfg: DictConfig) -> None:
    """Refuse GPU-only settings on a machine without a GPU, before any process starts."""
    import torch  # here: this module is imported before the config is checked, and torch takes seconds

    if torch.cuda.is_available():
        return
    accelerator = str(cfg.trainer.get("accelerator", "auto"))
    if accelerator in ("gpu", "cuda"):
        raise InputError(
            f"trainer.accelerator={accelerator} (also set by strategy=ddp_nccl and strategy=fsdp) needs a CUDA GPU "
            "and this machine has none; use trainer.accelerator=cpu, with strategy=ddp for several processes"
        )
    strategy = cfg.trainer.get("strategy")
    if isinstance(strategy, Mapping) and strategy.get("process_group_backend") == "nccl":
        raise InputError(
            "the nccl backend (strategy=ddp_nccl) needs CUDA GPUs and this machine has none; "
            "use strategy=ddp (gloo on CPU) or strategy=ddp_gloo"
        )
