"""The processes the tests start: each in a session of its own, so that a test that ends, passes or
times out ends the process and every rank it started (one ``killpg``), and no orphaned rank slows
the tests after it."""

import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[1]
# What the machinery's tests train: the suite's own task (tests/suite_task.py, tests/conf/), never the example,
# so that they pass whatever a user makes of network.py, module.py, data.py, conf/data/ and conf/model/.
SUITE = [
    f"hydra.searchpath=[file://{ROOT / 'tests' / 'conf'}]",
    "data=suite",
    "model=suite",
    "monitor=val/acc",  # what the suite's module logs, whatever conf/run.yaml monitors for the user's
    "mode=max",
]
TRAINERS = ("train.py", "eval.py")  # the entry points whose config holds a Trainer: they take a task
in_slow_test = True  # set by conftest for each test: only a test marked slow may start a process
started: list[subprocess.Popen[str]] = []  # this test's, ended with it (conftest), whatever became of the test


def start(
    command: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    cwd: Path = ROOT,
    output=subprocess.PIPE,
    errors=subprocess.STDOUT,
) -> subprocess.Popen[str]:
    """Start ``command`` in a new session, its stderr merged into ``output`` (a pipe, or a file) unless
    ``errors`` says where else. The faults tests inject (``tests/faults.py``) are importable there as
    ``faults.<name>``."""
    _check_slow(command)
    process = subprocess.Popen(
        list(command),
        cwd=cwd,
        env=with_tests_importable(env),
        stdout=output,
        stderr=errors,
        text=True,
        start_new_session=True,
    )
    started.append(process)
    return process


def until(condition: Callable[[], T], timeout: float, what: str | Callable[[], str], every: float = 0.2) -> T:
    """The suite's one way to wait: poll ``condition`` until it returns something true, and return that;
    past ``timeout`` s, fail the test saying ``what`` was awaited (a callable: asked then, e.g. for a log's
    tail). A condition may assert, to fail at once (the process it waits on has ended)."""
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        if time.monotonic() > deadline:
            pytest.fail(f"{what() if callable(what) else what}: not within {timeout:g} s")
        time.sleep(every)
    return result


def state(pid: int) -> str:
    """A process's state letter in /proc (T: stopped by SIGSTOP), "" once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return ""


def finish(process: subprocess.Popen[str], timeout: float = 300) -> str:
    """Wait for ``process`` and return its output; past ``timeout`` s, kill its group and fail the test."""
    return _wait(process, timeout)[0] or ""


def _wait(process: subprocess.Popen[str], timeout: float) -> tuple[str | None, str | None]:
    try:
        outputs = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        end_group(process)
        last = "".join(filter(None, process.communicate()))
        pytest.fail(f"{process.args} ran past {timeout} s; its last output:\n{last[-3000:]}")
    end_group(process)  # ranks a failed run left behind
    return outputs


def end_all() -> None:
    """End every process the test started with ``start`` and its group: a test that failed while waiting
    for one leaves nothing behind."""
    while started:
        process = started.pop()
        end_group(process)
        process.wait()


def end_group(process: subprocess.Popen[str]) -> None:
    """SIGKILL every process of ``process``'s session that is still alive (nothing when none is)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # the group is gone (PermissionError: macOS, a zombie leader)
        pass


def run(
    command: Sequence[str], *, timeout: float = 300, env: dict[str, str] | None = None, cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` to its end: exit status, stdout, and stderr kept apart (the tests read each)."""
    process = start(command, env=env, cwd=cwd, errors=subprocess.PIPE)
    stdout, stderr = _wait(process, timeout)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _check_slow(command: Sequence[str]) -> None:
    if not in_slow_test:  # pytest -m "not slow" is the quick tier: it starts no process
        pytest.fail(f"this test starts a process ({' '.join(map(str, command))[:200]}): mark it slow")


def with_tests_importable(env: dict[str, str] | None) -> dict[str, str]:
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(ROOT / "tests")]))
    return env


def python(script: str, *args: str, task: Sequence[str] = SUITE) -> list[str]:
    """``python <script> <args>``; for train.py and eval.py, training ``task`` (the suite's by default),
    given after Hydra's flags (``-m``) and before ``args``, which may override it."""
    if script not in TRAINERS:
        return [sys.executable, str(ROOT / script), *args]
    flags = list(itertools.takewhile(lambda arg: arg.startswith("-"), args))
    return [sys.executable, str(ROOT / script), *flags, *task, *args[len(flags) :]]
