"""Test a checkpoint on the test set: ``python eval.py ckpt_path=<file> [key=value ...]``."""

import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from mnistlab.runtime.config import checks, hydra_versions, overrides, schema
from mnistlab.runtime.distributed import rendezvous
from mnistlab.runtime.run import launch
from mnistlab.runtime.run.reported import reported

os.environ.setdefault("PROJECT_ROOT", str(Path(__file__).resolve().parent))
os.environ[launch.ENTRY_POINT] = str(Path(__file__).resolve())  # what a distributed sweep job re-runs


@hydra.main(config_path="conf", config_name="eval", **hydra_versions.MAIN)
def main(cfg: DictConfig) -> None:
    with reported():
        schema.check(cfg, schema.EvalConfig)  # before torch and Lightning load: answered in 0.5 s, not 6
        from mnistlab.tasks import evaluate

        evaluate(cfg)


if __name__ == "__main__":
    with reported():
        checks.group_set_to_null(sys.argv, Path(__file__).parent / "conf")  # one line, not Hydra's traceback
        overrides.refuse_unknown_keys(sys.argv, Path(__file__).parent / "conf", "eval", schema.EvalConfig)
    sys.argv += rendezvous.join_external_launch("eval")  # under torchrun: one run folder for all ranks
    main()
