# Part of the MNIST example: a project generated without it has no such file.
"""Classify digit images: ``python predict.py ckpt_path=<file> input=<image or folder>`` (conf/predict.yaml)."""

import os
from pathlib import Path

import hydra
from omegaconf import DictConfig

from mnistlab.runtime.config import hydra_versions, schema
from mnistlab.runtime.run.reported import reported

os.environ.setdefault("PROJECT_ROOT", str(Path(__file__).resolve().parent))


@hydra.main(config_path="conf", config_name="predict", **hydra_versions.MAIN)
def main(cfg: DictConfig) -> None:
    with reported():
        schema.check(cfg, schema.PredictConfig)  # before torch loads
        from mnistlab.example.prediction import predict

        predict(cfg)


if __name__ == "__main__":
    main()
