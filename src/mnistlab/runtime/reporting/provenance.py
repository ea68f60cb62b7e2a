"""Which code made a file: the package's version and the git commit of the project's folder, for what
leaves the project (exported models, served answers) to say where it came from."""

import os
import subprocess
from functools import cache
from importlib import metadata
from pathlib import Path

PACKAGE = __name__.partition(".")[0]


def _project() -> Path:
    """The project's folder: the entry points name it (PROJECT_ROOT); else the source tree's, src/<package>/runtime/."""
    return Path(os.environ.get("PROJECT_ROOT") or Path(__file__).resolve().parents[3])


def version() -> str:
    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:  # run from a copy of the source that pip never installed
        return "unknown"


@cache
def commit() -> str:
    """The commit checked out, with ``+dirty`` when tracked files differ from it; ``unknown`` outside git."""
    try:
        head = _git("rev-parse", "HEAD")
        changed = _git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):  # no git, not a repository, or git too slow to answer
        return "unknown"
    return head + ("+dirty" if changed else "")


@cache
def diff() -> str:
    """The tracked files' changes against the commit (``git diff HEAD``); empty when clean or outside git."""
    try:
        return _git("diff", "HEAD", "--no-color", "--no-ext-diff")
    except (OSError, subprocess.SubprocessError):
        return ""


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=_project(), capture_output=True, text=True, check=True, timeout=10
    ).stdout.strip()
