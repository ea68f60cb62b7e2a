"""Train, then test the best checkpoint: ``python train.py [key=value ...]`` (see conf/train.yaml)."""

import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from mnistlab import launch
from mnistlab.checks import InputError
from mnistlab.tasks import train

os.environ.setdefault("PROJECT_ROOT", str(Path(__file__).resolve().parent))
os.environ[launch.ENTRY_POINT] = str(Path(__file__).resolve())  # what a distributed sweep job re-runs


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    try:
        metrics = train(cfg)
    except InputError as err:
        raise SystemExit(f"Error: {err}") from None
    return metrics.get(cfg.get("optimized_metric"))  # what a sweeper (e.g. Optuna) optimises


if __name__ == "__main__":
    sys.argv += launch.join_external_launch()  # under torchrun: one run folder for all ranks
    main()
