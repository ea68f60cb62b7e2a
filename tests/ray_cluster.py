"""A Ray cluster on this machine, as ``ray start`` makes one on several: a head that runs no work (0
CPUs) and two worker nodes of one CPU each, without a dashboard or usage statistics, with Ray's token
authentication (a token of its own, given to its nodes and clients in ``RAY_AUTH_TOKEN``). Each node's
``ray start --block`` runs in a session of its own, so that ending it (``killpg``) ends its raylet and
every worker it started."""

import os
import secrets
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import processes
from running import free_port

RAY = [sys.executable, "-m", "ray.scripts.scripts"]  # the `ray` command of this environment


@contextmanager
def cluster(workers: int = 2, timeout: float = 180) -> Iterator[tuple[str, dict[str, str]]]:
    """Yield the head's address (``<host>:<port>``) once ``workers`` CPUs have joined, and the variables a
    client needs (the token)."""
    port = free_port()
    client = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32), "RAY_USAGE_STATS_ENABLED": "0"}
    env = processes.with_tests_importable(None) | client
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths live under it
    head = [*RAY, "start", "--head", f"--port={port}", "--num-cpus=0", "--include-dashboard=false"]
    nodes = [_start([*head, "--disable-usage-stats", f"--temp-dir={temp}", "--block"], env, temp)]
    address = f"127.0.0.1:{port}"
    try:
        _wait_for(address, cpus=0, timeout=timeout, env=env, temp=temp)
        for node in range(workers):
            worker = [*RAY, "start", f"--address={address}", "--num-cpus=1", *_own_ports(node, temp), "--block"]
            nodes.append(_start(worker, env, temp))
        _wait_for(address, cpus=workers, timeout=timeout, env=env, temp=temp)
        yield address, client
    finally:
        for node in reversed(nodes):
            try:
                os.killpg(node.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            node.wait()


def _own_ports(node: int, temp: str) -> list[str]:
    """Ports and sockets of a node's own: Ray sizes a node's defaults for one node per host, and a second
    node of this host found its object store's socket taken ("bind: Address already in use"). The ports
    lie below the ephemeral range, where free_port and the kernel pick."""
    base = 20_000 + (os.getpid() % 100) * 120 + node * 60
    named = ["node-manager", "object-manager", "metrics-export", "runtime-env-agent", "dashboard-agent-grpc"]
    ports = [f"--{name}-port={base + i}" for i, name in enumerate([*named, "dashboard-agent-listen"])]
    own = Path(temp) / f"n{node}"  # its sockets (the object store's, the raylet's) under a folder of its own
    own.mkdir()
    return [*ports, f"--temp-dir={own}", f"--min-worker-port={base + 10}", f"--max-worker-port={base + 59}"]


def _start(command: list[str], env: dict[str, str], temp: str) -> subprocess.Popen[bytes]:
    # Not processes.start: the cluster outlives one test (a module's fixture), and processes.end_all ends
    # what a test started.
    with open(Path(temp) / f"node-{len(list(Path(temp).glob('node-*')))}.log", "w") as log:
        return subprocess.Popen(command, env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT)


def _wait_for(address: str, cpus: int, timeout: float, env: dict[str, str], temp: str) -> None:
    def joined() -> bool:
        status = subprocess.run(
            [*RAY, "status", f"--address={address}"], env=env, capture_output=True, text=True, timeout=60, check=False
        )
        return status.returncode == 0 and (f"/{cpus}.0 CPU" if cpus else "Active:") in status.stdout  # 0 CPUs: no line

    def said() -> str:
        logs = "".join(f"{log.name}: {log.read_text()[-1500:]}\n" for log in sorted(Path(temp).glob("node-*.log")))
        return f"the Ray cluster at {address} having {cpus} CPUs; its nodes said:\n{logs}"

    processes.until(joined, timeout, said, every=2)
