"""The Ray cluster a run starts on this machine (``engine.address`` or ``hydra.launcher.address`` null):
the run's alone, and gone with it.

- **Its token is the run's own**, in the environment of the driver and of the processes Ray starts (which
  their user alone can read), never in a file. Ray's default would write ``~/.ray/auth_token`` readable by
  every user of the machine (0644 in Ray 2.60), and any process with it may run code on the cluster. A
  client without the token is refused by Ray's token authentication (on by default).
- **It ends with the driver, however the driver ends.** Ray ends its GCS and raylet with the driver (on
  Linux, a parent-death signal), but its agents (dashboard, runtime env) outlive a driver killed by SIGKILL
  by a minute: they spend 60 s trying to report the raylet's death to the GCS, which is gone too. So a
  reaper, started here in a session of its own, waits on a pipe from the driver and, once the pipe closes
  (the driver ended), kills what is left of the cluster: every process whose environment names its raylet.
- **It listens on loopback only.** Ray 2.60 binds its GCS, raylet and worker servers to every interface
  for a node whose address is the machine's own, and ``ray.init`` turns a loopback ``_node_ip_address``
  into that address. Ray's switch for clusters of one machine (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``,
  the default on macOS and Windows) makes the node's address loopback instead, and then every server binds
  127.0.0.1: nothing of the cluster is reachable from another machine, token or not.
"""

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from mnistlab.runtime.run import internals

TOKEN = "RAY_AUTH_TOKEN"  # Ray reads its token from here before ~/.ray/auth_token
ONE_MACHINE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": the node's address is loopback
RAYLET = "RAY_RAYLET_PID"  # in the environment of every process the raylet starts (agents, workers)
_reaper: subprocess.Popen[bytes] | None = None  # kept: its pipe closes when this process ends


def start(**init: Any) -> None:
    """``ray.init`` of a cluster of this machine with a token of its own, reaped when this process ends."""
    import ray

    os.environ[TOKEN] = secrets.token_hex(32)  # inherited by the processes ray.init starts
    os.environ[ONE_MACHINE] = "0"  # for the processes it starts; this one read it when it imported Ray
    internals.ray_loopback_node()
    ray.init(**init)
    node = internals.ray_node()
    raylets: list[Any] = node.all_processes.get("raylet", []) if node is not None else []
    if sys.platform.startswith("linux") and raylets:  # the agents' environment is read from /proc
        global _reaper
        command = [sys.executable, "-m", __name__, str(raylets[0].process.pid)]
        _reaper = subprocess.Popen(command, stdin=subprocess.PIPE, start_new_session=True, close_fds=True)


def _reap(raylet: int) -> None:
    """Wait for the driver's end (its pipe closes), then kill what is left of its cluster."""
    sys.stdin.buffer.read()
    time.sleep(1.0)  # a driver that ended well has stopped its cluster by now (ray.shutdown, at its exit)
    for process in Path("/proc").iterdir():
        if process.name.isdigit() and _started_by(process, raylet):
            try:
                os.kill(int(process.name), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _started_by(process: Path, raylet: int) -> bool:
    try:
        return f"{RAYLET}={raylet}".encode() in (process / "environ").read_bytes().split(b"\0")
    except OSError:  # gone, or another user's
        return False


if __name__ == "__main__":
    _reap(int(sys.argv[1]))
