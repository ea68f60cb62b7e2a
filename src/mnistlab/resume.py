"""Continuing a run by naming its folder: ``python train.py resume=<run folder> [key=value ...]``.

Before Hydra starts, ``resume=<folder>`` becomes the overrides that run was started with (its
``.hydra/overrides.yaml``), then the ones given now, which win, and ``hydra.run.dir=<folder>``. So
the run goes on in its own folder, with its own config, from its ``checkpoints/last.ckpt``
(``tasks._last_checkpoint``), and its TensorBoard events go on in the same ``tensorboard/``.
In the expanded command line ``resume=`` sits between the two kinds of overrides: :func:`split`
tells them apart again for the log.
"""

from collections.abc import Sequence
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import OmegaConf

from mnistlab.checks import InputError

KEY = "resume"
RUN_DIR_OVERRIDE = "hydra.run.dir"


def expand(argv: list[str]) -> list[str]:
    """``argv`` with ``resume=<folder>`` replaced by that run's overrides, the run's folder and the rest."""
    named = [arg for arg in argv[1:] if arg.startswith(f"{KEY}=")]
    if not named:
        return argv
    if {"-m", "--multirun"} & set(argv):
        raise InputError("resume= continues one run; it cannot be a job of a sweep (-m)")
    folder = Path(named[-1].partition("=")[2].strip("'\"")).expanduser().resolve()
    _check(folder)
    given = [arg for arg in argv[1:] if not arg.startswith(f"{KEY}=")]
    replaced = {_key(arg) for arg in given if not arg.startswith("-")} | {KEY, RUN_DIR_OVERRIDE}
    own = [arg for arg in OmegaConf.load(folder / ".hydra" / "overrides.yaml") if _key(arg) not in replaced]
    return [argv[0], *own, f"{KEY}='{folder}'", *given, f"{RUN_DIR_OVERRIDE}='{folder}'"]


def split(overrides: Sequence[str]) -> tuple[list[str], list[str]]:
    """The overrides of an expanded command line: (the run's own, the ones given when resuming)."""
    keys = [_key(arg) for arg in overrides]
    at = keys.index(KEY)
    return list(overrides[:at]), [arg for arg, key in zip(overrides[at + 1 :], keys[at + 1 :]) if key != KEY]


def _check(folder: Path) -> None:
    if not folder.is_dir():
        raise InputError(f"resume={folder}: no such folder; name a run's folder, e.g. outputs/train/runs/<date>_<time>")
    if (folder / "multirun.yaml").is_file():
        raise InputError(f"resume={folder} is a sweep's folder; name one of its jobs, e.g. {folder / '0'}")
    if not (folder / ".hydra" / "overrides.yaml").is_file():
        raise InputError(f"resume={folder} is not a run folder (no .hydra/overrides.yaml in it)")
    if not (folder / "checkpoints" / "last.ckpt").is_file() and not any(folder.glob("hpc_ckpt_*.ckpt")):
        raise InputError(
            f"resume={folder} has no checkpoints/last.ckpt: the run stopped before its first checkpoint, so there "
            "is nothing to resume; start it again with the overrides in its .hydra/overrides.yaml"
        )


def _key(override: str) -> str:
    try:
        return OverridesParser.create().parse_override(override).key_or_group
    except HydraException:  # not an override (the argument of a Hydra flag): Hydra reports it if it is wrong
        return override
