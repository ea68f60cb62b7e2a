"""Multi-process DDP on CPU (gloo), started as users start it: Lightning re-runs the script per rank."""

from pathlib import Path

import pytest
import torch

from conftest import run_script

pytestmark = pytest.mark.slow


def test_ddp_on_cpu_writes_one_run(tmp_path: Path) -> None:
    result = run_script(
        "train.py",
        "strategy=ddp",
        "trainer.devices=2",
        "trainer.max_epochs=2",
        "trainer.limit_train_batches=40",
        "trainer.limit_val_batches=10",
        f"paths.log_dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = (tmp_path / "train" / "runs").iterdir()  # one run directory, shared by both ranks
    assert [p.relative_to(run).as_posix() for p in run.rglob("config.yaml")] == [".hydra/config.yaml"]
    assert len(list(run.rglob("checkpoints"))) == 1 and (run / "checkpoints" / "last.ckpt").is_file()
    assert [p.name for p in run.rglob("hparams.yaml")] == ["hparams.yaml"]  # one TensorBoard run
    assert {p.name for p in run.glob("*.log")} == {"train.log", "train_ddp_process_1.log"}
    assert "Starting with 2 processes" in result.stdout
    # The console is rank 0's: rank 1 logs the same final line to its own file only.
    assert result.stdout.count("Tested ") == 1
    assert "Tested " in (run / "train_ddp_process_1.log").read_text()
    assert "[rank: 1]" not in result.stdout + result.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on machines without a GPU")
def test_gpu_only_strategy_stops_at_once_without_a_gpu(tmp_path: Path) -> None:
    result = run_script("train.py", "strategy=ddp_nccl", "trainer.devices=2", f"paths.log_dir={tmp_path}", timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "Error: trainer.accelerator=gpu (also set by strategy=ddp_nccl and strategy=fsdp) needs a CUDA GPU and this "
        "machine has none; use trainer.accelerator=cpu, with strategy=ddp for several processes"
    ]
