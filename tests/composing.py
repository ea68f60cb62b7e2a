"""What the tests compose and train: the real ``conf/``, the suite's own task or conf/'s, small override
lists, temporary output folders."""

import functools
import os
from collections.abc import Sequence
from pathlib import Path

import tomllib
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from mnistlab.runtime.config import hydra_versions
from mnistlab.trained import loading

import processes

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("PROJECT_ROOT", str(ROOT))
# Data files come from $DATA_DIR (CI points it at a prepared copy); without it, from the project's
# data/, where a data module downloads what it needs on first use.
DATA_DIR = os.environ.setdefault("DATA_DIR", str(ROOT / "data"))

SUITE = processes.SUITE  # what the machinery's tests train: the suite's own task (tests/suite_task.py)
SUITE_DATA = yaml.safe_load((ROOT / "tests" / "conf" / "data" / "suite.yaml").read_text())  # its sizes, by name
# What the example's own tests and the contract test train: whatever conf/ composes by default.
OWN: list[str] = []
# The modules a checkpoint of the suite's task names (conf/trust.yaml's, and the suite's own).
TRUSTED = (*loading.TRUSTED, "suite_task")
TRUST_SUITE = f"trusted_modules=[{','.join(TRUSTED)}]"
SUITE_MODULES = ["suite_task.*", "faults.*", "test_batch_hooks.*"]  # the suite's own classes that configs name


# A checkpoint every 7 steps, each kept as step<N>.ckpt: mid-epoch ones to resume from.
EVERY_7_STEPS = [
    "callbacks.model_checkpoint.monitor=null",
    "callbacks.model_checkpoint.save_top_k=-1",
    "callbacks.model_checkpoint.filename='step{step}'",
    "callbacks.model_checkpoint.every_n_train_steps=7",
    "callbacks.model_checkpoint.every_n_epochs=null",
]

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


# Runs from the same seed over the same 2 epochs of 20 global batches (the second epoch reshuffled): one
# process, and 2 or 4 ranks however they are started, stopped and resumed, must end with the same weights.
EQUIVALENCE = [
    "trainer.max_epochs=2",
    "trainer.limit_train_batches=20",
    "trainer.limit_test_batches=2",
    "trainer.accelerator=cpu",
]  # and all validation samples: each validated once, on any number of ranks


@functools.cache  # read once per config, not once per composition
def _of_a_run(name: str) -> bool:
    return "run" in yaml.safe_load((ROOT / "conf" / f"{name}.yaml").read_text())["defaults"]


def compose_config(
    name: str, out: Path, overrides: Sequence[str] = (), hydra: bool = False, task: Sequence[str] = SUITE
) -> DictConfig:
    """Compose ``conf/<name>.yaml`` as the entry point would, writing everything under ``out``; a config
    of a run (conf/run.yaml among its defaults: train, eval, stream) takes ``task`` (the suite's, or ``OWN``:
    conf/'s default) on the CPU. With ``hydra``, Hydra's own config too (``cfg.hydra``: the sweeper, the
    launcher)."""
    trains = [*task, "trainer.accelerator=cpu"] if _of_a_run(name) else []
    with initialize_config_dir(config_dir=str(ROOT / "conf"), **hydra_versions.BASE):
        return compose(
            config_name=name,
            overrides=[*trains, f"paths.log_dir={out}", f"paths.output_dir={out}", *overrides],
            return_hydra_config=hydra,
        )


def locked_versions(project: Path) -> dict[str, set[str]]:
    """uv.lock's packages and their versions (one package may have several: one per Python range)."""
    versions: dict[str, set[str]] = {}
    for package in tomllib.loads((project / "uv.lock").read_text())["package"]:
        versions.setdefault(package["name"], set()).add(package["version"])
    return versions
