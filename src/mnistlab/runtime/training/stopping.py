"""Stopping a run between two steps, keeping what is worth keeping: on a signal, and when it diverges.

Signals. SIGTERM, SIGUSR1 and SIGUSR2 (see :mod:`mnistlab.runtime.training.signals`, which notes them from the
process's start) stop the run at a step boundary: every rank saves ``last.ckpt`` at
the same step (mid-epoch: a resumed run goes on from that very step), and the run ends with a
message saying how to resume and exit code 128 + the signal's number, so that a scheduler sees an
interrupted run rather than a finished one. In a SLURM batch job (``requeue: true``) SIGUSR1 and
SIGUSR2 also requeue the job: it comes back under its job id, in its folder, and resumes from that
step. A signal that arrives in an epoch's last step, or in the validation that ends the epoch, stops
the run once the epoch is over (its validation run, its checkpoints written): resumed from before that,
Lightning goes on with the next epoch, and the epoch's validation (and its best checkpoint) would be lost.

Lightning's own handling is replaced, because under DDP it can hang: its SIGTERM handler broadcasts
from inside the signal handler, and its validation loop stops on each rank's own flag, so ranks
signalled at different points wait on each other's collectives until the scheduler kills them (two
srun tasks did, in the SLURM tests). Here the handler only notes the signal; the ranks agree on it
at a step boundary, with one process alone at every step, and under DDP every
``check_every_n_steps`` batches and before each validation, in one small all-reduce that also
carries the divergence check below. Lower ``check_every_n_steps`` when that many steps take longer
than the grace the scheduler gives between SIGTERM and SIGKILL (SLURM's KillWait: 30 s by default).

Divergence. Every step's loss is added to a sum on the device (no GPU sync per step; one addition,
1 us, where an ``isfinite`` test per step cost 4 us): the sum stays finite as long as every loss is,
and it is read every ``check_every_n_steps`` batches, before each validation and before
any checkpoint is written: all ranks stop together, and no checkpoint of non-finite weights is
ever written, so the last good ``last.ckpt`` and best checkpoint stay as they were.
"""

import logging
import os
import signal
import subprocess
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Checkpoint

from mnistlab.runtime.run import internals, launch
from mnistlab.runtime.run.failures import RunStopped, continue_line
from mnistlab.runtime.training import signals

log = logging.getLogger(__name__)


class SafeStop(Checkpoint):  # a checkpointing callback: it saves the run where it stops it
    def __init__(self, checkpoint: str, check_every_n_steps: int = 50, requeue: bool = True) -> None:
        self.checkpoint = Path(checkpoint)  # where a signal's stop saves the run's state: its last.ckpt
        self.check_every_n_steps = check_every_n_steps
        self.requeue = requeue  # in a SLURM batch job, SIGUSR1/2 requeue it once the checkpoint is saved
        self._trainer: L.Trainer | None = None
        self._losses = torch.zeros(())  # the sum of the losses since the last check; on_train_start: on the device
        self._batches = self._checked_at = 0
        self._deferred: signal.Signals | None = None  # a stop waiting for the end of the epoch's validation

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._trainer = trainer

    def on_sanity_check_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning has set its handlers: ours again (the entry point's noted any signal before this one).
        signals.listen(forward=self._forward)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._losses = torch.zeros((), device=pl_module.device)  # the model is on its device
        self._batches = self._checked_at = 0
        signals.listen(forward=self._forward)  # Lightning puts back the handlers it found when fit ends

    def _forward(self, signum: int) -> None:
        assert self._trainer is not None, "listening starts after on_fit_start"
        if self._trainer.strategy.launcher is not None:
            self._trainer.strategy.launcher.kill(signum)  # the ranks Lightning started itself get it too

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if loss is not None:
            self._losses.add_(loss.detach())  # NaN and inf stay in the sum; on the device: no sync
        self._batches += 1
        if self._batches % self.check_every_n_steps == 0 or (signals.received() and trainer.world_size == 1):
            self._check(trainer, pl_module, epoch_trained=batch_idx + 1 >= trainer.num_training_batches)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            trained = internals.batches_done_this_epoch(trainer) >= trainer.num_training_batches
            self._check(trainer, pl_module, epoch_trained=trained)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # A Checkpoint: Lightning runs this after the module's hook and after the checkpoint callbacks listed
        # before it (conf/callbacks/default.yaml), once they have written the epoch's best and last.
        if self._deferred is not None:
            self._stop(trainer, self._deferred)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        # Raising here keeps the file from being written. Signals wait for a step boundary.
        self._check(trainer, pl_module, weights=True, stop_on_signal=False)

    def _check(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        weights: bool = False,
        stop_on_signal: bool = True,
        epoch_trained: bool = False,
    ) -> None:
        """Agree across ranks, in one all-reduce, whether any diverged or was signalled; stop if so (once the
        epoch's validation is over, where the epoch's training is)."""
        finite = self._losses.isfinite()
        if weights:
            finite = finite & torch.stack([p.isfinite().all() for p in pl_module.parameters()]).all()
        flags = torch.stack([finite.logical_not().long(), torch.tensor(signals.received(), device=finite.device)])
        diverged, signum = trainer.strategy.reduce(flags, reduce_op="max").tolist()  # the one host sync
        if diverged:
            raise self._diverged(trainer)
        if signum and stop_on_signal and epoch_trained:
            self._deferred = signal.Signals(signum)  # every rank agreed: every rank stops once the epoch is over
        elif signum and stop_on_signal and self._deferred is None:
            self._stop(trainer, signal.Signals(signum))
        self._losses.zero_()
        self._checked_at = trainer.global_step

    def _stop(self, trainer: L.Trainer, signum: signal.Signals) -> None:
        """Save the run at this step on every rank, requeue a SLURM job on SIGUSR1/2, and stop."""
        signals.acted_on()
        requeue = self.requeue and signum in signals.WARNINGS and launch.current().launcher == "slurm"
        if requeue:  # the requeue SIGTERMs every task of the job: let them finish saving and saying so
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        trainer.save_checkpoint(self.checkpoint, weights_only=False)  # every rank takes part; rank 0 writes
        requeue = requeue and trainer.is_global_zero
        then = (
            f"Requeuing SLURM job {os.environ.get('SLURM_JOB_ID')}: it resumes from there"
            if requeue
            else continue_line(trainer.default_root_dir)
        )
        where = f"step {trainer.global_step} (epoch {trainer.current_epoch})"
        message = f"Stopped by {signum.name} at {where}; saved {self.checkpoint}. {then}"
        resume = partial(_requeue_slurm_job, trainer.default_root_dir) if requeue else None
        raise RunStopped(message, 128 + signum, then=resume)

    def _diverged(self, trainer: L.Trainer) -> RunStopped:
        group = trainer.optimizers[0].param_groups[0] if trainer.optimizers else {"lr": float("nan")}
        lr = group.get("initial_lr", group["lr"])  # as configured, before any schedule
        return RunStopped(
            f"The training loss became non-finite (NaN or inf) between steps {self._checked_at} and "
            f"{trainer.global_step}, with learning rate {lr:g}: lower model.optimizer.lr, or clip gradients "
            f"(trainer.gradient_clip_val=1.0). No checkpoint of these weights was written; "
            + (f"the last good one is {self.checkpoint}" if self.checkpoint.is_file() else "none was written before"),
            exit_code=1,
        )


def _requeue_slurm_job(run: str) -> None:
    """Requeue this SLURM batch job (not an interactive allocation: launch.current())."""
    array = os.environ.get("SLURM_ARRAY_JOB_ID")
    job = f"{array}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array else os.environ["SLURM_JOB_ID"]
    refused = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, check=False)
    if refused.returncode:
        log.error("SLURM refused to requeue job %s (%s). %s", job, refused.stderr.strip(), continue_line(run))
