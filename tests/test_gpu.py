"""On CUDA GPUs: what the CPU tests show with gloo, shown with CUDA and nccl. Each test skips where the
machine has fewer GPUs than it needs (the only skip CI allows, conftest.py)."""

import json
import re
from pathlib import Path

import pytest
import torch

from composing import EQUIVALENCE, SHORT, SUITE_DATA
from running import assert_same_training, last_checkpoint, run_script

pytestmark = pytest.mark.slow

GPU = ["trainer.accelerator=gpu", "float32_matmul_precision=highest"]  # full float32: comparable to a reference


def _run(out: Path, *overrides: str) -> Path:
    result = run_script("train.py", *overrides, *GPU, f"hydra.run.dir={out}", cpu=False)  # GPU last: it wins
    assert result.returncode == 0, result.stderr[-3000:]
    return out


@pytest.mark.gpu
def test_a_fast_dev_run_trains_and_tests_on_the_gpu(tmp_path: Path) -> None:
    run = _run(tmp_path, "debug=fdr")
    assert "GPU available: True (cuda), used: True" in (run / "train.log").read_text()
    assert json.loads((run / "metrics.json").read_text())["test/samples"] == SUITE_DATA["batch_size"]


@pytest.mark.gpu
def test_bf16_mixed_precision_learns_and_keeps_float32_weights(tmp_path: Path) -> None:
    run = _run(tmp_path, *SHORT, "trainer.precision=bf16-mixed", "logger=none")
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["test/acc"] > 0.5 and torch.isfinite(torch.tensor(metrics["test/loss"]))
    weights = last_checkpoint(run)["state_dict"]
    assert all(value.dtype == torch.float32 for name, value in weights.items() if name.startswith("net."))


@pytest.mark.gpu(count=2)
def test_two_gpus_with_nccl_train_as_one_gpu(tmp_path: Path) -> None:
    one = _run(tmp_path / "one", *EQUIVALENCE)
    two = _run(tmp_path / "two", *EQUIVALENCE, "strategy=ddp_nccl", "trainer.devices=2")
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in (two / "train_ddp_process_1.log").read_text()
    assert last_checkpoint(two)["global_step"] == 40
    assert_same_training(last_checkpoint(one), last_checkpoint(two), atol=1e-4)  # CUDA's sums: not bit for bit


@pytest.mark.gpu(count=2)
def test_a_parallel_sweep_gives_each_job_a_gpu_of_its_own(tmp_path: Path) -> None:
    sweep = ["-m", "hydra/launcher=parallel", "model.optimizer.lr=1e-3,3e-3", *SHORT, "logger=none"]
    result = run_script("train.py", *sweep, *GPU, f"paths.log_dir={tmp_path}", cpu=False)
    assert result.returncode == 0, result.stderr[-3000:]
    (folder,) = (tmp_path / "train" / "multiruns").iterdir()
    held = [
        re.search(r"Training on GPU (\d+), which no other job", (folder / job / "train.log").read_text())
        for job in ("0", "1")
    ]
    assert all(held) and {match[1] for match in held} == {"0", "1"}
