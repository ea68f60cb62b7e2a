"""Continuing a run by naming its folder: ``python train.py resume=<run folder> [key=value ...]``.

Before Hydra starts, ``resume=<folder>`` becomes the overrides that run was last started with, then
the ones given now, which win, and ``hydra.run.dir=<folder>``. So the run goes on in its own folder,
with its own config, from its ``checkpoints/last.ckpt`` (``tasks._last_checkpoint``), and its
TensorBoard events go on in the same ``tensorboard/``. In the expanded command line ``resume=`` sits
between the two kinds of overrides: :func:`split` tells them apart again for the log.

The folder keeps a history: ``.hydra/`` holds the launch's config and overrides, untouched, and
each resume adds ``.hydra/resumes/<date>_<time>/`` (:func:`record`), written once the resume is
known to be possible (its checkpoint whole, the config accepted). The newest record is replayed.

``resume=<sweep folder>`` continues a sweep (basic, ``parallel`` or SLURM launcher): it is launched
again into the same folder, with its own overrides (and launcher) then the ones given now, so that each
job keeps its number and folder. A job that finished (its ``metrics.json``) is not run again and its
folder is left as it was (:func:`finished_job`); the others go on from their own ``last.ckpt``, or start
afresh where they have none; the sweep then ends with the table of all its jobs. A job that started
before keeps the ``.hydra/`` it started with (``hydra.output_subdir`` resolves to null for it:
``run_folder.saved_once``).

A run folder is data too (README: Trust): its overrides are replayed only where they cannot name
code to run (no ``_target_``, no interpolation, no Hydra setting but a launcher chosen from
``conf/``); the others are refused, said so in the log, and can be given again on the command line by
whoever trusts them.
"""

import json
import logging
import re
import time
from collections.abc import Sequence
from pathlib import Path

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf

from mnistlab.runtime.checks import InputError, broken_checkpoint
from mnistlab.runtime.failures import FAILURE_FILE
from mnistlab.runtime.launch import METRICS_FILE

KEY = "resume"
RUN_DIR_OVERRIDE = "hydra.run.dir"
HISTORY = Path(".hydra") / "resumes"  # in the run folder: one <date>_<time>/ per resume
SWEEP_FILE = "multirun.yaml"  # what Hydra saves in a sweep's folder: its config and overrides
LAUNCHER = re.compile(r"hydra/launcher=\w+")  # a launcher of conf/hydra/launcher/: replayed with a sweep
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
        raise InputError(
            "resume=<run folder> continues a run, resume=<sweep folder> a sweep: either without -m (a sweep is "
            "launched again as it was)"
        )
    folder = Path(named[-1].partition("=")[2].strip("'\"")).expanduser().resolve()
    if (folder / SWEEP_FILE).is_file():
        return _expand_sweep(argv, folder)
    given = [arg for arg in argv[1:] if not arg.startswith(f"{KEY}=")]
    replaced = {_key(arg) for arg in given if not arg.startswith("-")} | {KEY, RUN_DIR_OVERRIDE}
    _check(folder, from_checkpoint="ckpt_path" in replaced)
    own = [arg for arg in _replayable(folder) if _key(arg) not in replaced]
    # Hydra saves this attempt's config nowhere: record() keeps it once the resume is known to work.
    return [argv[0], *own, f"{KEY}='{folder}'", *given, f"{RUN_DIR_OVERRIDE}='{folder}'", "hydra.output_subdir=null"]


def _expand_sweep(argv: list[str], folder: Path) -> list[str]:
    """``argv`` with ``resume=<sweep folder>`` replaced by that sweep, launched again into its folder."""
    if any(arg.startswith(f"{RUN_DIR_OVERRIDE}=") for arg in argv[1:]):
        return argv  # one job of a resumed sweep, re-run in processes of its own (launch.run_job_in_fresh_processes)
    saved = (yaml.safe_load((folder / SWEEP_FILE).read_text()) or {}).get("hydra") or {}
    if "optuna" in str((saved.get("sweeper") or {}).get("_target_", "")).lower():
        raise InputError(
            f"resume={folder} is an Optuna study: run its command again and the study goes on from its storage"
        )
    overrides = saved.get("overrides") or {}
    given = [arg for arg in argv[1:] if not arg.startswith(f"{KEY}=") and arg not in ("-m", "--multirun")]
    replaced = {_key(arg) for arg in given if not arg.startswith("-")} | {KEY}
    launcher = [str(arg) for arg in overrides.get("hydra") or [] if LAUNCHER.fullmatch(str(arg))]
    own = [arg for arg in _safe([str(arg) for arg in overrides.get("task") or []]) if _key(arg) not in replaced]
    # A job that started before keeps its .hydra/ (the config it started with): run_folder.saved_once.
    subdir = "hydra.output_subdir='${saved_once:${hydra.runtime.output_dir}}'"  # quoted: nested, as the grammar allows
    return [argv[0], "-m", *launcher, *own, f"{KEY}='{folder}'", *given, f"hydra.sweep.dir='{folder}'", subdir]


def finished_job(cfg: DictConfig) -> dict[str, float] | None:
    """In a resumed sweep, this job's metrics if it finished before: it is not run again, and nothing in
    its folder changes. Otherwise None: it runs (its earlier failure, if any, forgotten)."""
    if not cfg.get(KEY) or not (Path(cfg[KEY]) / SWEEP_FILE).is_file():
        return None
    job = Path(cfg.paths.output_dir)
    try:
        metrics = json.loads((job / METRICS_FILE).read_text())
    except (OSError, ValueError):  # none, or cut short: the job did not finish
        (job / FAILURE_FILE).unlink(missing_ok=True)
        return None
    print(f"Job {job.name} finished before: kept as it is ({job})", flush=True)  # not logged: its log stays
    return metrics


def split(overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """The overrides of an expanded command line: (the run's own, the ones given when resuming)."""
    keys = [_key(arg) for arg in overrides]
    at = keys.index(KEY)
    return list(overrides[:at]), [arg for arg, key in zip(overrides[at + 1 :], keys[at + 1 :]) if key != KEY]


def record(cfg: DictConfig, overrides: Sequence[str]) -> Path:
    """Add this resume to the run folder's history: its config and its whole command line's overrides."""
    entry = Path(cfg.paths.output_dir) / HISTORY / time.strftime("%Y-%m-%d_%H-%M-%S")  # the run, or sweep job
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
    return _safe([str(arg) for arg in yaml.safe_load(latest_overrides(folder).read_text()) or []])


def _safe(saved: list[str]) -> list[str]:
    """The saved overrides that cannot name code (the others are kept in ``refused``, for the log)."""
    code = [arg for arg in saved if _key(arg).startswith("hydra") or any(c in arg for c in CODE)]
    # And the other keys of a node whose class was refused (+callbacks.x.step=1 after callbacks.x._target_=...).
    nodes = tuple(f"{_key(arg).rpartition('.')[0]}." for arg in code if any(c in _key(arg) for c in CODE))
    refused[:] = [arg for arg in saved if arg in code or _key(arg).startswith(nodes)]
    return [arg for arg in saved if arg not in refused]


def _check(folder: Path, from_checkpoint: bool) -> None:
    if not folder.is_dir():
        raise InputError(f"resume={folder}: no such folder; name a run's folder, e.g. outputs/train/runs/<date>_<time>")
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
