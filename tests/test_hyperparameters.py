"""The hyperparameters a run's loggers record (runtime/reporting/hyperparameters.py): the config's list and every key
given on the command line, a group's option beside keys of that group, into every logger."""

from pathlib import Path
from typing import Any

import mlflow
import pytest
import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig

from mnistlab.runtime.reporting import hyperparameters

from composing import compose_config

# A group's option with keys of the same group, in either order: the most common command line of a user who
# has just added a config of their own (data=<theirs> data.<key>=...).
GIVEN = {
    "group first": ["data=suite", "data.noise=2.5", "model.net.hidden=8"],
    "keys first": ["model.net.hidden=8", "data.noise=2.5", "data=suite"],
}


def _compared(tmp_path: Path, given: list[str]) -> tuple[DictConfig, dict[str, Any]]:
    """The config ``given`` composes, and what its loggers would record of it."""
    cfg = compose_config("train", tmp_path, given, hydra=True)
    HydraConfig.instance().set_config(cfg)  # as @hydra.main does: the command line is read from it
    try:
        return cfg, hyperparameters.compared(cfg)
    finally:
        HydraConfig.instance().cfg = None


@pytest.mark.parametrize("order", list(GIVEN))
def test_a_groups_option_and_its_keys_are_recorded_side_by_side(order: str, tmp_path: Path) -> None:
    cfg, logged = _compared(tmp_path, GIVEN[order])
    assert logged["data"] == "suite" and logged["data/noise"] == 2.5 and logged["model/net/hidden"] == 8
    assert logged["model/optimizer/lr"] == cfg.model.optimizer.lr and logged["seed"] == cfg.seed  # conf's list
    assert not any(key.startswith("hydra") for key in logged)


def test_a_listed_key_the_config_lacks_is_left_out(tmp_path: Path) -> None:
    cfg = compose_config("train", tmp_path, ["hparams=[model.net.width,seed]"])
    assert hyperparameters.compared(cfg) == {"seed": cfg.seed}


@pytest.mark.parametrize("order", list(GIVEN))
@pytest.mark.parametrize("logger", ["tensorboard", "csv", "mlflow", "wandb"])
def test_every_logger_records_them(logger: str, order: str, tmp_path: Path) -> None:
    cfg, logged = _compared(tmp_path, [*GIVEN[order], f"logger={logger}"])
    (instance := instantiate(cfg.logger[logger])).log_hyperparams(logged)
    instance.save()
    if logger in ("tensorboard", "csv"):
        assert yaml.safe_load((tmp_path / logger / "hparams.yaml").read_text()) == logged
    elif logger == "mlflow":
        client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
        params = client.get_run(instance.run_id).data.params
        assert params == {key: str(value) for key, value in logged.items()}
    else:
        recorded = dict(instance.experiment.config)  # what the run holds, and syncs (offline: its .wandb file)
        instance.experiment.finish()
        assert recorded == logged
