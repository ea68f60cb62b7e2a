"""Every run owns its folder: two runs (or sweeps) started in the same second get two folders, and a
run only ever deletes a folder it made itself.

``conf/hydra/default.yaml`` names run and sweep folders ``${claim_folder:<parent>}``: the resolver
makes ``<parent>/<date>_<time>`` with an exclusive ``mkdir`` and, when another run made it first,
``<date>_<time>_2``, ``_3``, ... (readable, and sorted by start time). ``mkdir`` is atomic, on a
shared file system too, so no two runs can both succeed; Hydra's ``${now:}`` alone named two runs of
one second alike, and they overwrote each other's files. Like ``now``, the resolver is cached per
config (Hydra copies that cache into every job of a sweep), so a run resolves its name once.

Under torchrun and srun every rank is given the folder's name (``launch.RUN_ID``): the resolver then
only joins it.
"""

import os
import re
import shutil
import time
from pathlib import Path

from mnistlab.runtime.run.failures import InputError
from mnistlab.runtime.run.launch import RUN_ID

# What a run's folder holds, by name: every module that writes or reads one of them, conf/ (the
# ${run_folder:<name>} resolver: NAMES) and the tests name it from here.
CHECKPOINTS = "checkpoints"  # the run's checkpoints: last.ckpt and the best (conf/callbacks/)
LAST = "last"  # last.ckpt, the newest state: where a run resumes from
SLURM_CHECKPOINTS = "hpc_ckpt_*.ckpt"  # Lightning's, in the run's root, when SLURM signals a job it requeues
TENSORBOARD = "tensorboard"  # the TensorBoard logger's event files (conf/logger/tensorboard.yaml)
SAVED = ".hydra"  # Hydra's record of a run's start (output_subdir): config.yaml, hydra.yaml, overrides.yaml
SAVED_CONFIG = Path(SAVED) / "config.yaml"
METRICS_FILE = "metrics.json"  # every metric of a finished run (rank 0); read back by sweeps and resume
FAILURE_FILE = "failure.txt"  # a failed sweep job: the reason, then the traceback
RECORD_FILE = "run_info.json"  # the run record (run_record.py), and the uncommitted changes beside it
RECORD_DIFF_FILE = "run_info.diff"
TREE_FILE = "config_tree.txt"  # the composed config as a tree (config_tree.py)
TRACKERS_FILE = "trackers.json"  # {"mlflow": <run id>, "wandb": <run id>}: the tracker runs it logs into
PRUNED_FILE = "pruned.txt"  # a job an Optuna pruner stopped: when and why (sweeps/pruning.py)
LOCK_FILE = ".lock"  # run and sweep folders: the process that holds it, host and pid (folder_lock.py)
SAVED_OVERRIDES = Path(SAVED) / "overrides.yaml"  # the command line's overrides: what makes a folder a run
RESUMES = Path(SAVED) / "resumes"  # one <date>_<time>/ per resume: its config.yaml and overrides.yaml (resume.py)
RANK_LOG = "*_ddp_process_*.log"  # the log of a rank beyond 0 (launch.log_name), which may open before rank 0 starts
# And a sweep's folder, beside its jobs' folders:
SWEEP_FILE = "multirun.yaml"  # Hydra's record of the sweep: its config and overrides
SUMMARY_FILE = "summary.csv"  # the table of its jobs (sweeps/summary.py)
GROUPS_FILE = "groups.csv"  # repeats of one setting, aggregated (sweeps/groups.py)
FIGURE_FILE = "comparison.png"  # the jobs compared (sweeps/comparison.py)


def checkpoints(folder: Path) -> Path:
    return folder / CHECKPOINTS


def last_checkpoint(folder: Path) -> Path:
    """Where the run in ``folder`` saves its newest state and resumes from."""
    return checkpoints(folder) / f"{LAST}.ckpt"


NAMES = ("checkpoints", "last", "tensorboard")  # ${run_folder:<name>} in conf/: the names configs place files by


def name(key: str) -> str:
    """``${run_folder:checkpoints}``: the name this module gives ``key``, read when the config resolves."""
    if key not in NAMES:
        raise InputError(f"${{run_folder:{key}}} names nothing of a run folder; known: {', '.join(NAMES)}")
    return str(globals()[key.upper()])


NAME = re.compile(r"[A-Za-z0-9._-]+")  # a run id is one folder's name: no separator, so it stays in its parent
NAME_MAX = 255  # bytes in a file name, on Linux's file systems and macOS's
_made_here: set[Path] = set()  # the folders this process claimed


def claim(parent: str) -> str:
    """``<parent>/<name>``: a folder that this run alone has, made now; or the one its launcher named."""
    if given := os.environ.get(RUN_ID):
        if problem := bad_run_id(given):  # ownership.OwnFolder says so first, in one line
            raise InputError(problem)
        return str(Path(parent) / given)
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    folder, n = Path(parent) / stamp, 1
    while True:
        try:
            folder.parent.mkdir(parents=True, exist_ok=True)
            folder.mkdir()
        except FileExistsError:
            n += 1
            folder = Path(parent) / f"{stamp}_{n}"
            continue
        except OSError:
            return str(folder)  # it cannot be made: reported.WritableOutput says so in one line
        _made_here.add(folder.resolve())
        return str(folder)


def bad_run_id(given: str) -> str | None:
    """What is wrong with ``given`` as the name of a run folder, or None."""
    if NAME.fullmatch(given) and given not in (".", "..") and len(given.encode()) <= NAME_MAX:
        return None
    return (
        f"{RUN_ID}={given!r} is not a folder's name: it names the run folder inside outputs/ and takes letters, "
        f"digits, '.', '_' and '-' (at most {NAME_MAX} bytes, not '.' or '..'); unset it or give it such a name"
    )


def is_free(folder: Path) -> bool:
    """Whether a run may take ``folder``: it is new, empty or made by this process; other ranks' logs aside."""
    if not folder.exists() or folder.resolve() in _made_here:
        return True
    return folder.is_dir() and all(path.match(RANK_LOG) for path in folder.iterdir())


def is_run(folder: Path) -> bool:
    """Whether ``folder`` holds a run (or a sweep's job) that Hydra started: its saved overrides."""
    return (folder / SAVED_OVERRIDES).is_file()


def is_sweep(folder: Path) -> bool:
    return (folder / SWEEP_FILE).is_file()


def discard_if_unused(folder: Path) -> None:
    """Delete ``folder`` if this process made it and nothing of a run is in it yet (a refused run):
    only its saved config (.hydra/, config_tree.txt), its record (run_info.json, .diff), lock and logs."""
    folder = folder.resolve()
    if folder not in _made_here or not folder.is_dir():
        return
    unused = (SAVED, LOCK_FILE, TREE_FILE, RECORD_FILE, RECORD_DIFF_FILE)
    if all(p.name in unused or p.suffix == ".log" for p in folder.iterdir()):
        shutil.rmtree(folder, ignore_errors=True)
        _made_here.discard(folder)


def saved_once(output_dir: str) -> str | None:
    """``hydra.output_subdir`` for a job of a resumed sweep (runtime/checkpointing/resume.py): ``.hydra`` for a job that
    never started; null for one that did, whose ``.hydra/`` keeps the config it started with."""
    return None if is_run(Path(output_dir)) else SAVED
