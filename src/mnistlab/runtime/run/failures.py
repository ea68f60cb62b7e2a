"""Failures, in one place: their types (the user's input to fix, a run stopped on purpose), their
one-line formats (``Error: ...``), and the command that continues a stopped run. How a failure then
reaches the user (one line, or a sweep job's record) is ``reported.py``'s.
"""

from collections.abc import Callable


class InputError(ValueError):
    """A wrong override, a missing or corrupt file: the user's to fix, so entry points print one line."""


def refused(message: object) -> SystemExit:
    """The exit of a start refused before the job runs (a Hydra callback, an entry point): one line."""
    return SystemExit(f"Error: {message}")


def resume_command(folder: object, *overrides: str) -> str:
    """The command that continues the run in ``folder`` (runtime/checkpointing/resume.py)."""
    return " ".join(("python train.py", f"resume={folder}", *overrides))


def continue_line(folder: object, when: str = "") -> str:
    """What a stopped run says last: how to continue it, and ``when`` if it should wait."""
    return f"Continue with: {resume_command(folder)}{f' ({when})' if when else ''}"


class RunStopped(Exception):
    """Training stopped between two steps on purpose (a signal, a diverging loss). The message says
    what happened and what to do; the exit code tells a scheduler the run did not finish (128 + the
    signal's number for a signal, 1 for a diverging loss). ``then`` runs once the message is logged:
    a SLURM requeue kills the job's tasks at once, so it must come last."""

    def __init__(self, message: str, exit_code: int, then: Callable[[], None] | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.then = then
