"""Export a checkpoint's network: ``python export.py ckpt_path=<file> format=onnx|torchscript`` (conf/export.yaml)."""

import os
from pathlib import Path

import hydra
from omegaconf import DictConfig

from mnistlab.runtime.config import hydra_versions, schema
from mnistlab.runtime.run.reported import reported

os.environ.setdefault("PROJECT_ROOT", str(Path(__file__).resolve().parent))


@hydra.main(config_path="conf", config_name="export", **hydra_versions.MAIN)
def main(cfg: DictConfig) -> None:
    with reported():
        schema.check(cfg, schema.ExportConfig)  # before torch loads
        from mnistlab.trained.exporting import export

        export(cfg)


if __name__ == "__main__":
    main()
