"""Checkpoint files that appear whole or not at all, wherever the run folder lives."""

import os
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, with the temporary file beside the target.

    Lightning writes a checkpoint to the system's temporary folder, then moves it into place: a
    rename when both sit on one file system, but a copy onto the target when they do not (a node's
    /tmp and a cluster's shared disk), and a job killed during that copy (a time limit, a
    preemption) leaves a truncated last.ckpt that its requeued run cannot resume from. Written
    beside the target and flushed to disk first, the file only ever changes by a rename, which is
    atomic. Remote paths (``s3://`` and the like) keep Lightning's own writer.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None) -> None:
        if storage_options is not None or "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.partial")
        try:
            with partial.open("wb") as file:
                torch.save(checkpoint, file)
                file.flush()
                os.fsync(file.fileno())  # on disk before it takes the target's name: survives a node crash
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
