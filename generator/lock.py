"""Locks both projects the template renders: ``uv.lock`` (this project, the one with the example) and
``generator/blank/uv.lock`` (a project made with ``example=false``: its pyproject has no ``demo`` extra, so
the template's lock would be stale there and ``uv sync --locked`` would refuse it). Run it after any change
of pyproject.toml's dependencies, with the arguments ``uv lock`` takes (``tests/test_generator.py`` and
CI's ``uv sync --locked`` fail until it is run):

    python generator/lock.py             # lock what changed, every other version kept
    python generator/lock.py --upgrade   # the newest releases the specifiers admit

The project without the example is locked from the template's new lock, so the two hold the same
version of every package they share (uv keeps a locked version that still satisfies the specifiers)."""

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from rename import BLANK, BLANK_NAMES, LOCK, _replace

TEMPLATE = Path(__file__).resolve().parents[1]


def blank_pyproject(text: str) -> str:
    """pyproject.toml as the rename writes it for a project without the example (the package still
    ``mnistlab``: the rename of the name itself comes after, in the lock too)."""
    return _replace(text, BLANK_NAMES)


def main(uv_arguments: list[str]) -> None:
    subprocess.run(["uv", "lock", *uv_arguments], cwd=TEMPLATE, check=True)
    with tempfile.TemporaryDirectory() as folder:
        blank = Path(folder)
        (blank / "pyproject.toml").write_text(blank_pyproject((TEMPLATE / "pyproject.toml").read_text()))
        shutil.copyfile(TEMPLATE / LOCK, blank / LOCK)
        # Without --upgrade whatever the template asked for: the template's versions are the ones to keep.
        subprocess.run(["uv", "lock"], cwd=blank, check=True)
        shutil.copyfile(blank / LOCK, BLANK / LOCK)


if __name__ == "__main__":
    main(sys.argv[1:])
