"""Serve a trained model over HTTP: ``python serve.py ckpt_path=<checkpoint or model.onnx>`` (conf/serve.yaml)."""

import os
from pathlib import Path

import hydra
from omegaconf import DictConfig

from mnistlab.runtime.config import hydra_versions, schema
from mnistlab.runtime.run.reported import reported

os.environ.setdefault("PROJECT_ROOT", str(Path(__file__).resolve().parent))


@hydra.main(config_path="conf", config_name="serve", **hydra_versions.MAIN)
def main(cfg: DictConfig) -> None:
    with reported():
        schema.check(cfg, schema.ServeConfig)  # before torch loads
        from mnistlab.trained.serving.server import serve

        serve(cfg)


if __name__ == "__main__":
    main()
