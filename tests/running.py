"""How the tests run the project as a user would: entry points in processes of their own, servers on
free ports, short trainings; and what they compare of the runs (one folder, the same weights)."""

import itertools
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import torch

from mnistlab.runtime.run import run_folder

import processes
import suite_task
from composing import DATA_DIR, EQUIVALENCE, ROOT, SHORT, SUITE, compose_config


def last_checkpoint(run: Path) -> dict:
    return torch.load(run_folder.last_checkpoint(run), weights_only=True)


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


TRAINERS = processes.TRAINERS  # the entry points whose config holds a Trainer


def run_script(
    script: str, *overrides: str, timeout: float = 300, cpu: bool = True, task: Sequence[str] = SUITE
) -> subprocess.CompletedProcess[str]:
    """Run an entry point as a user would, in its own process (needed for DDP: Lightning re-runs it), on
    ``task`` (see compose_config). ``cpu``: first of all, trainer.accelerator=cpu: the tests mean CPU
    processes (gloo), which auto would turn into GPUs (nccl) on a machine that has some."""
    pinned = ["trainer.accelerator=cpu"] if cpu and script in TRAINERS else []
    flags = list(itertools.takewhile(lambda arg: arg.startswith("-"), overrides))  # -m: before any override
    command = processes.python(script, *flags, *pinned, *overrides[len(flags) :], task=task)
    return processes.run(command, timeout=timeout)


def train_like_one_process(out: Path, *overrides: str) -> Path:
    """Train EQUIVALENCE's run in ``out`` (hydra.run.dir), with ``overrides``: the ranks, a checkpoint."""
    result = run_script("train.py", *EQUIVALENCE, *overrides, f"hydra.run.dir={out}")
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def one_process_reference(out: Path, *overrides: str) -> Path:
    """EQUIVALENCE's run on one process, this one (no process to start: the reference the ranks are compared
    with), in ``out``."""
    from mnistlab.tasks import train

    train(compose_config("train", out, [*EQUIVALENCE, *overrides]))
    return out


def assert_trained_as_one_process(run: Path, one_process: Path) -> None:
    """``run`` ends with the weights and Adam state of the single-process run, which moved every weight."""
    one, other = last_checkpoint(one_process), last_checkpoint(run)
    assert one["global_step"] == other["global_step"] == 40
    torch.manual_seed(42)  # the runs' seed: their common starting point
    for name, initial in suite_task.Net().state_dict().items():  # tests/conf/model/suite.yaml's network
        assert (one["state_dict"][f"net.{name}"] - initial).abs().max() > 1e-3  # 40 Adam steps moved it
    # 3e-4, a thirtieth of one Adam step at lr 1e-2: gloo sums 4 ranks' gradients in another order than one
    # process does, and Adam's division by the root of a near-zero second moment magnifies that for the
    # rare weight whose gradients are near 0. A shard served twice or missed, or a rank on its own batch,
    # moves every weight by far more.
    assert_same_training(one, other, atol=3e-4)


def answering(url: str) -> bool:
    """Whether ``url`` answers 200 (False while nothing listens there yet)."""
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def free_port() -> str:
    """A port for the rendezvous of processes that are started separately."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


# The logs of a run of four ranks: rank 0's, then one per other global rank.
FOUR_RANK_LOGS = frozenset(
    {"train.log", "train_ddp_process_1.log", "train_ddp_process_2.log", "train_ddp_process_3.log"}
)


def one_run(log_dir: Path, logs: set[str] = frozenset({"train.log", "train_ddp_process_1.log"})) -> Path:
    """The one run folder of ``log_dir``: one saved config, one TensorBoard run, one log per rank."""
    (run,) = (log_dir / "train" / "runs").iterdir()
    assert_one_run(run, logs)
    return run


def assert_one_run(run: Path, logs: set[str]) -> None:
    assert [p.relative_to(run).as_posix() for p in run.rglob("config.yaml")] == [".hydra/config.yaml"]
    assert {p.name for p in run.glob("*.log")} == logs
    assert [p.name for p in run.rglob("hparams.yaml")] == ["hparams.yaml"]
    for rank, log in enumerate(sorted(logs - {"train.log"}), start=1):  # each rank wrote its own file
        assert f"GLOBAL_RANK: {rank}, MEMBER: {rank + 1}/{len(logs)}" in (run / log).read_text(), log


def trained(out: Path, task: Sequence[str]) -> Path:
    """The best checkpoint of a short run of ``task`` in ``out``."""
    from mnistlab.tasks import train  # not at import: see tests/faults.py

    train(compose_config("train", out, [*SHORT, "logger=none"], task=task))
    (best,) = run_folder.checkpoints(out).glob("epoch*.ckpt")
    return best


@contextmanager
def serving(
    out: Path,
    *overrides: str,
    script: str = "serve.py",
    ready: str = "/health",
    project: Path | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[str]:
    """A server entry point (serve.py, demo.py) running on a free local port, as a user starts it (of
    ``project``, a generated one, where given); yields its address once ``ready`` answers 200, and ends its
    process group after."""
    port = free_port()
    arguments = [f"port={port}", f"paths.data_dir={DATA_DIR}", f"hydra.run.dir={out}", *overrides]
    command = processes.python(script, *arguments) if project is None else [sys.executable, script, *arguments]
    with open(out.parent / f"{out.name}.log", "w") as log:
        server = processes.start(command, output=log, cwd=project or ROOT, env=env)
    url = f"http://127.0.0.1:{port}"

    def tail() -> str:
        return (out.parent / f"{out.name}.log").read_text()[-3000:]

    def answers() -> bool:
        assert server.poll() is None, f"{script} ended ({server.returncode}): {tail()}"
        return answering(url + ready)

    processes.until(answers, 120, lambda: f"{script} ready: {tail()}", every=0.5)
    try:
        yield url
    finally:
        processes.end_group(server)
        server.wait()


@contextmanager
def small_disk(disk: Path, size: str) -> Iterator[Path]:
    """A file system of ``size`` (tmpfs, ``4m``) mounted at ``disk``: a disk that runs full."""
    disk.mkdir()
    command = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)]
    mounted = subprocess.run(command, capture_output=True, check=False, timeout=30)
    if mounted.returncode:
        pytest.skip(f"mounting a small tmpfs needs root: {mounted.stderr.decode().strip()}")  # in CI: a failure
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False, timeout=30)
