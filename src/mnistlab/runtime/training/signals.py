"""The signals that ask a run to stop, noted from the moment the process starts.

SIGTERM (Kubernetes, torchrun, SLURM's preemption and ``scontrol requeue``), SIGUSR1 (SLURM's
warning before a time limit, ``--signal=USR1@<s>``), SIGUSR2 (submitit's, in ``hydra/launcher=slurm``
sweeps) and SIGINT (Ctrl-C): the first is acted on as SIGTERM is, a second Ctrl-C aborts at once
(Python's KeyboardInterrupt, which Lightning turns into a shutdown that saves nothing). The entry point listens before it imports torch, so a signal that comes while the process
still imports, loads data or sets up the trainer is kept (SIGUSR1's default action would end the
process, and a SLURM job warned of its time limit would not be requeued): ``SafeStop`` acts on it
at the first step. Only noted here, never acted on: a handler runs between any two bytecodes.
Where no ``SafeStop`` will act (none configured, or training is over) ``release`` gives each signal
its default action back.
"""

import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGINT)
WARNINGS = (signal.SIGUSR1, signal.SIGUSR2)  # "time is nearly up": in a SLURM job, requeue it

_received = 0  # the first of SIGNALS this process received and no run has acted on yet; 0 for none


def listen(forward: Callable[[int], None] | None = None) -> None:
    """Note SIGNALS from now on; ``forward`` passes the first one on (to the ranks Lightning started)."""

    def note(signum: int, frame: FrameType | None) -> None:
        global _received
        if signum == signal.SIGINT and _received == signal.SIGINT:
            signal.default_int_handler(signum, frame)  # the second Ctrl-C: KeyboardInterrupt, now
        # Ctrl-C reaches every process of the terminal's foreground group, the ranks Lightning started
        # too: forwarded, it would be their second.
        if not _received and forward is not None and signum != signal.SIGINT:
            forward(signum)
        _received = _received or signum

    if _in_main_thread():
        for signum in SIGNALS:
            signal.signal(signum, note)


def received() -> int:
    return _received


def acted_on() -> None:
    """The run stopped for the signal: a later run in this process (a notebook, a test) starts clean."""
    global _received
    _received = 0


def release() -> None:
    """Back to each signal's default action; one noted and not acted on gets it now."""
    global _received
    if not _in_main_thread():
        return
    for signum in SIGNALS:
        signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
    pending, _received = _received, 0
    if pending:
        os.kill(os.getpid(), pending)


def _in_main_thread() -> bool:
    """Only the main thread may set handlers. Ray Train runs a worker's training in another thread: its
    signals are Ray's, which stops its workers itself (engine=ray)."""
    return threading.current_thread() is threading.main_thread()
