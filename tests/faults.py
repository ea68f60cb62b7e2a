"""Faults the tests inject into real runs, by config: ``+callbacks.signal._target_=faults.SignalAt``.

Importable in-process (tests/ is on pytest's path) and in the scripts the tests run (run_script puts
tests/ on PYTHONPATH). Not in conftest: importing Lightning while pytest loads conftest, before it
captures logs, makes Lightning's logger stop propagating, and caplog would see nothing.
"""

import os
import signal as signal_module
from pathlib import Path

import lightning as L
import torch

from mnistlab.checkpoint_io import AtomicCheckpointIO


class SignalAt(L.Callback):
    """Sends this process ``signal`` as batch ``step`` starts on ``rank`` of a run that starts afresh
    (a resumed one runs through): a signal from outside, at a step the test knows
    (``+callbacks.signal._target_=faults.SignalAt``)."""

    def __init__(self, step: int, signal: str = "SIGTERM", rank: int = 0, times: int = 1) -> None:
        self.step, self.signal, self.rank, self.times = step, getattr(signal_module, signal), rank, times

    def on_train_batch_start(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step == self.step and trainer.global_rank == self.rank and trainer.ckpt_path is None:
            for _ in range(self.times):  # times=2: Ctrl-C pressed twice
                os.kill(os.getpid(), self.signal)

    def on_sanity_check_start(self, trainer: L.Trainer, *args: object) -> None:
        if self.step == -1 and trainer.global_rank == self.rank and trainer.ckpt_path is None:
            os.kill(os.getpid(), self.signal)  # step -1: before training, during the sanity check


class PoisonAt(L.Callback):
    """Turns one weight into NaN as batch ``step`` starts on ``rank``: the run diverges there."""

    def __init__(self, step: int, rank: int = 0) -> None:
        self.step, self.rank = step, rank

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: object) -> None:
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            with torch.no_grad():
                next(pl_module.parameters()).view(-1)[0] = float("nan")


class KilledMidWrite(AtomicCheckpointIO):
    """The checkpoint writer, killed (SIGKILL) halfway through writing the checkpoint of step ``step``;
    once: the partial file that kill leaves behind tells a resumed run it happened."""

    def __init__(self, step: int) -> None:
        super().__init__()
        self.step = step

    def save_checkpoint(self, checkpoint: dict, path: str | Path, storage_options: object = None) -> None:
        partial = Path(path).with_name(f".{Path(path).name}.partial")
        if checkpoint["global_step"] != self.step or partial.exists():
            return super().save_checkpoint(checkpoint, path, storage_options)
        with partial.open("wb") as file:
            file.write(b"half a checkpoint")
            file.flush()
            os.kill(os.getpid(), signal_module.SIGKILL)


class HangAt(L.Callback):
    """Stops answering as batch ``step`` starts on ``rank``: SIGSTOP, as a rank stuck in a driver call,
    a dead NFS mount or a swapped-out node would (a process that neither works nor exits)."""

    def __init__(self, step: int, rank: int = 1) -> None:
        self.step, self.rank = step, rank

    def on_train_batch_start(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            os.kill(os.getpid(), signal_module.SIGSTOP)
