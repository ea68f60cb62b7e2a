# Part of the MNIST example: a project generated without it has no such file.
"""Draw a digit and see what the model reads: ``python demo.py ckpt_path=<file>`` (conf/demo.yaml)."""

import os
from pathlib import Path

import hydra
from omegaconf import DictConfig

from mnistlab.runtime.config import hydra_versions, schema
from mnistlab.runtime.run.reported import reported

os.environ.setdefault("PROJECT_ROOT", str(Path(__file__).resolve().parent))


@hydra.main(config_path="conf", config_name="demo", **hydra_versions.MAIN)
def main(cfg: DictConfig) -> None:
    with reported():
        schema.check(cfg, schema.DemoConfig)  # before torch and Gradio load
        from mnistlab.example.demo import launch

        launch(cfg)


if __name__ == "__main__":
    main()
