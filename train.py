"""Train, then test the best checkpoint: ``python train.py [key=value ...]`` (see conf/train.yaml)."""

import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from mnistlab.runtime.checkpointing import resume
from mnistlab.runtime.config import checks, hydra_versions, overrides, schema
from mnistlab.runtime.distributed import rendezvous
from mnistlab.runtime.run import launch
from mnistlab.runtime.run.reported import reported
from mnistlab.runtime.training import signals
from mnistlab.sweeps import gpu_slots

os.environ.setdefault("PROJECT_ROOT", str(Path(__file__).resolve().parent))
os.environ[launch.ENTRY_POINT] = str(Path(__file__).resolve())  # what a distributed sweep job re-runs


@hydra.main(config_path="conf", config_name="train", **hydra_versions.MAIN)
def main(cfg: DictConfig) -> float | None:
    with reported():
        if (metrics := resume.finished_job(cfg)) is not None:
            return metrics.get(cfg.optimized_metric)  # a resumed sweep's finished job: nothing of it is written
        schema.check(cfg, schema.TrainConfig)  # before torch and Lightning load: answered in 0.5 s, not 6
        from mnistlab.tasks import train

        with gpu_slots.own_gpu(cfg):  # hydra/launcher=parallel on several GPUs: one of its own
            return train(cfg).get(cfg.optimized_metric)  # what a sweeper (e.g. Optuna) optimises
    return None  # a failed job of a sweep, recorded: the sweep goes on (Optuna counts a failed trial)


if __name__ == "__main__":
    signals.listen()  # from now on a stop signal waits for the first step (where SafeStop saves the run)
    with reported():
        checks.group_set_to_null(sys.argv, Path(__file__).parent / "conf")  # one line, not Hydra's traceback
        sys.argv = resume.expand(sys.argv)  # resume=<run folder>: that run's own overrides, then these
        overrides.refuse_unknown_keys(sys.argv, Path(__file__).parent / "conf", "train", schema.TrainConfig)
    sys.argv += rendezvous.join_external_launch("train")  # under torchrun: one run folder for all ranks
    main()
