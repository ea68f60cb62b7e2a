"""Hydra sweeps on Ray (``hydra/launcher=ray``): each job of a sweep runs as a Ray task, in a fresh worker
process of a Ray cluster (``hydra.launcher.address``; null: one on this machine, started for the sweep),
with the resources ``num_cpus`` and ``num_gpus`` reserve for it. A batch of jobs runs at once, as
many as the cluster has room for; any sweeper works through it, Optuna's with its pruning.

Written on Ray's public API (``ray.remote``, ``ray.get``) and Hydra's launcher interface: the Ray launcher
Hydra's repository kept (hydra-ray-launcher) pins Ray 1.x and Python 3.8 and was never released for
Hydra 1.3. A job runs Hydra's ``run_job`` as Hydra's own launchers do (hydra-joblib-launcher's
``execute_job``), so its folder, config and logs are those of any sweep job.
"""

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

log = logging.getLogger(__name__)


class RayLauncher(Launcher):
    def __init__(self, address: str | None, connect_timeout_s: float, num_cpus: float, num_gpus: float) -> None:
        self.address, self.connect_timeout_s = address, connect_timeout_s
        self.num_cpus, self.num_gpus = num_cpus, num_gpus
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.task_function, self.hydra_context = config, task_function, hydra_context

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import ray

        from mnistlab.runtime.distributed.ray_train import connect

        assert self.config is not None and self.task_function is not None and self.hydra_context is not None
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        connect(self.address, self.connect_timeout_s, "hydra.launcher")
        log.info("Launching %d jobs on Ray (%s), sweep output dir: %s", len(job_overrides), ray.cluster_resources(),
                 self.config.hydra.sweep.dir)  # fmt: skip
        for idx, overrides in enumerate(job_overrides):
            log.info("\t#%d : %s", initial_job_idx + idx, " ".join(filter_overrides(overrides)))
        # max_calls=1: each job in a process of its own, as a job started from the shell (no state of another
        # job's process group or signal handlers); max_retries=0: a job that dies is the sweeper's failed job.
        job = ray.remote(max_calls=1, max_retries=0, num_cpus=self.num_cpus, num_gpus=self.num_gpus)(_execute_job)
        shared = (self.hydra_context, self.config, self.task_function, Singleton.get_state(), os.getcwd())
        refs = [
            job.remote(initial_job_idx + idx, list(overrides), *shared) for idx, overrides in enumerate(job_overrides)
        ]
        return ray.get(refs)


def _execute_job(
    idx: int,
    overrides: list[str],
    hydra_context: HydraContext,
    config: DictConfig,
    task_function: TaskFunction,
    singleton_state: dict[Any, Any],
    cwd: str,
) -> JobReturn:
    """One job, in a Ray worker: Hydra's run_job, in the sweep's working folder."""
    os.chdir(cwd)  # relative paths of the config mean the sweep's folder (a shared one, on a cluster)
    setup_globals()
    Singleton.set_state(singleton_state)
    sweep_config = hydra_context.config_loader.load_sweep_config(config, overrides)
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = f"{sweep_config.hydra.job.name}_{idx}"
        sweep_config.hydra.job.num = idx
    HydraConfig.instance().set_config(sweep_config)
    return run_job(
        hydra_context=hydra_context,
        config=sweep_config,
        task_function=task_function,
        job_dir_key="hydra.sweep.dir",
        job_subdir_key="hydra.sweep.subdir",
    )
