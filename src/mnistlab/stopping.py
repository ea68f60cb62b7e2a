"""Stopping a run between two steps, keeping what is worth keeping: on a signal, and when it diverges.

Signals. Lightning already stops at the next step boundary on SIGTERM (under DDP, every rank at
the same step: it broadcasts rank 0's flag before each step) but saves nothing and exits 0. Here
the stop also saves ``last.ckpt`` (mid-epoch: a resumed run goes on from that very step), SIGUSR1
(SLURM's warning before a time limit, ``--signal=USR1@<s>``) stops the same way, and the run ends
with a message saying how to resume and exit code 128 + the signal's number, so that a scheduler
(a Kubernetes Job, say) sees an interrupted run rather than a finished one. In a SLURM batch job
(``requeue: true``), SIGUSR1 also requeues the job once the checkpoint is saved: it comes back
under the same job id, in the same folder, and resumes from that step. Lightning's own SIGUSR1
handler for SLURM, replaced here, saves from inside the signal handler, wherever the step is, so
a resumed run could repeat or skip part of a step.

Divergence. A non-finite loss is noted at every step without reading it on the host (no GPU sync
per step) and acted on every ``check_every_n_steps`` batches, before each validation and before
any checkpoint is written: all ranks stop together, and no checkpoint of non-finite weights is
ever written, so the last good ``last.ckpt`` and best checkpoint stay as they were.
"""

import os
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities.exceptions import SIGTERMException

from mnistlab.failures import RunStopped


class SafeStop(L.Callback):
    def __init__(self, checkpoint: str, check_every_n_steps: int = 50, requeue: bool = True) -> None:
        self.checkpoint = Path(checkpoint)  # where a signal's stop saves the run's state: its last.ckpt
        self.check_every_n_steps = check_every_n_steps
        self.requeue = requeue  # in a SLURM batch job, SIGUSR1 requeues it once the checkpoint is saved
        self.signal: str | None = None  # the name of the signal that stopped the run
        self.saved = self.requeued = False
        self._trainer: L.Trainer | None = None
        self._finite: torch.Tensor | None = None  # all losses since the last check were finite
        self._batches = self._checked_at = 0

    # --- signals -------------------------------------------------------------------------------
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # After Lightning has set its handlers, which it puts back as they were before fit when fit ends;
        # and with the model on its device.
        self.signal, self.saved, self.requeued = None, False, False
        self._finite = torch.ones((), dtype=torch.bool, device=pl_module.device)
        self._batches = self._checked_at = 0
        self._trainer = trainer
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGUSR1, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """Lightning's SIGTERM handler, without its broadcast. Lightning's also broadcasts from inside the
        handler: ranks signalled in different places (one in the gradient all-reduce, one not) then wait
        on each other's collectives until SLURM kills them, which the SLURM tests saw happen."""
        self.signal = self.signal or signal.Signals(signum).name
        trainer = self._trainer
        if not trainer.received_sigterm and trainer.strategy.launcher is not None:
            trainer.strategy.launcher.kill(signum)  # the ranks Lightning started itself get it too
        # Lightning stops at the next step boundary, every rank at the same step: it broadcasts rank 0's
        # flag before each step. No public setter for it; its own handler sets this attribute.
        trainer._signal_connector.received_sigterm = True

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        # Not in the middle of a validation: resumed there, it would be computed on part of the data.
        if isinstance(exception, SIGTERMException) and not trainer.validating and not trainer.sanity_checking:
            requeue = self.requeue and self.signal == "SIGUSR1" and SLURMEnvironment.detect()
            if requeue:  # the requeue SIGTERMs every task of the job: let them finish saving and saying so
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            trainer.save_checkpoint(self.checkpoint, weights_only=False)  # every rank takes part; rank 0 writes
            self.saved = True
            if requeue and trainer.is_global_zero:
                self.requeued = _requeue_slurm_job()

    def stopped(self, trainer: L.Trainer) -> RunStopped:
        """What to tell the user once Lightning has stopped the run on a signal."""
        name = self.signal or "SIGTERM"
        where = f"step {trainer.global_step} (epoch {trainer.current_epoch})"
        kept = f"saved {self.checkpoint}" if self.saved else f"the last checkpoint is {self.checkpoint}"
        then = (
            f"SLURM job {os.environ['SLURM_JOB_ID']} requeued: it resumes from there"
            if self.requeued
            else f"Continue with: python train.py resume={trainer.default_root_dir}"
        )
        return RunStopped(
            f"Stopped by {name} at {where}; {kept}. {then}",
            exit_code=128 + signal.Signals[name].value,
        )

    # --- divergence ----------------------------------------------------------------------------
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, *args: Any) -> None:
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if loss is not None:
            self._finite.logical_and_(torch.isfinite(loss))  # stays on the device: no sync
        self._batches += 1
        if self._batches % self.check_every_n_steps == 0:
            self._check(trainer, pl_module)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._check(trainer, pl_module)

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        self._check(trainer, pl_module, weights=True)  # raising here keeps the file from being written

    def _check(self, trainer: L.Trainer, pl_module: L.LightningModule, weights: bool = False) -> None:
        """Stop every rank together if any saw a non-finite loss (or holds a non-finite weight)."""
        finite = self._finite if self._finite is not None else torch.ones((), dtype=torch.bool)
        if weights:
            finite = finite & torch.stack([p.isfinite().all() for p in pl_module.parameters()]).all()
        if trainer.strategy.reduce_boolean_decision(bool(finite), all=True):
            self._finite = finite.fill_(True) if self._finite is not None else None
            self._checked_at = trainer.global_step
            return
        group = trainer.optimizers[0].param_groups[0] if trainer.optimizers else {"lr": float("nan")}
        lr = group.get("initial_lr", group["lr"])  # as configured, before any schedule
        raise RunStopped(
            f"The training loss became non-finite (NaN or inf) between steps {self._checked_at} and "
            f"{trainer.global_step}, with learning rate {lr:g}: lower model.optimizer.lr, or clip gradients "
            f"(trainer.gradient_clip_val=1.0). No checkpoint of these weights was written; "
            + (f"the last good one is {self.checkpoint}" if self.checkpoint.is_file() else "none was written before"),
            exit_code=1,
        )


def _requeue_slurm_job() -> bool:
    """Requeue this SLURM batch job (SLURMEnvironment.detect: not an interactive allocation)."""
    array = os.environ.get("SLURM_ARRAY_JOB_ID")
    job = f"{array}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array else os.environ["SLURM_JOB_ID"]
    return subprocess.run(["scontrol", "requeue", job], check=False).returncode == 0
