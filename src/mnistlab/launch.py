"""How the processes of a job start, when Hydra sweeps over distributed jobs.

Lightning's DDP launcher starts a job's extra ranks by re-running the command line. In a Hydra sweep
that command line is the whole sweep (``-m ...``): each re-launched rank would run every job of it,
in a second sweep folder, and an adaptive sweeper could pair ranks with different hyperparameters.
So a sweep job that needs several processes re-runs itself as a plain single run in a fresh process,
with exactly its own overrides and its own folder. Lightning then starts that run's ranks, and their
process group lives and dies with the job, whatever sweeper or Hydra launcher made it.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

METRICS_FILE = "metrics.json"  # written by rank 0 of every training run, read back by its sweep job


def is_distributed_sweep_job(cfg: DictConfig) -> bool:
    """True for a job of a Hydra multirun (by Hydra's run mode) that runs on several processes."""
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return False
    return str(cfg.trainer.devices) != "1" or int(cfg.trainer.num_nodes) != 1


def run_job_in_fresh_processes() -> dict[str, float]:
    """Run this sweep job as a single run of the same entry point; return the metrics its rank 0 saved."""
    import __main__

    hydra = HydraConfig.get()
    out = Path(hydra.runtime.output_dir)
    script = ["-m", __main__.__spec__.name] if __main__.__spec__ else [os.path.abspath(sys.argv[0])]
    command = [
        sys.executable,
        *script,
        *hydra.overrides.task,  # this job's values, including the ones the sweeper chose
        f'hydra.run.dir="{out}"',  # the job's folder, already holding its saved config
        "hydra.output_subdir=null",
        f"hydra.job.name={hydra.job.name}_ddp_process_0",  # its ranks log to <job>_ddp_process_<N>.log
    ]
    finished = subprocess.run(command, check=False)
    if finished.returncode:
        raise RuntimeError(f"sweep job {hydra.job.num} failed (exit code {finished.returncode}); see the logs in {out}")
    return json.loads((out / METRICS_FILE).read_text())
