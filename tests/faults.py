"""Faults the tests inject into real runs, by config: ``+callbacks.signal._target_=faults.SignalAt``.

Importable in-process (tests/ is on pytest's path) and in the scripts the tests run (run_script puts
tests/ on PYTHONPATH). Not in conftest: importing Lightning while pytest loads conftest, before it
captures logs, makes Lightning's logger stop propagating, and caplog would see nothing.
"""

import functools
import io
import os
import signal as signal_module

import lightning as L
import torch


class SignalAt(L.Callback):
    """Sends this process ``signal`` as batch ``step`` starts on ``rank`` of a run that starts afresh
    (a resumed one runs through): a signal from outside, at a step the test knows
    (``+callbacks.signal._target_=faults.SignalAt``); ``validating``: as the validation after ``step``
    steps starts its first batch."""

    def __init__(
        self, step: int, signal: str = "SIGTERM", rank: int = 0, times: int = 1, validating: bool = False
    ) -> None:
        self.step, self.signal, self.rank, self.times = step, getattr(signal_module, signal), rank, times
        self.validating = validating

    def on_train_batch_start(self, trainer: L.Trainer, *args: object) -> None:
        if not self.validating:
            self._send(trainer)

    def on_validation_batch_start(self, trainer: L.Trainer, module: object, batch: object, index: int, *_) -> None:
        if self.validating and not trainer.sanity_checking and index == 0:
            self._send(trainer)
        elif self.step == -1 and trainer.sanity_checking and index == 0:  # before training, in the sanity check
            self._send(trainer, step=trainer.global_step)

    def _send(self, trainer: L.Trainer, step: int | None = None) -> None:
        if (
            trainer.global_step == (self.step if step is None else step)
            and trainer.global_rank == self.rank
            and trainer.ckpt_path is None
        ):
            for _ in range(self.times):  # times=2: Ctrl-C pressed twice
                os.kill(os.getpid(), self.signal)


class PoisonAt(L.Callback):
    """Turns one weight into NaN as batch ``step`` starts on ``rank``: the run diverges there."""

    def __init__(self, step: int, rank: int = 0) -> None:
        self.step, self.rank = step, rank

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: object) -> None:
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            with torch.no_grad():
                next(pl_module.parameters()).view(-1)[0] = float("nan")


class KillAt(L.Callback):
    """SIGKILL at step ``step``, resumed run or not: as its batch starts, or (``writing=true``) inside the
    project's real checkpoint writer, once half of that step's checkpoint has reached the file.

    ``torch.save`` is what ``AtomicCheckpointIO`` calls to write: replaced here, so that everything around
    it (the partial file's name, flushing, the rename) is the real code. A writer that wrote straight
    onto ``last.ckpt`` would leave half a checkpoint there, and the resumed run would fail.
    """

    def __init__(self, step: int, writing: bool = False, job: int | None = None, rank: int | None = None) -> None:
        self.step, self.writing, self.job = step, writing, job  # job: only in that job of a sweep
        self.rank = rank  # only that rank (None: every rank)

    def setup(self, trainer: L.Trainer, module: L.LightningModule, stage: str) -> None:
        if self.writing:
            torch.save = functools.partial(_save_half_then_die, torch.save, self.step)

    def on_train_batch_start(self, trainer: L.Trainer, *args: object) -> None:
        if not self.writing and trainer.global_step == self.step and self._in_job() and self._on_rank(trainer):
            os.kill(os.getpid(), signal_module.SIGKILL)

    def _on_rank(self, trainer: L.Trainer) -> bool:
        return self.rank is None or trainer.global_rank == self.rank

    def _in_job(self) -> bool:
        from hydra.core.hydra_config import HydraConfig

        return self.job is None or (HydraConfig.initialized() and HydraConfig.get().job.num == self.job)


def _save_half_then_die(save, step: int, obj: object, file, *args: object, **kwargs: object) -> None:
    if not (isinstance(obj, dict) and obj.get("global_step") == step):
        return save(obj, file, *args, **kwargs)
    whole = io.BytesIO()
    save(obj, whole, *args, **kwargs)
    file.write(whole.getvalue()[: whole.tell() // 2])
    file.flush()
    os.kill(os.getpid(), signal_module.SIGKILL)


class HangAt(L.Callback):
    """Stops answering as batch ``step`` starts on ``rank`` of a run that starts afresh (a resumed one runs
    through): SIGSTOP, as a rank stuck in a driver call, a dead NFS mount or a swapped-out node would (a
    process that neither works nor exits)."""

    def __init__(self, step: int, rank: int = 1) -> None:
        self.step, self.rank = step, rank

    def on_train_batch_start(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step == self.step and trainer.global_rank == self.rank and trainer.ckpt_path is None:
            os.kill(os.getpid(), signal_module.SIGSTOP)


class FillAt(L.Callback):
    """Fills the file system of ``folder`` as batch ``step`` starts (a run that starts afresh): another
    process took the disk's room."""

    def __init__(self, step: int, folder: str) -> None:
        self.step, self.folder = step, folder

    def on_train_batch_start(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step == self.step and trainer.ckpt_path is None:
            try:
                with open(os.path.join(self.folder, "filler"), "wb") as filler:
                    while True:
                        filler.write(bytes(1 << 16))
                        filler.flush()
            except OSError:  # full
                pass
