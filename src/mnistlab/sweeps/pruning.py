"""Pruning for Optuna sweeps (``hparams_search=mnist_optuna``): after each validation, rank 0 reports
the monitored metric to the job's trial and asks the study's pruner whether to go on; the answer
reaches every rank (one broadcast), and a pruned run stops at once, on all ranks together, as early
stopping stops one. The trial is then PRUNED in the study, and ``pruned.txt`` in the job's folder
says at which epoch and why (the sweep table shows the job as ``pruned``, not failed)."""

import logging
from pathlib import Path
from typing import Any

import lightning as L

from mnistlab.runtime.run import atomic, internals
from mnistlab.runtime.run.run_folder import PRUNED_FILE

log = logging.getLogger(__name__)


class OptunaPruning(L.Callback):
    def __init__(
        self, storage: str | None, study_name: str | None, pruner: Any, trial: int | None, monitor: str, folder: str
    ) -> None:
        self.storage, self.study_name, self.pruner, self.number = storage, study_name, pruner, trial
        self.monitor, self.folder = monitor, Path(folder)
        self._trial: Any = None  # the job's trial, on rank 0 of a job of the Optuna sweeper

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit" or self.number is None or not trainer.is_global_zero:
            return  # not a job of the Optuna sweeper (trial: null), or not the rank that reports
        if not self.storage:
            log.warning("Pruning needs the study in a storage (hydra.sweeper.storage): this trial runs to its end")
            return
        import optuna

        study = optuna.load_study(study_name=self.study_name, storage=self.storage, pruner=self.pruner)
        trial_id = next(
            internals.optuna_trial_id(t) for t in study.get_trials(deepcopy=False) if t.number == self.number
        )
        self._trial = optuna.Trial(study, trial_id)  # how Optuna's own workers take a trial asked elsewhere

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or self.number is None:
            return
        prune = self._should_prune(trainer) if self._trial is not None else False
        if trainer.strategy.broadcast(prune, src=0):
            trainer.should_stop = True
            if trainer.is_global_zero:
                self._record(trainer)

    def _should_prune(self, trainer: L.Trainer) -> bool:
        value = trainer.callback_metrics.get(self.monitor)
        if value is None:
            return False  # not logged at this validation: nothing to report
        self._trial.report(float(value), step=trainer.current_epoch)
        last = trainer.max_epochs is not None and trainer.current_epoch + 1 >= trainer.max_epochs
        return not last and self._trial.should_prune()  # a trial that trained all its epochs completes

    def _record(self, trainer: L.Trainer) -> None:
        from optuna.trial import TrialState

        self._trial.study.tell(self._trial, state=TrialState.PRUNED)
        value = float(trainer.callback_metrics[self.monitor])
        pruner = type(self._trial.study.pruner).__name__
        reason = (
            f"pruned after epoch {trainer.current_epoch}: {self.monitor}={value:.6g}, stopped by the study's {pruner}"
        )
        atomic.write_text(self.folder / PRUNED_FILE, reason + "\n")
        log.info("Trial %d %s", self.number, reason)
