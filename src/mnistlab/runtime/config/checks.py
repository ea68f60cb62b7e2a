"""Refusing bad user input early, with a message that says what to change."""

import difflib
import logging
import os
import resource
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from omegaconf import DictConfig

from mnistlab.runtime.run.failures import InputError

log = logging.getLogger(__name__)
PER_CORE = 2  # CPU processes per core beyond which a run is refused (each would wait for the others most of the time)
INSIST = "allow_cpu_oversubscription"  # conf/run.yaml: true lifts the refusal, for experiments


def did_you_mean(parent: str, name: str, names: Iterable[str]) -> str | None:
    """``did you mean <parent>.<closest>?`` for a key ``name`` of ``parent`` that is not among ``names``."""
    close = difflib.get_close_matches(name, [other for other in names if other != name], n=1)
    return f"did you mean {parent}.{close[0]}?" if close else None


def group_set_to_null(argv: list[str], conf: Path) -> None:
    """``logger=null``, ``model/scheduler=null``: Hydra takes a config group's choice as a file's name only,
    and ends in a traceback. Switching a group off is its ``none`` option where it has one, else ``~group``."""
    for arg in argv[1:]:
        key, equals, value = arg.partition("=")
        group = key.lstrip("+")
        if equals and value.strip() in ("null", "~") and group and (conf / group).is_dir():
            off = f"{group}=none" if (conf / group / "none.yaml").is_file() else f"~{group}"
            raise InputError(f"{arg}: a group's choice is a file of conf/{group}/; to switch {group} off, write {off}")


def indivisible_batch(batch_size: int, world_size: int, named_by: str = "trainer.devices x trainer.num_nodes") -> str:
    """What to say of a global batch that the processes cannot share (schema.py, batches.py); ``named_by``:
    the settings that make the world size."""
    return (
        f"data.batch_size={batch_size} is the global batch (all devices of all nodes) and must be a multiple "
        f"of the world size {world_size} ({named_by}), at least {world_size}"
    )


def check_devices(cfg: DictConfig) -> None:
    """Refuse GPU-only settings on a machine without a GPU, before any process starts."""
    import torch  # here: this module is imported before the config is checked, and torch takes seconds

    accelerator = str(cfg.trainer.get("accelerator", "auto"))
    if torch.cuda.is_available():
        if accelerator == "cpu":
            check_cpu_processes(cfg)
        return
    if accelerator in ("gpu", "cuda"):
        raise InputError(
            f"trainer.accelerator={accelerator} (also set by strategy=ddp_nccl and strategy=fsdp) needs a CUDA GPU "
            "and this machine has none; use trainer.accelerator=cpu, with strategy=ddp for several processes"
        )
    strategy = cfg.trainer.get("strategy")
    if isinstance(strategy, Mapping) and strategy.get("process_group_backend") == "nccl":
        raise InputError(
            "the nccl backend (strategy=ddp_nccl) needs CUDA GPUs and this machine has none; "
            "use strategy=ddp (gloo on CPU) or strategy=ddp_gloo"
        )
    check_cpu_processes(cfg)


def check_cpu_processes(cfg: DictConfig) -> None:
    """``trainer.devices`` on the CPU is a number of processes on this machine, each a whole copy of the run:
    past its cores they share them (a warning), past ``PER_CORE`` per core or past what its memory holds at
    this process's size they are refused in one line, unless ``allow_cpu_oversubscription=true``."""
    processes, cores = _cpu_processes(cfg.trainer.get("devices")), _cores()
    if processes <= 1:
        return
    size, free = _resident_bytes(), _available_bytes()
    numbers = (
        f"trainer.devices={processes} starts {processes} processes on this machine's {cores} CPU cores, each at "
        f"least {size / 2**20:.0f} MB (this one, before loading data), {free / 2**30:.1f} GB of memory available"
    )
    too_many = processes > PER_CORE * cores or bool(free and processes * size > free)
    if too_many and not cfg.get(INSIST, False):
        raise InputError(
            f"{numbers}: too many to run side by side; lower trainer.devices (at most {PER_CORE * cores} here), or "
            f"insist with {INSIST}=true"
        )
    if processes > cores:
        log.warning("%s: they share the cores, so each step takes longer than with %d", numbers, cores)
    elif too_many:
        log.warning("%s: they may not fit in memory together", numbers)


def _cpu_processes(devices: object) -> int:
    """Processes per machine for ``trainer.devices`` on the CPU, by Lightning's rules ("auto" is 1, -1 a core each)."""
    if isinstance(devices, int):
        return (os.cpu_count() or 1) if devices == -1 else devices
    if isinstance(devices, str) and devices.strip().lstrip("-").isdigit():
        return _cpu_processes(int(devices))
    return len(devices) if isinstance(devices, list | tuple) else 1


def _cores() -> int:
    """The cores this process may run on (a SLURM or container limit among them)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _resident_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # macOS counts bytes, Linux KiB


def _available_bytes() -> int:
    """Memory the processes could take without swapping (Linux's MemAvailable; 0 where it cannot be read)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
