"""Continuing a run by naming its folder: ``python train.py resume=<run folder> [key=value ...]``.

Before Hydra starts, ``resume=<folder>`` becomes the overrides that run was last started with, then
the ones given now, which win, and ``hydra.run.dir=<folder>``. So the run goes on in its own folder,
with its own config, from its ``checkpoints/last.ckpt`` (``tasks._last_checkpoint``), and its
TensorBoard events go on in the same ``tensorboard/``. In the expanded command line ``resume=`` sits
between the two kinds of overrides: :func:`split` tells them apart again for the log.

The folder keeps a history: ``.hydra/`` holds the launch's config and overrides, untouched, and
each resume adds ``.hydra/resumes/<date>_<time>/`` (:func:`record`), written once the resume is
known to be possible (its checkpoint whole, the config accepted). The newest record is replayed.

A run folder is data too (README: Trust): its overrides are replayed only where they cannot name
code to run (no ``_target_``, no interpolation, no Hydra setting); the others are refused, said so
in the log, and can be given again on the command line by whoever trusts them.
"""

import logging
import time
from collections.abc import Sequence
from pathlib import Path

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf

from mnistlab.runtime.checks import InputError, broken_checkpoint

KEY = "resume"
RUN_DIR_OVERRIDE = "hydra.run.dir"
HISTORY = Path(".hydra") / "resumes"  # in the run folder: one <date>_<time>/ per resume
# What a replayed override may not contain: keys that make Hydra import and call something, and the
# interpolations that could assemble one.
CODE = ("_target_", "_args_", "_partial_", "_recursive_", "_convert_", "${")
log = logging.getLogger(__name__)
refused: list[str] = []  # the folder's overrides this process did not replay (logged by tasks)


def expand(argv: list[str]) -> list[str]:
    """``argv`` with ``resume=<folder>`` replaced by that run's overrides, the run's folder and the rest."""
    named = [arg for arg in argv[1:] if arg.startswith(f"{KEY}=")]
    if not named:
        return argv
    if {"-m", "--multirun"} & set(argv):
        raise InputError("resume= continues one run; it cannot be a job of a sweep (-m)")
    folder = Path(named[-1].partition("=")[2].strip("'\"")).expanduser().resolve()
    given = [arg for arg in argv[1:] if not arg.startswith(f"{KEY}=")]
    replaced = {_key(arg) for arg in given if not arg.startswith("-")} | {KEY, RUN_DIR_OVERRIDE}
    _check(folder, from_checkpoint="ckpt_path" in replaced)
    own = [arg for arg in _replayable(folder) if _key(arg) not in replaced]
    # Hydra saves this attempt's config nowhere: record() keeps it once the resume is known to work.
    return [argv[0], *own, f"{KEY}='{folder}'", *given, f"{RUN_DIR_OVERRIDE}='{folder}'", "hydra.output_subdir=null"]


def split(overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """The overrides of an expanded command line: (the run's own, the ones given when resuming)."""
    keys = [_key(arg) for arg in overrides]
    at = keys.index(KEY)
    return list(overrides[:at]), [arg for arg, key in zip(overrides[at + 1 :], keys[at + 1 :]) if key != KEY]


def record(cfg: DictConfig, overrides: Sequence[str]) -> Path:
    """Add this resume to the run folder's history: its config and its whole command line's overrides."""
    entry = Path(cfg.resume) / HISTORY / time.strftime("%Y-%m-%d_%H-%M-%S")
    entry.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, entry / "config.yaml")
    (entry / "overrides.yaml").write_text(yaml.safe_dump([str(o) for o in overrides]))
    return entry


def latest_overrides(folder: Path) -> Path:
    """The overrides the run was last started with: its newest resume's, else its launch's."""
    resumes = sorted((folder / HISTORY).glob("*/overrides.yaml"))
    return resumes[-1] if resumes else folder / ".hydra" / "overrides.yaml"


def _replayable(folder: Path) -> list[str]:
    # Plain YAML: OmegaConf would resolve the interpolations in it while they are read.
    saved = [str(arg) for arg in yaml.safe_load(latest_overrides(folder).read_text()) or []]
    code = [arg for arg in saved if _key(arg).startswith("hydra") or any(c in arg for c in CODE)]
    # And the other keys of a node whose class was refused (+callbacks.x.step=1 after callbacks.x._target_=...).
    nodes = tuple(f"{_key(arg).rpartition('.')[0]}." for arg in code if any(c in _key(arg) for c in CODE))
    refused[:] = [arg for arg in saved if arg in code or _key(arg).startswith(nodes)]
    return [arg for arg in saved if arg not in refused]


def _check(folder: Path, from_checkpoint: bool) -> None:
    if not folder.is_dir():
        raise InputError(f"resume={folder}: no such folder; name a run's folder, e.g. outputs/train/runs/<date>_<time>")
    if (folder / "multirun.yaml").is_file():
        raise InputError(f"resume={folder} is a sweep's folder; name one of its jobs, e.g. {folder / '0'}")
    if not (folder / ".hydra" / "overrides.yaml").is_file():
        raise InputError(f"resume={folder} is not a run folder (no .hydra/overrides.yaml in it)")
    last = folder / "checkpoints" / "last.ckpt"
    if from_checkpoint or any(folder.glob("hpc_ckpt_*.ckpt")):
        return  # ckpt_path= names the checkpoint to continue from (tasks.train checks it)
    if not last.is_file():
        raise InputError(
            f"resume={folder} has no checkpoints/last.ckpt: the run stopped before its first checkpoint, so there "
            "is nothing to resume; start it again with the overrides in its .hydra/overrides.yaml"
        )
    if problem := broken_checkpoint(last):
        whole = [
            p for p in sorted(last.parent.glob("*.ckpt"), key=lambda p: -p.stat().st_mtime) if not broken_checkpoint(p)
        ]
        then = (
            f"the whole checkpoints beside it, newest first: {', '.join(p.name for p in whole)}; continue from one "
            f"with python train.py resume={folder} ckpt_path={whole[0]}"
            if whole
            else "no other checkpoint beside it is whole: start the run again"
        )
        raise InputError(f"resume={folder}: its checkpoints/last.ckpt is not a whole checkpoint ({problem}); {then}")


def _key(override: str) -> str:
    try:
        return OverridesParser.create().parse_override(override).key_or_group
    except HydraException:  # not an override (the argument of a Hydra flag): Hydra reports it if it is wrong
        return override
