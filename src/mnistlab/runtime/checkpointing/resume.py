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

A run folder is data too (docs/reliability.md, Trust): its overrides are replayed only where they cannot name
code to run (no ``_target_``, no interpolation, no Hydra setting but a launcher chosen from
``conf/``); the others are refused, said so in the log, and can be given again on the command line by
whoever trusts them.
"""

import json
import logging
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path

import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf

from mnistlab.runtime.checkpointing.checkpoint_checks import broken_checkpoint
from mnistlab.runtime.config import hydra_versions, schema
from mnistlab.runtime.config.overrides import first_value
from mnistlab.runtime.run import folder_lock, run_folder
from mnistlab.runtime.run.failures import InputError, resume_command
from mnistlab.runtime.run.run_folder import (
    FAILURE_FILE,
    METRICS_FILE,
    RESUMES,
    SAVED_CONFIG,
    SAVED_OVERRIDES,
    SWEEP_FILE,
    is_run,
    last_checkpoint,
)

KEY = "resume"
RUN_DIR_OVERRIDE = "hydra.run.dir"
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
    folder_lock.refuse_if_held(folder, "the run")  # first: a run in use may not have its files yet
    _check(folder, from_checkpoint="ckpt_path" in replaced)
    saved = _replayable(folder)
    _refuse_finished(folder, given)
    folder_lock.hold(folder, "the run")  # after the checks: a refused resume leaves even the lock's file as it was
    own = [arg for arg in saved if _key(arg) not in replaced]
    # Hydra saves this attempt's config nowhere: record() keeps it once the resume is known to work.
    return [argv[0], *own, f"{KEY}='{folder}'", *given, f"{RUN_DIR_OVERRIDE}='{folder}'", "hydra.output_subdir=null"]


def _expand_sweep(argv: list[str], folder: Path) -> list[str]:
    """``argv`` with ``resume=<sweep folder>`` replaced by that sweep, launched again into its folder."""
    if any(arg.startswith(f"{RUN_DIR_OVERRIDE}=") for arg in argv[1:]):
        return argv  # one job of a resumed sweep, re-run in processes of its own (rendezvous)
    folder_lock.refuse_if_held(folder, "the sweep")
    saved = _sweep_record(folder)
    overrides = saved["overrides"]
    given = [arg for arg in argv[1:] if not arg.startswith(f"{KEY}=") and arg not in ("-m", "--multirun")]
    replaced = {_key(arg) for arg in given if not arg.startswith("-")} | {KEY}
    launcher = [str(arg) for arg in overrides.get("hydra") or [] if LAUNCHER.fullmatch(str(arg))]
    own = [arg for arg in _safe(overrides["task"]) if _key(arg) not in replaced]
    _check_first_job(Path(argv[0]), folder, [*own, f"{KEY}='{folder}'", *given])
    folder_lock.hold(folder, "the sweep")  # after the checks: a refused resume leaves even the lock's file as it was
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
    entry = Path(cfg.paths.output_dir) / RESUMES / time.strftime("%Y-%m-%d_%H-%M-%S")  # the run, or sweep job
    entry.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, entry / SAVED_CONFIG.name)
    (entry / SAVED_OVERRIDES.name).write_text(yaml.safe_dump([str(o) for o in overrides]))
    return entry


def latest_overrides(folder: Path) -> Path:
    """The overrides the run was last started with: its newest resume's, else its launch's."""
    resumes = sorted((folder / RESUMES).glob(f"*/{SAVED_OVERRIDES.name}"))
    return resumes[-1] if resumes else folder / SAVED_OVERRIDES


def _replayable(folder: Path) -> list[str]:
    path = latest_overrides(folder)
    saved = _yaml(path)
    if not (isinstance(saved, list) and all(isinstance(arg, str) for arg in saved)):
        raise InputError(
            f"resume={folder}: {path} is damaged; it should hold the overrides the run was started with, a YAML "
            "list of key=value strings as Hydra writes it. Nothing was started: restore the file (or start the run "
            "again with its overrides)"
        )
    return _safe(saved)


def _sweep_record(folder: Path) -> dict:
    """The ``hydra`` part of the sweep's multirun.yaml, where it is whole (its task overrides a list of
    strings, and ``hydra.runtime`` after them: Hydra writes the overrides before it) and not an Optuna
    study's."""
    saved = _yaml(folder / SWEEP_FILE)
    hydra = saved.get("hydra") if isinstance(saved, dict) else None
    if not isinstance(hydra, dict):
        hydra = {}
    sweeper = hydra.get("sweeper")
    if isinstance(sweeper, dict) and "optuna" in str(sweeper.get("_target_", "")).lower():
        raise InputError(
            f"resume={folder} is an Optuna study: run its command again and the study goes on from its storage"
        )
    overrides = hydra.get("overrides")
    task = overrides.get("task") if isinstance(overrides, dict) else None
    if not (isinstance(task, list) and all(isinstance(arg, str) for arg in task) and "runtime" in hydra):
        raise InputError(
            f"resume={folder}: its {SWEEP_FILE} is damaged; it should hold the sweep's config as Hydra saved it, "
            "with the sweep's overrides under hydra.overrides.task. Nothing was started: restore the file (or "
            "run the sweep's command again)"
        )
    return hydra


def _yaml(path: Path) -> object:
    """A saved file's YAML as plain data (OmegaConf would resolve the interpolations in it while they are
    read); None for a file that cannot be read, is not text or is not YAML."""
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None


def _refuse_finished(folder: Path, given: list[str]) -> None:
    """A run that finished (its metrics.json) continues only to train longer: more epochs or steps than
    it was last given. Otherwise it would test its last weights and replace its results with theirs."""
    if not (folder / METRICS_FILE).is_file():
        return
    saved = _yaml(latest_overrides(folder).parent / SAVED_CONFIG.name)
    trainer = saved.get("trainer") if isinstance(saved, dict) else None
    limits = trainer if isinstance(trainer, dict) else {}
    for key in ("max_epochs", "max_steps"):
        now = [arg.partition("=")[2] for arg in given if _key(arg) == f"trainer.{key}"]
        before = limits.get(key)
        if (
            now
            and now[-1].lstrip("-").isdigit()
            and (not isinstance(before, int) or before < 0 or int(now[-1]) > before)
        ):
            return
    epochs = limits.get("max_epochs")
    more = (
        f"more than its {epochs}: trainer.max_epochs={epochs * 2}" if isinstance(epochs, int) else "trainer.max_epochs"
    )
    raise InputError(
        f"resume={folder}: that run finished (its results are in metrics.json), so there is nothing to continue and "
        f"nothing was changed; to train it longer, give it more epochs ({more})"
    )


def _check_first_job(script: Path, folder: Path, overrides: list[str]) -> None:
    """The resumed sweep's first job, composed and checked as train.py will: a bad override given now is
    refused in one line before the sweep's record or any job's folder is touched."""
    from hydra import compose, initialize_config_dir

    # Hydra's own settings (the launcher's, hydra.*) shape how jobs run, not what a job is: left out, but
    # for the search path, where the configs the job names may lie.
    own = [arg for arg in overrides if not arg.startswith("-") and not _key(arg).startswith("hydra")]
    job = [first_value(arg) for arg in own] + [arg for arg in overrides if _key(arg) == "hydra.searchpath"]
    config = script.resolve().parent / "conf"
    try:
        with initialize_config_dir(config_dir=str(config), job_name="train", **hydra_versions.BASE):
            cfg = compose("train", overrides=[*job, f"paths.output_dir='{folder / '0'}'"])
    except HydraException as err:
        raise InputError(f"resume={folder}: {' '.join(str(err).split())}") from None  # Hydra's, in one line
    schema.check(cfg, schema.TrainConfig)


def _safe(saved: list[str]) -> list[str]:
    """The saved overrides that cannot name code (the others are kept in ``refused``, for the log)."""
    code = [arg for arg in saved if _key(arg).startswith("hydra") or any(c in arg for c in CODE)]
    # And the other keys of a node whose class was refused (+callbacks.x.step=1 after callbacks.x._target_=...).
    nodes = tuple(f"{_key(arg).rpartition('.')[0]}." for arg in code if any(c in _key(arg) for c in CODE))
    refused[:] = [arg for arg in saved if arg in code or _key(arg).startswith(nodes)]
    return [arg for arg in saved if arg not in refused]


def _check(folder: Path, from_checkpoint: bool) -> None:
    if folder.is_file():
        then = f"; to start from a checkpoint file, give ckpt_path={folder}" if folder.suffix == ".ckpt" else ""
        raise InputError(
            f"resume={folder} is a file, not a run folder: name the folder that holds the run's .hydra/{then}"
        )
    if not folder.is_dir():
        raise InputError(f"resume={folder}: no such folder; name a run's folder, e.g. outputs/train/runs/<date>_<time>")
    if not is_run(folder):
        raise InputError(f"resume={folder} is not a run folder (no {SAVED_OVERRIDES} in it)")
    last = last_checkpoint(folder)
    if from_checkpoint or any(folder.glob(run_folder.SLURM_CHECKPOINTS)):
        return  # ckpt_path= names the checkpoint to continue from (tasks.train checks it)
    if not last.is_file() and not newer_than_last(folder):
        raise InputError(
            f"resume={folder} has no {last.relative_to(folder)}: the run stopped before its first checkpoint, so "
            f"there is nothing to resume; start it again with the overrides in its {SAVED_OVERRIDES}"
        )
    if last.is_file() and (problem := broken_checkpoint(last)):
        whole = whole_checkpoints(folder)
        then = (
            f"the whole checkpoints beside it, newest first: {', '.join(p.name for p in whole)}; continue from one "
            f"with {resume_command(folder, f'ckpt_path={whole[0]}')}"
            if whole
            else "no other checkpoint beside it is whole: start the run again"
        )
        raise InputError(
            f"resume={folder}: its {last.relative_to(folder)} is not a whole checkpoint ({problem}); {then}"
        )


def whole_checkpoints(folder: Path, since: float = float("-inf")) -> list[Path]:
    """The whole checkpoints of the run's checkpoints/ written after ``since`` (a modification time), newest
    first; a damaged one (cut short, failing its CRCs) left out."""
    written = {path: path.stat().st_mtime for path in run_folder.checkpoints(folder).glob("*.ckpt")}
    newest = sorted((path for path, mtime in written.items() if mtime > since), key=written.__getitem__, reverse=True)
    return [path for path in newest if not broken_checkpoint(path)]


def newer_than_last(folder: Path) -> list[Path]:
    """The whole checkpoints written after the run's last.ckpt (all of them where it has none), newest first:
    a best checkpoint saved at an epoch's end whose last.ckpt could not be written (a full disk) holds that
    epoch, which a resume from last.ckpt would train again (and save again, as a -v1 copy)."""
    last = last_checkpoint(folder)
    return whole_checkpoints(folder, since=last.stat().st_mtime if last.is_file() else float("-inf"))


def continue_from(folder: Path) -> Path | None:
    """The checkpoint the run in ``folder`` continues from: its last.ckpt, or a newer whole one
    (:func:`newer_than_last`)."""
    last = last_checkpoint(folder)
    if newer := newer_than_last(folder):
        log.warning("%s is newer than last.ckpt, which could not be written then: continuing from it", newer[0].name)
        return newer[0]
    return last if last.is_file() else None


def adopt_as_last(checkpoint: Path) -> Path:
    """Make ``checkpoint`` (of :func:`continue_from`) the run's last.ckpt, as a hard link (no space taken), so
    that the run goes on as from any last.ckpt: Lightning never deletes the file a run resumed from, and would
    keep that best checkpoint beyond save_top_k. Where the file system has no hard links, ``checkpoint`` as it is."""
    last = checkpoint.with_name(last_checkpoint(Path()).name)
    if checkpoint == last:
        return last
    linked = last.with_name(f".{last.name}.{os.getpid()}.link")
    try:
        os.link(checkpoint, linked)
        os.replace(linked, last)  # atomic: last.ckpt is the old one or this one, never neither
    except OSError:
        linked.unlink(missing_ok=True)
        return checkpoint
    return last


def _key(override: str) -> str:
    try:
        return OverridesParser.create().parse_override(override).key_or_group
    except HydraException:  # not an override (the argument of a Hydra flag): Hydra reports it if it is wrong
        return override
