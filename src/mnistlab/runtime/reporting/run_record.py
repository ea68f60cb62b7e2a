"""What a reviewer asks of a run first: which code, which versions, which data, which machine.

``RunRecord`` (a Lightning callback, ``conf/callbacks/run_record.yaml``) writes ``run_info.json`` in the
run's folder as fitting starts (rank 0): the git commit and whether the tree was dirty (the diff saved
beside it as ``run_info.diff``, and its hash), the command line, the versions of Python and the key
packages, the OS, CPU and GPU model and count, nodes x devices, the seed, the data files the data module
reads with their SHA-256 (cached by path, size and modification time: computed once per file), the start
time; then the end time and how the run ended. Each checkpoint carries the essentials (``run_info``:
commit, diff hash, versions, data), which ``differences`` compares with the present code and data for
the entry points that read a checkpoint (``eval.py``, ``predict.py``, ``resume=``): one warning line;
and what one input of the network was (``input``: its shape and dtype, from the first training batch),
so that the server refuses an input of another shape naming both, without the data at hand.
"""

import hashlib
import json
import logging
import os
import platform
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_only

from mnistlab.runtime.reporting import provenance
from mnistlab.runtime.run import atomic, run_folder

log = logging.getLogger(__name__)

PACKAGES = ["lightning", "torchmetrics", "hydra-core", "omegaconf", "numpy", provenance.PACKAGE]
CHECKPOINT_KEY = "run_info"  # the essentials, in each checkpoint
ESSENTIALS = ["commit", "diff_sha256", "versions", "data"]
INPUT_KEY = "input"  # one input of the network, in each checkpoint: {"shape": [...], "dtype": "float32"}


class RunRecord(L.Callback):
    def __init__(self, folder: str, seed: int | None = None) -> None:
        self.folder, self.seed = Path(folder), seed
        self.record: dict[str, Any] = {}
        self.input: dict[str, Any] | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if not self.record:  # every rank: each checkpoint carries the same essentials
            self.record = describe(trainer, self.seed)
            self._write(status="running")
            if self.record["diff_sha256"] and trainer.is_global_zero:
                atomic.write_text(self.folder / run_folder.RECORD_DIFF_FILE, provenance.diff())

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, index: int) -> None:
        if self.input is None:  # once: every batch of a run has the same inputs
            inputs = batch[0] if isinstance(batch, list | tuple) else batch
            if isinstance(inputs, torch.Tensor):
                self.input = {"shape": list(inputs.shape[1:]), "dtype": str(inputs.dtype).removeprefix("torch.")}

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        checkpoint[CHECKPOINT_KEY] = {key: self.record.get(key) for key in ESSENTIALS}
        if self.input is not None:
            checkpoint[INPUT_KEY] = self.input

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        self.input = checkpoint.get(INPUT_KEY, self.input)  # a resumed run's checkpoints keep saying it

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._write(status=f"failed: {type(exception).__name__}: {exception}".splitlines()[0])

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.record and not self.record.get("status", "").startswith("failed"):
            self._write(status="interrupted" if trainer.interrupted else "finished")

    @rank_zero_only
    def _write(self, status: str) -> None:
        self.record |= {"status": status, "end": _now()} if status != "running" else {"status": status}
        atomic.write_text(self.folder / run_folder.RECORD_FILE, json.dumps(self.record, indent=2) + "\n")


def describe(trainer: L.Trainer, seed: int | None) -> dict[str, Any]:
    """The record of a run about to fit with ``trainer``."""
    return {
        "start": _now(),
        "command": [Path(sys.argv[0]).name, *sys.argv[1:]],
        "commit": provenance.commit(),
        "diff_sha256": _diff_sha256(),
        "versions": versions(),
        "machine": machine(trainer),
        "seed": seed,
        "data": checksums(data_files(getattr(trainer, "datamodule", None))),
    }


def versions() -> dict[str, str]:
    found = {
        "python": platform.python_version(),
        "torch": str(torch.__version__),
    }  # torch's says its build: +cu130, +cpu
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def machine(trainer: L.Trainer) -> dict[str, Any]:
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return {
        "os": platform.platform(),
        "host": platform.node(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "gpus": gpus,
        "cuda": torch.version.cuda if gpus else None,
        "nodes": trainer.num_nodes,
        "devices_per_node": trainer.num_devices,
        "accelerator": type(trainer.accelerator).__name__.removesuffix("Accelerator").lower(),
    }


def _cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    except (OSError, StopIteration):  # not Linux, or an ARM CPU without the line
        return platform.processor() or platform.machine()


def data_files(datamodule: Any) -> list[Path]:
    """The files the data module reads: its ``data_files()``, where it says (data generated in memory reads none)."""
    files = getattr(datamodule, "data_files", None)
    return [Path(f) for f in files()] if callable(files) else []


def checksums(files: list[Path]) -> dict[str, str]:
    """SHA-256 of each file by name (the data's folder differs between machines); a file's hash is kept in
    the user's cache while its size and modification time stay."""
    cache_file = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / provenance.PACKAGE / "checksums.json"
    try:
        cache = json.loads(cache_file.read_text())
    except (OSError, ValueError):  # none yet, or unreadable: computed again
        cache = {}
    sums = {f.name: _checksum(f.resolve(), cache) for f in files if f.is_file()}
    try:
        atomic.write_text(cache_file, json.dumps(cache, indent=1))
    except OSError:  # a read-only home: the record still holds the sums
        pass
    return sums


def _checksum(path: Path, cache: dict[str, Any]) -> str:
    stat = path.stat()
    key, stamp = str(path), [stat.st_size, stat.st_mtime_ns]
    if cache.get(key, {}).get("stamp") != stamp:
        digest = hashlib.sha256()
        with path.open("rb") as file:
            while chunk := file.read(1 << 20):
                digest.update(chunk)
        cache[key] = {"stamp": stamp, "sha256": digest.hexdigest()}
    return cache[key]["sha256"]


def differences(checkpoint: dict[str, Any], data_files: list[Path] | None = None) -> list[str]:
    """How the code (and, given ``data_files``, the data) of now differ from those that wrote ``checkpoint``."""
    saved = checkpoint.get(CHECKPOINT_KEY)
    if not saved:
        return []
    found = []
    if saved.get("commit") != provenance.commit() or saved.get("diff_sha256") != _diff_sha256():
        found.append(f"code {saved.get('commit')} (now {provenance.commit()})")
    now = versions()
    found += [
        f"{name} {v} (now {now.get(name)})" for name, v in (saved.get("versions") or {}).items() if now.get(name) != v
    ]
    if data_files is not None:
        present = checksums(data_files)
        found += [
            f"data file {name} differs" for name, s in (saved.get("data") or {}).items() if present.get(name, s) != s
        ]
    return found


def warn_if_different(checkpoint: dict[str, Any], name: str, data_files: list[Path] | None = None) -> None:
    """One warning line when ``checkpoint`` (called ``name``) was written by other code, versions or data."""
    if found := differences(checkpoint, data_files):
        log.warning("%s was written by other code or data than now: %s", name, "; ".join(found))


def _diff_sha256() -> str | None:
    diff = provenance.diff()
    return hashlib.sha256(diff.encode()).hexdigest() if diff else None


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
