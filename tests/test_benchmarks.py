# Part of the MNIST example: a project generated without it has no such file.
"""The benchmarks run: their quickest table, and a refusal where they cannot measure."""

import json
import sys
from pathlib import Path

import pytest
from speed import REFUSALS

import processes

pytestmark = [pytest.mark.slow, pytest.mark.yours]  # yours: the example's checkpoint


def test_the_refusal_benchmark_times_each_mistake_against_importing_torch(tmp_path: Path) -> None:
    command = [sys.executable, "benchmarks/speed.py", "--refusals", "--repeats", "1", "--out", str(tmp_path)]
    result = processes.run(command, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    (written,) = tmp_path.glob("speed-*.json")
    rows = json.loads(written.read_text())
    assert {"import torch, lightning", *REFUSALS} <= rows.keys()
    assert all(rows[name] > 0 for name in ("import torch, lightning", *REFUSALS))
    ratios = [name for name in rows if name.startswith("answer ratio")]
    assert len(ratios) == len(REFUSALS) and all(0 < rows[name] < 1 for name in ratios)  # faster than an import
    assert f"written to {written}" in result.stdout


@pytest.mark.no_gpu
def test_the_gpu_benchmark_says_this_machine_has_no_gpu(tmp_path: Path) -> None:
    command = [sys.executable, "benchmarks/speed.py", "--gpu", "--out", str(tmp_path)]
    result = processes.run(command, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip() == "--gpu: this machine has no CUDA GPU; run without --gpu to measure the CPU"
    assert not list(tmp_path.iterdir())


def test_the_serving_benchmark_times_the_server_beside_in_process(trained_example: Path, tmp_path: Path) -> None:
    command = [
        sys.executable, "benchmarks/serving.py", "--model", str(trained_example), "--clients", "1", "4",
        "--requests", "64", "--repeats", "1", "--seconds", "1", "--out", str(tmp_path),
    ]  # fmt: skip
    result = processes.run(command, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    (written,) = tmp_path.glob("serving-*.json")
    rows = json.loads(written.read_text())
    timed = [f"server, {n} clients, {k}" for n in (1, 4) for k in ("images/s", "p50 ms", "p99 ms")]
    timed += [f"server, {n} clients of JSON batches of 32, images/s" for n in (1, 4)]
    assert all(rows[name] > 0 for name in ["in-process images/s", *timed])
    assert rows["server, 4 clients, p50 ms"] <= rows["server, 4 clients, p99 ms"]
    ratio = rows["server, 4 clients, images/s"] / rows["in-process images/s"]
    assert rows["server at 4 clients / in-process (target >= 0.6)"] == round(ratio, 3)
