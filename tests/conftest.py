"""Shared fixtures: the real ``conf/``, composed with small overrides and temporary output folders."""

import os
import signal as signal_module
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from mnistlab.checkpoint_io import AtomicCheckpointIO

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


def compose_config(name: str, out: Path, overrides: Sequence[str] = ()) -> DictConfig:
    """Compose ``conf/<name>.yaml`` as the entry point would, writing everything under ``out``."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(
            config_name=name,
            overrides=[f"paths.log_dir={out}", f"paths.output_dir={out}", "trainer.accelerator=cpu", *overrides],
        )


def run_script(script: str, *overrides: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run an entry point as a user would, in its own process (needed for DDP: Lightning re-runs it).
    The test helpers below are importable there as ``conftest.<name>``."""
    return subprocess.run(
        [sys.executable, str(ROOT / script), *overrides],
        cwd=ROOT,
        env=os.environ | {"PYTHONPATH": str(ROOT / "tests")},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,  # the tests read the exit status and the messages themselves
    )


@pytest.fixture
def train_cfg(tmp_path: Path) -> DictConfig:
    return compose_config("train", tmp_path, [*SHORT, "logger=csv"])


class SignalAt(L.Callback):
    """Sends this process ``signal`` as batch ``step`` starts on ``rank`` of a run that starts afresh
    (a resumed one runs through): a signal from outside, at a step the test knows
    (``+callbacks.signal._target_=conftest.SignalAt``, with ``PYTHONPATH=tests``)."""

    def __init__(self, step: int, signal: str = "SIGTERM", rank: int = 0) -> None:
        self.step, self.signal, self.rank = step, getattr(signal_module, signal), rank

    def on_train_batch_start(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step == self.step and trainer.global_rank == self.rank and trainer.ckpt_path is None:
            os.kill(os.getpid(), self.signal)


class PoisonAt(L.Callback):
    """Turns one weight into NaN as batch ``step`` starts on ``rank``: the run diverges there."""

    def __init__(self, step: int, rank: int = 0) -> None:
        self.step, self.rank = step, rank

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: object) -> None:
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            with torch.no_grad():
                next(pl_module.parameters()).view(-1)[0] = float("nan")


class KilledMidWrite(AtomicCheckpointIO):
    """The checkpoint writer, killed (SIGKILL) halfway through writing the checkpoint of step ``step``;
    once: the partial file that kill leaves behind tells a resumed run it happened."""

    def __init__(self, step: int) -> None:
        super().__init__()
        self.step = step

    def save_checkpoint(self, checkpoint: dict, path: str | Path, storage_options: object = None) -> None:
        partial = Path(path).with_name(f".{Path(path).name}.partial")
        if checkpoint["global_step"] != self.step or partial.exists():
            return super().save_checkpoint(checkpoint, path, storage_options)
        with partial.open("wb") as file:
            file.write(b"half a checkpoint")
            file.flush()
            os.kill(os.getpid(), signal_module.SIGKILL)
