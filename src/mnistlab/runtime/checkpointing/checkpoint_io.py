"""Checkpoint files that appear whole or not at all, say which run wrote them, and are read as data."""

import errno
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO
from torch import nn

from mnistlab.runtime.checkpointing import checkpoint_checks
from mnistlab.runtime.run import atomic, launch
from mnistlab.runtime.run.failures import InputError, resume_command

RUN_ID_KEY = "run_id"  # in every checkpoint: the launch that wrote it (launch.run_id), None for a run by hand
# What to do when a checkpoint does not fit the configured model: it was trained with other settings.
RETRAINED = "use the model settings it was trained with (its config is in the checkpoint, under 'config')"
ONNX = "this takes a checkpoint of train.py (.ckpt); predict.py and serve.py take ONNX models too"
CONFIG_KEY = "config"  # in every checkpoint of train.py: the run's resolved config, plain containers


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer and reader, with three changes.

    Written beside the target, under a name no other writer uses, flushed, then renamed over it.
    Lightning writes to the system's temporary folder and moves the file into place: a rename on one
    file system, but a copy onto the target across two (a node's /tmp and a cluster's shared disk),
    and a job killed during that copy leaves a truncated last.ckpt its requeued run cannot resume
    from. A rename is atomic; a partial name of its own per write keeps two writers of one folder
    from renaming each other's half-written files. Remote paths (``s3://``) keep Lightning's writer.

    Stamped with the run that wrote it (``run_id``), so that a run tells its own last.ckpt from
    another's (``tasks._last_checkpoint``), and with the run's config (``config``: set by ``tasks``), so
    that eval, export and serving rebuild its network whatever LightningModule wrote it.

    Read with ``weights_only=True`` and from local files only: a checkpoint is data (docs/reliability.md, Trust).
    Lightning would load a URL, and fall back to full unpickling for a file that fails the check.
    """

    config: dict[str, Any] | None = None  # the run's resolved config: plain containers, so weights_only loads it

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None) -> None:
        checkpoint[RUN_ID_KEY] = launch.run_id()
        if self.config is not None:
            checkpoint[CONFIG_KEY] = self.config
        if storage_options is not None or "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        target = Path(path)
        written = 0
        try:
            with atomic.replacing(target, durable=True) as file:  # durable: survives a node crash
                try:
                    torch.save(checkpoint, file)
                finally:
                    written = os.fstat(file.fileno()).st_size  # what reached the disk: 0 B free or a few
        except (OSError, RuntimeError) as err:
            raise _write_failure(target, err, written) from err

    def load_checkpoint(self, path: str | Path, map_location: Any = None, weights_only: bool | None = None) -> dict:
        return read(path, map_location=map_location)  # any file Lightning reads: ddp_notebook's weights too


def _write_failure(target: Path, err: Exception, written: int) -> Exception:
    """A failed write as one line naming the folder and its free space. On a full disk torch's own
    message is 40 lines from its zip writer ("file write failed") that never say why."""
    free = shutil.disk_usage(target.parent).free  # the partial file is gone: what the next try would have
    full = getattr(err, "errno", None) == errno.ENOSPC or free < 2 * written
    reason = "no space left on its disk" if full else " ".join(str(err).split())[:200]
    return InputError(
        f"cannot write the checkpoint {target}: {reason} ({free / 2**20:.1f} MiB free in {target.parent}). "
        f"The checkpoints written before it are intact; once it can be written, continue with "
        f"{resume_command(target.parent.parent)}"
    )


def load_checkpoint(path: str | Path, map_location: Any = "cpu", what: str = "ckpt_path") -> dict[str, Any]:
    """A Lightning checkpoint's contents, as data; one line for a remote, missing or broken file."""
    checkpoint = read(path, map_location, what)
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise InputError(f"{what}={path} holds no 'state_dict': not a Lightning checkpoint")
    return checkpoint


def read(path: str | Path, map_location: Any = "cpu", what: str = "ckpt_path", mmap: bool = False) -> Any:
    """What ``torch.save`` wrote to a local file, as data (``weights_only``); one line for a remote,
    missing or broken file. ``mmap``: tensors mapped from the file, not read, for a look at its other keys."""
    if problem := checkpoint_checks.unreadable(path, onnx=ONNX):
        raise InputError(f"{what}={path}{problem}")
    try:
        return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as err:  # RuntimeError, EOFError, UnpicklingError, ...: torch's, for a broken file
        raise InputError(f"{what}={path} is not a readable checkpoint: {_refusal(err)}") from err


def _refusal(err: Exception) -> str:
    """Torch's reason, without its advice to load with ``weights_only=False``: that would run whatever
    code the file holds."""
    reason = " ".join(str(err).split())
    if "weights_only" in reason or isinstance(err, pickle.UnpicklingError):
        return "it holds objects other than tensors and plain values, which are never unpickled (a checkpoint is data)"
    return reason[:300]


def fit_weights(module: nn.Module, weights: dict[str, Any], what: str, remedy: str = RETRAINED) -> None:
    """Refuse, naming the first layer that differs, ``weights`` (a state dict) that ``module`` cannot take:
    ``what`` names the checkpoint, ``remedy`` what to do."""
    own = module.state_dict()
    for name, tensor in weights.items():
        if name in own and hasattr(tensor, "shape") and tuple(own[name].shape) != tuple(tensor.shape):
            shapes = f"{tuple(tensor.shape)} in the checkpoint and {tuple(own[name].shape)} in the model"
            raise InputError(f"{what}: its weights do not fit the model: {name} is {shapes}; {remedy}")
    if (missing := sorted(own.keys() - weights.keys())) or (unknown := sorted(weights.keys() - own.keys())):
        named = f"the model's {missing[0]} is not in it" if missing else f"its {unknown[0]} is not in the model"
        raise InputError(f"{what}: its weights do not fit the model: {named}; {remedy}")
