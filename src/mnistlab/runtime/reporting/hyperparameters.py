"""The hyperparameters a run's loggers record: the config's short list ``hparams`` and every key given on
the command line (what a sweep varies is among them), so that TensorBoard's HPARAMS table and MLflow's
params open on what runs are compared by rather than on all of the config's hundred keys. The whole
config stays in the run's ``.hydra/config.yaml``, in each checkpoint, and as MLflow's ``config.yaml``.
``HparamsView`` (``callbacks.hparams_view``) puts them beside the run's final metrics in TensorBoard's
HPARAMS view, where the runs of a sweep sit side by side.
"""

from typing import Any

import lightning as L
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.loggers import Logger, MLFlowLogger, TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from mnistlab.runtime.run import internals


def compared(cfg: DictConfig) -> dict[str, Any]:
    """The hyperparameters to log, named as loggers name them (``model/optimizer/lr``). Flat, not nested: a
    group's option and keys of that group (``data=<yours> data.<key>=...``) are logged side by
    side as ``data`` and ``data/download``. A listed key the config does not have (another model's) is
    left out."""
    given = _given()
    chosen: dict[str, Any] = {}
    for key in dict.fromkeys([*(cfg.get("hparams") or []), *given]):
        value = OmegaConf.select(cfg, key, default=None)
        if value is None or OmegaConf.is_config(value):  # a group's option (strategy=ddp): its name, not its keys
            value = given.get(key)
        if value is not None and not key.startswith("hydra"):
            chosen[key.replace(".", "/")] = value
    return chosen


def save_config(logger: Logger, config: dict[str, Any]) -> None:
    """The whole config beside the chosen few, where the logger keeps files (MLflow's artifacts)."""
    if isinstance(logger, MLFlowLogger) and logger.run_id:
        logger.experiment.log_dict(logger.run_id, config, "config.yaml")


def _given() -> dict[str, str]:
    """The keys given on the command line (a sweep's job: its own values too), with their values as typed."""
    if not HydraConfig.initialized():
        return {}
    pairs = (o.split("=", 1) for o in HydraConfig.get().overrides.task if "=" in o)
    return {key.lstrip("+~"): value for key, value in pairs}


class HparamsView(L.Callback):
    """TensorBoard's HPARAMS view of the run: its logged hyperparameters beside its final metrics."""

    def __init__(self) -> None:
        self._fit_metrics: set[str] = set()  # their names: testing clears fit's metrics

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._fit_metrics = set(trainer.callback_metrics)

    @rank_zero_only
    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The run's logged hyperparameters beside the names of its final metrics (fit's, which testing
        clears, and the test's), for TensorBoard's HPARAMS view. Only the names: HPARAMS shows each
        metric's last logged value, and logging the values again here (as ``log_hyperparams`` with
        ``metrics`` does) would add a point at the test's step to every validation curve."""
        names = {*self._fit_metrics, *trainer.callback_metrics}
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger) and logger.hparams:
                # Here, not at the top: 0.1 s of start-up (tensorboard's stub of TensorFlow) for every run
                from torch.utils.tensorboard.summary import hparams

                # Flattened and made plain as TensorBoardLogger.log_hyperparams does: model/optimizer/lr
                params = internals.flat_hyperparameters(logger.hparams, plain=True)
                experiment, start, end = hparams(params, dict.fromkeys(sorted(names), 0.0))
                writer = internals.tensorboard_file_writer(logger.experiment)
                for summary in (experiment, start, end):
                    writer.add_summary(summary)
