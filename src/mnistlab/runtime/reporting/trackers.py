"""Lightning's MLflow and W&B loggers, made to continue a run: ``resume=`` (and a requeued SLURM job or a
restarted torchrun, which run again in the same folder) logs into the same MLflow run and the same W&B
run, whose ids the run folder keeps in ``trackers.json``. A new folder starts a new tracker run.

The file is data (docs/reliability.md, Trust): an id is read only if it looks like one, and is only ever an id.
"""

import json
import logging
import re
from pathlib import Path
from typing import Any

from lightning.pytorch import loggers
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only

from mnistlab.runtime.run import atomic, internals, run_folder
from mnistlab.runtime.run.failures import InputError
from mnistlab.runtime.run.run_folder import TRACKERS_FILE

AN_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")  # MLflow's hex run ids, W&B's base-36 ones
log = logging.getLogger(__name__)


def saved_id(folder: str | Path, tracker: str) -> str | None:
    """The id of the ``tracker`` run the run in ``folder`` logged into, or None for a new one. A run that
    goes on in its folder (its checkpoints/last.ckpt) with no id to go on with says that it starts a new one."""
    path = Path(folder) / TRACKERS_FILE
    found = _saved_ids(path).get(tracker)
    if found is not None and not (isinstance(found, str) and AN_ID.fullmatch(found)):
        log.warning("%s: %s's run id %r is not an id; this run starts a new %s run", path, tracker, found, tracker)
        return None
    if found is None and run_folder.last_checkpoint(Path(folder)).is_file():
        log.warning(
            "%s names no %s run for this run to go on in: its metrics go to a new %s run", path, tracker, tracker
        )
    return found


def _saved_ids(path: Path) -> dict[str, Any]:
    """The ids a run folder keeps; one line, before any tracker run is opened, for a file cut short or
    damaged (a new tracker run would leave the old one open and split the run's curves in two)."""
    if not path.is_file():
        return {}
    try:
        ids = json.loads(path.read_text())
    except (OSError, ValueError):
        ids = None
    if not isinstance(ids, dict):
        raise InputError(
            f"{path} is damaged; it should hold the ids of the tracker runs this run logs into, as a JSON object "
            '({"mlflow": "<run id>", "wandb": "<run id>"}): restore it to go on logging into them, or remove it to '
            "start new ones"
        )
    return ids


@rank_zero_only
def keep_id(folder: str | Path, tracker: str, run_id: str) -> None:
    path = Path(folder) / TRACKERS_FILE
    ids = _saved_ids(path)
    if ids.get(tracker) != run_id:
        atomic.write_text(path, json.dumps(ids | {tracker: run_id}, indent=2) + "\n")


class ContinuedMLFlowLogger(loggers.MLFlowLogger):
    """``run_folder``: where the MLflow run's id is kept; the other arguments are Lightning's."""

    def __init__(self, run_folder: str, **kwargs: Any) -> None:
        self.run_folder, self.continued = run_folder, saved_id(run_folder, "mlflow")
        super().__init__(run_id=self.continued, **kwargs)

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        if self._initialized:
            return self._mlflow_client
        from mlflow.exceptions import MlflowException

        try:
            client = super().experiment
        except MlflowException as err:
            raise InputError(
                f"{Path(self.run_folder) / TRACKERS_FILE} continues the MLflow run {self.continued}, which "
                f"{self._tracking_uri} does not hold ({err.message}); log elsewhere or remove that file"
            ) from err
        assert self.run_id is not None  # the experiment made or found it
        keep_id(self.run_folder, "mlflow", self.run_id)
        return client

    @rank_zero_only
    def log_hyperparams(self, params: Any) -> None:
        """MLflow keeps a run's parameters as first logged: a continued run's changed ones are named, not logged."""
        if self.continued is None:
            return super().log_hyperparams(params)
        before = self.experiment.get_run(self.run_id).data.params
        flat = internals.flat_hyperparameters(params)  # as Lightning's logger names them
        changed = {key for key, value in flat.items() if key in before and before[key] != str(value)[:250]}
        if changed:
            log.warning(
                "MLflow keeps the parameters this run started with; changed since: %s (the run folder's "
                ".hydra/resumes/ has the values of each resume)",
                ", ".join(f"{key}={flat[key]}" for key in sorted(changed)),
            )
        super().log_hyperparams({key: value for key, value in flat.items() if key not in changed})


class ContinuedWandbLogger(loggers.WandbLogger):
    """``run_folder``: where the W&B run's id is kept; the other arguments are Lightning's.

    Also leaves out ``anonymous``, which Lightning passes to ``wandb.init`` on every run (None when unset)
    and wandb 0.23+ warns about whatever its value (wandb#10909 removed anonymous mode).
    """

    def __init__(self, run_folder: str, **kwargs: Any) -> None:
        self.run_folder = run_folder
        super().__init__(id=saved_id(run_folder, "wandb"), **kwargs)
        self._wandb_init.pop("anonymous", None)

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        if self._experiment is None:  # made now
            keep_id(self.run_folder, "wandb", super().experiment.id)
        return super().experiment
