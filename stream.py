"""Write a data module's splits as LitData chunks: ``python stream.py data=<name> output=<folder or s3://...>``
(conf/stream.yaml), for ``python train.py data=stream data.input_dir=<the same>`` to stream."""

import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from mnistlab.runtime.config import checks, hydra_versions, overrides, schema
from mnistlab.runtime.run.reported import reported

os.environ.setdefault("PROJECT_ROOT", str(Path(__file__).resolve().parent))


@hydra.main(config_path="conf", config_name="stream", **hydra_versions.MAIN)
def main(cfg: DictConfig) -> None:
    with reported():
        schema.check(cfg, schema.StreamConfig)  # before torch and Lightning load
        from mnistlab.tasks import stream

        stream(cfg)


if __name__ == "__main__":
    with reported():
        checks.group_set_to_null(sys.argv, Path(__file__).parent / "conf")
        overrides.refuse_unknown_keys(sys.argv, Path(__file__).parent / "conf", "stream", schema.StreamConfig)
    main()
