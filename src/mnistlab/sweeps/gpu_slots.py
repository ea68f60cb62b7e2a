"""Jobs of a sweep run side by side on one machine (``hydra/launcher=parallel``): on several GPUs,
each job trains on a GPU of its own.

Joblib's workers outlive the jobs and take the next job as soon as they are free, so a job's number
says nothing about which GPUs are busy. A job takes the first GPU whose lock file in the sweep folder
it can lock (``flock``: released by the kernel even when the job's process dies) and keeps it while it
trains; with every GPU taken it waits for one.
"""

import fcntl
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

PARALLEL_LAUNCHER = "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"
log = logging.getLogger(__name__)


@contextmanager
def own_gpu(cfg: DictConfig) -> Iterator[None]:
    """In a parallel sweep of one-GPU jobs on a machine with several GPUs, train on one no other job holds."""
    if not _parallel_sweep_job() or cfg.trainer.devices != 1 or cfg.trainer.accelerator not in ("gpu", "cuda", "auto"):
        yield
        return
    import torch

    if (gpus := torch.cuda.device_count()) < 2:
        yield
        return
    with claim(Path(HydraConfig.get().sweep.dir), gpus) as gpu:
        cfg.trainer.devices = [gpu]  # Lightning's way to name the device: a list of indices
        log.info("Training on GPU %d, which no other job of this sweep holds", gpu)
        yield


def _parallel_sweep_job() -> bool:
    hydra = HydraConfig.get() if HydraConfig.initialized() else None
    return hydra is not None and hydra.mode == RunMode.MULTIRUN and hydra.launcher._target_ == PARALLEL_LAUNCHER


@contextmanager
def claim(folder: Path, count: int, poll_s: float = 1.0) -> Iterator[int]:
    """Hold the first of ``count`` slots (lock files in ``folder``) that no other process holds."""
    while True:
        for slot in range(count):
            with (folder / f".gpu{slot}.lock").open("w") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue
                yield slot
                return  # closing the file releases the lock
        time.sleep(poll_s)
