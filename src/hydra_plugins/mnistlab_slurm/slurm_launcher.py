"""Hydra sweeps on SLURM (``hydra/launcher=slurm``): hydra-submitit-launcher's launcher, with one
log file per rank.

Each sweep job is a SLURM job of ``trainer.num_nodes x trainer.devices`` tasks, and every task runs
Hydra's job set-up: left alone, all of a job's ranks save its config and append to its train.log.
Here a task other than rank 0 saves no config and logs to ``<job name>_ddp_process_<rank>.log``,
as the ranks of every other launch path do (``mnistlab/runtime/run/launch.py``); and on a cluster without
accounting, job states come from squeue instead of sacct. Hydra takes launchers only from its
``hydra_plugins`` namespace, hence this package beside ``mnistlab``. Hydra imports every plugin at
start-up: submitit itself is imported only when a sweep is launched.
"""

import subprocess
from collections.abc import Sequence
from typing import Any

from mnistlab.runtime.run import launch

try:
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as SubmititSlurmLauncher
except ImportError:  # without the slurm extra there is nothing to extend (and Hydra would warn at every start)
    SubmititSlurmLauncher = object


class SlurmLauncher(SubmititSlurmLauncher):
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        if not _has_accounting():
            from submitit.slurm.slurm import SlurmJob

            SlurmJob.watcher = _queue_watcher()  # submitit's class-wide watcher, made as submitit makes it
        return super().launch(job_overrides, initial_job_idx)

    def __call__(self, sweep_overrides: list[str], job_dir_key: str, *args: Any, **kwargs: Any) -> Any:
        started = launch.current()  # this task's place in the job
        if started.rank:
            name = launch.log_name(started.rank, self.config.hydra.job.name)
            sweep_overrides = [*sweep_overrides, "hydra.output_subdir=null", f"hydra.job.name={name}"]
        return super().__call__(sweep_overrides, job_dir_key, *args, **kwargs)


def _has_accounting() -> bool:
    shown = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, check=False)
    return "accounting_storage/none" not in shown.stdout


def _queue_watcher() -> Any:
    """submitit's job-state watcher, reading squeue: on a cluster without accounting every sacct call
    fails, and submitit warns about it (and sacct complains on stderr) every few seconds of a sweep."""
    from submitit.slurm.slurm import SlurmInfoWatcher

    class QueueWatcher(SlurmInfoWatcher):
        def _make_command(self) -> list[str] | None:
            jobs = ",".join({job.split("_")[0] for job in self._registered - self._finished})
            return ["squeue", "--noheader", "--states=all", "--format=%i|%T|%N", f"--jobs={jobs}"] if jobs else None

        def read_info(self, string: bytes | str) -> dict[str, dict[str, str]]:
            text = string.decode() if isinstance(string, bytes) else string
            return super().read_info("JobID|State|NodeList\n" + text)  # the header sacct would print

    return QueueWatcher(delay_s=600)
