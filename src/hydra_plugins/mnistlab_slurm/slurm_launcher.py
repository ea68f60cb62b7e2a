"""Hydra sweeps on SLURM (``hydra/launcher=slurm``): hydra-submitit-launcher's launcher, with one
log file per rank.

Each sweep job is a SLURM job of ``trainer.num_nodes x trainer.devices`` tasks, and every task runs
Hydra's job set-up: left alone, all of a job's ranks save its config and append to its train.log.
Here a task other than rank 0 saves no config and logs to ``<job name>_ddp_process_<rank>.log``,
as the ranks of every other launch path do (``mnistlab/launch.py``). Hydra takes launchers only from
its ``hydra_plugins`` namespace, hence this package beside ``mnistlab``.
"""

import logging
import os
from collections.abc import Sequence
from typing import Any

from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as SubmititSlurmLauncher


class _NoAccountingNoise(logging.Filter):
    """submitit asks sacct for its jobs' states every few seconds; on a cluster without accounting each
    call fails and submitit warns, twice a poll, for the whole sweep. It then goes by the jobs' result
    files, which is all this launcher needs. (sacct's own one-line complaint still reaches stderr.)"""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Bypassing sacct error" not in record.getMessage()


class SlurmLauncher(SubmititSlurmLauncher):
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        logging.getLogger("submitit").addFilter(_NoAccountingNoise())  # before any of its handlers
        return super().launch(job_overrides, initial_job_idx)

    def __call__(self, sweep_overrides: list[str], job_dir_key: str, *args: Any, **kwargs: Any) -> Any:
        rank = int(os.environ.get("SLURM_PROCID", "0"))  # this task's rank in the job, as Lightning reads it
        if rank:
            name = self.config.hydra.job.name
            sweep_overrides = [
                *sweep_overrides,
                "hydra.output_subdir=null",
                f"hydra.job.name={name}_ddp_process_{rank}",
            ]
        return super().__call__(sweep_overrides, job_dir_key, *args, **kwargs)
