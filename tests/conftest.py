"""Shared fixtures: the real ``conf/``, composed with small overrides and temporary output folders."""

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

import processes

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("PROJECT_ROOT", str(ROOT))
# MNIST comes from $DATA_DIR (CI points it at a prepared copy); without it, the project's data/,
# where the data module downloads MNIST on first use.
DATA_DIR = os.environ.setdefault("DATA_DIR", str(ROOT / "data"))

# A few batches of everything: enough to exercise every hook on real data.
SHORT = [
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=20",
    "trainer.limit_val_batches=5",
    "trainer.limit_test_batches=5",
]

# 3 epochs of 30 steps, deterministic: runs that were stopped and resumed can be compared exactly.
DETERMINISTIC = [
    "trainer.max_epochs=3",
    "trainer.limit_train_batches=30",
    "trainer.limit_val_batches=3",
    "trainer.limit_test_batches=3",
    "trainer.deterministic=true",
]

# Two trials that draw both values of choice(1e30,1e-3), first 1e-3: the random sampler, seeded. Not the grid
# sampler: with it, hydra-optuna-sweeper 1.3 crashes ("Study.stop is supposed to be invoked inside an objective
# function") when the grid's last trial is the one that failed, and the grid's order is random.
OPTUNA_BOTH_VALUES = [
    "hydra/sweeper/sampler=random",
    "hydra.sweeper.sampler.seed=0",
    "hydra.sweeper.n_trials=2",
    "hydra.sweeper.direction=maximize",
]


MARKER = "payload-ran"  # created in the test's folder by any payload that runs


class Payload:
    """Unpickled, it runs ``touch <marker>``: what torch.load(weights_only=False) would do with it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def config_payloads(marker: Path) -> list[dict]:
    """Network configs that would run code if instantiated: each passes torch.load(weights_only=True)."""
    touch = f"open({str(marker)!r}, 'w')"
    return [
        {"_target_": "builtins.exec", "_args_": [touch]},
        {"_target_": "os.system", "command": f"touch {marker}"},
        {"_target_": "mnistlab.tasks.os.system", "command": f"touch {marker}"},  # our prefix, not our class
        {"_target_": "mnistlab.trained.torch.load", "f": str(marker), "weights_only": False},
        {"_target_": "subprocess.Popen", "args": ["touch", str(marker)]},
        {"_target_": "mnistlab.network.SimpleNN", "hidden": {"_target_": "builtins.exec", "_args_": [touch]}},
    ]


@pytest.fixture
def payload_checkpoint(trained_checkpoint: Path, tmp_path: Path) -> Path:
    """The trained checkpoint with its network's config replaced by a payload."""
    checkpoint = torch.load(trained_checkpoint, weights_only=True)
    checkpoint["config"]["model"]["net"] = config_payloads(tmp_path / MARKER)[0]
    torch.save(checkpoint, tmp_path / "config_payload.ckpt")
    return tmp_path / "config_payload.ckpt"


@pytest.fixture
def pickle_checkpoint(trained_checkpoint: Path, tmp_path: Path) -> Path:
    """The trained checkpoint with a pickled object that runs code when unpickled."""
    checkpoint = torch.load(trained_checkpoint, weights_only=True)
    checkpoint["hyper_parameters"] = {"note": Payload(tmp_path / MARKER)}
    torch.save(checkpoint, tmp_path / "pickle_payload.ckpt")
    return tmp_path / "pickle_payload.ckpt"


def last_checkpoint(run: Path) -> dict:
    return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)


def assert_same_weights(a: dict, b: dict, atol: float = 1e-6) -> None:
    """The checkpoints ``a`` and ``b`` hold the same weights and metric states."""
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for name, value in a["state_dict"].items():
        torch.testing.assert_close(
            b["state_dict"][name], value, rtol=0, atol=atol, msg=lambda m, name=name: f"{name}: {m}"
        )


def assert_same_training(a: dict, b: dict, atol: float = 1e-6) -> None:
    """The same weights, and the same optimizer state (Adam's step count and moments, every parameter)."""
    assert_same_weights(a, b, atol)
    (first,), (second,) = a["optimizer_states"], b["optimizer_states"]
    assert first["state"].keys() == second["state"].keys() and first["state"]
    for index, state in first["state"].items():
        for key, value in state.items():
            # Adam's second moment is a square: its scale is the gradient's squared, not the weights'.
            where = f"optimizer state {index}.{key}"
            torch.testing.assert_close(
                second["state"][index][key], value, rtol=1e-4, atol=atol, msg=lambda m, where=where: f"{where}: {m}"
            )


def compose_config(name: str, out: Path, overrides: Sequence[str] = ()) -> DictConfig:
    """Compose ``conf/<name>.yaml`` as the entry point would, writing everything under ``out``."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(
            config_name=name,
            overrides=[f"paths.log_dir={out}", f"paths.output_dir={out}", "trainer.accelerator=cpu", *overrides],
        )


def run_script(script: str, *overrides: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run an entry point as a user would, in its own process (needed for DDP: Lightning re-runs it)."""
    return processes.run(processes.python(script, *overrides), timeout=timeout)


@pytest.fixture
def train_cfg(tmp_path: Path) -> DictConfig:
    return compose_config("train", tmp_path, [*SHORT, "logger=csv"])


@pytest.fixture(scope="session")
def trained_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The best checkpoint of a short run, for the tests that use one (predict, export)."""
    from mnistlab.tasks import train  # not at import: see tests/faults.py

    out = tmp_path_factory.mktemp("trained")
    train(compose_config("train", out, [*SHORT, "logger=none"]))
    (best,) = (out / "checkpoints").glob("epoch*.ckpt")
    return best
