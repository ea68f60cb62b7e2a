"""A start writes only into a folder of its own: one that is new, or the run it continues.

``OwnFolder`` (a Hydra callback, ``conf/hydra/default.yaml``) decides before Hydra saves ``.hydra/``
into the run's folder, before any log file opens there and before the folder's lock is taken. So a
start that names another run's folder (``hydra.run.dir=<a run>``, a leftover ``MNISTLAB_RUN_ID``,
``hydra.sweep.dir=<a sweep>``) is refused in one line and that folder stays byte for byte as it was:
Hydra would otherwise have replaced its saved config, and the next ``resume=`` would replay the
intruder's settings.

Who may start in a folder that already holds files:
- a process that joins a run another process set up, and so saves no config
  (``hydra.output_subdir=null``): the ranks a launcher starts beyond rank 0, a sweep job re-run in
  processes of its own, and ``resume=``, whose folder ``resume.expand`` checked before Hydra started;
- the launch that named the folder, started again (a restarted torchrun round or Kubernetes pod, a
  requeued SLURM job): ``MNISTLAB_RUN_ID`` is the folder's name, and its ``last.ckpt``, if any, was
  written under that id (``checkpoint_io.RUN_ID_KEY``).

The others ranks' logs do not make a folder taken: under torchrun they may open theirs first.
"""

import os
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from mnistlab.runtime.run import folder_lock, launch, run_folder
from mnistlab.runtime.run.failures import InputError, refused, resume_command


class OwnFolder(Callback):
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        _refuse_a_bad_run_id()  # first: resolving hydra.run.dir joins it to a path
        if config.hydra.output_subdir is None:
            return  # joins a run set up by another process (see the module's docstring)
        _refuse_unless_own(Path(config.hydra.run.dir), "hydra.run.dir", "run")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        _refuse_a_bad_run_id()
        folder = Path(config.hydra.sweep.dir)
        if config.get("resume") and Path(config.resume).resolve() == folder.resolve():
            return  # resume=<sweep folder>: checked by resume.expand
        _refuse_unless_own(folder, "hydra.sweep.dir", "sweep")


def _refuse_a_bad_run_id() -> None:
    if (given := os.environ.get(launch.RUN_ID)) and (problem := run_folder.bad_run_id(given)):  # "": unset
        raise refused(problem)


def _refuse_unless_own(folder: Path, key: str, kind: str) -> None:
    """``kind``: what ``folder`` is for, "run" or "sweep"; ``key``: the setting that names it."""
    if not launch.current().is_rank_zero or run_folder.is_free(folder):
        return
    try:
        folder_lock.refuse_if_held(folder, f"the {kind}")  # a run still going: say so, with its holder
    except InputError as err:
        raise refused(err) from None
    given = os.environ.get(launch.RUN_ID)
    named = f"{launch.RUN_ID}={given} names {folder}" if given else f"{key}={folder}"
    if not (run_folder.is_sweep(folder) if kind == "sweep" else run_folder.is_run(folder)):
        raise refused(
            f"{named}, which exists and is not a {kind} folder: nothing was written there; name a new or empty folder"
        )
    writer = _last_checkpoint_writer(folder)
    if given and folder.name == given and writer in (given, _NONE):
        return  # the same launch, started again: it resumes from its last.ckpt (tasks._last_checkpoint)
    by = "" if writer is _NONE else f" (its last.ckpt written by {writer or 'a run started by hand'})"
    instead = f"unset {launch.RUN_ID}" if given else f"leave {key} out"
    raise refused(
        f"{named}, which already holds a {kind}{by}: nothing was written there. Continue that {kind} with "
        f"{resume_command(folder)}, or start this one in a new folder ({instead})"
    )


_NONE = object()  # a run folder without last.ckpt


def _last_checkpoint_writer(folder: Path) -> object:
    """The launch that wrote the folder's last.ckpt (None: a run started by hand); ``_NONE`` without one."""
    last = run_folder.last_checkpoint(folder)
    if not last.is_file():
        return _NONE
    # Here, not at the top: torch takes seconds to import, and only a start in a taken folder reads a checkpoint.
    from mnistlab.runtime.checkpointing.checkpoint_io import RUN_ID_KEY, read

    try:  # mapped, not read: a restarted job reads it whole once, when it resumes from it
        checkpoint = read(last, what="last.ckpt", mmap=True)
        return checkpoint.get(RUN_ID_KEY) if isinstance(checkpoint, dict) else None
    except InputError as err:  # damaged, or not a checkpoint
        raise refused(err) from None
