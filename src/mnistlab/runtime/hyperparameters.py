"""The hyperparameters a run's loggers record: the config's short list ``hparams`` and every key given on
the command line (what a sweep varies is among them), so that TensorBoard's HPARAMS table and MLflow's
params open on what runs are compared by rather than on all of the config's hundred keys. The whole
config stays in the run's ``.hydra/config.yaml``, in each checkpoint, and as MLflow's ``config.yaml``.
"""

from typing import Any

from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.loggers import Logger, MLFlowLogger
from omegaconf import DictConfig, OmegaConf


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
