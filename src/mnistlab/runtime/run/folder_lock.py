"""One process at a time in a run or sweep folder: a second start on a folder in use (``resume=`` of a
run or sweep that is still going, from a second terminal, a requeued job, or twice at once) is refused
in one line naming the holder, before it writes anything.

The lock is ``fcntl.flock`` on ``<folder>/.lock``, held by the open file for the life of the process:
the operating system releases it when the process ends, however it ends (a kill, an OOM, a node's
reboot), so there is no stale lock to clean up. The file keeps the holder's host and pid, for the message.

Where it holds: processes of one machine, always; across nodes, where the file system passes ``flock``
on to its server: NFS v4 (Linux emulates ``flock`` with its byte-range locks), GPFS, BeeGFS, and
Lustre mounted with ``-o flock``. Lustre's default (``noflock``) fails the call, and then the run goes
on unlocked, saying so in one line; with ``localflock`` each node sees only its own locks.

Rank 0 alone takes it (the process that started the run, or global rank 0 under a launcher): the other
ranks of the same run work in the same folder on purpose.
"""

import errno
import fcntl
import logging
import os
import socket
from pathlib import Path
from typing import Any, TextIO

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from mnistlab.runtime.run import launch
from mnistlab.runtime.run.failures import InputError
from mnistlab.runtime.run.run_folder import LOCK_FILE

log = logging.getLogger(__name__)
_held: dict[Path, TextIO] = {}  # folder -> its open lock file: the lock lasts as long as the process


def hold(folder: Path, what: str) -> None:
    """Take ``folder``'s lock for this process, or refuse: ``what`` names the folder in the message
    ("the run", "the sweep"). A second call for a folder already held here does nothing."""
    folder = folder.resolve()
    if folder in _held or not launch.current().is_rank_zero:
        return
    folder.mkdir(parents=True, exist_ok=True)
    file = open(folder / LOCK_FILE, "a+")  # noqa: SIM115 (kept open: closing it would release the lock)
    try:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        file.seek(0)
        holder = file.read().strip()
        file.close()
        raise InputError(_in_use(folder, what, holder)) from None
    except OSError as err:
        if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
        log.warning("%s: its file system does not lock files (%s): nothing stops a second start on it", folder, err)
    file.seek(0)
    file.truncate()
    file.write(f"host {socket.gethostname()}, pid {os.getpid()}\n")
    file.flush()
    _held[folder] = file


def refuse_if_held(folder: Path, what: str) -> None:
    """Refuse as :func:`hold` does where another process holds ``folder``, without taking its lock or
    writing anything: a start that may yet be refused for another reason leaves the folder as it was."""
    if folder.resolve() in _held or not launch.current().is_rank_zero:
        return
    try:
        file = open(folder / LOCK_FILE)  # noqa: SIM115 (a folder no process ever held has none)
    except OSError:
        return
    with file:
        try:
            fcntl.flock(file, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError(_in_use(folder.resolve(), what, file.read().strip())) from None
        except OSError:
            return  # a file system without locks: hold() says so


def _in_use(folder: Path, what: str, holder: str) -> str:
    return (
        f"{what} {folder} is in use by {holder or 'another process'}: wait for it to end, or stop it first (a "
        "folder takes one process at a time)"
    )


def release(folder: Path) -> None:
    """Give the lock back (the run is over; the process may go on: a sweep's next job, a test)."""
    if file := _held.pop(folder.resolve(), None):
        file.close()


class SweepLock(Callback):
    """A sweep holds its folder from its start (before its jobs and its multirun.yaml) to its end."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        hold(Path(config.hydra.sweep.dir), "the sweep")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        release(Path(config.hydra.sweep.dir))
