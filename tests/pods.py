"""Pods on one machine: each a network namespace of its own, with its own address, host name and
/etc/hosts (the names of the other pods, as a headless Service gives them), linked by a bridge. A
process in one reaches another only through that network, by name, as between two machines.

Deleting a pod is SIGKILL to every process of its namespace, whatever session each one is in.
Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and iproute2's ``ip``, as CI has.
"""

import itertools
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import processes

SUBNET = "10.89.0"  # a private /24 for the pods: 10.89.0.1, .2, ...
_counter = itertools.count()


class Pods:
    def __init__(self, hosts: Sequence[Sequence[str]]) -> None:
        self.hosts = [list(names) for names in hosts]
        self.tag = f"{os.getpid() % 10000}x{next(_counter)}"
        self.namespaces = [f"pod{self.tag}-{i}" for i in range(len(hosts))]
        self.bridge = f"br{self.tag}"[:15]

    def make(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("link", "set", self.bridge, "up")
        table = "127.0.0.1 localhost\n" + "".join(
            f"{SUBNET}.{i + 1} {' '.join(names)}\n" for i, names in enumerate(self.hosts)
        )
        for i, namespace in enumerate(self.namespaces):
            inside, outside = f"vp{self.tag}-{i}"[:15], f"vh{self.tag}-{i}"[:15]
            _ip("netns", "add", namespace)
            _ip("link", "add", inside, "type", "veth", "peer", "name", outside)
            _ip("link", "set", inside, "netns", namespace)
            _ip("link", "set", outside, "master", self.bridge, "up")
            _ip("-n", namespace, "addr", "add", f"{SUBNET}.{i + 1}/24", "dev", inside)
            _ip("-n", namespace, "link", "set", inside, "up")
            _ip("-n", namespace, "link", "set", "lo", "up")
            hosts = Path("/etc/netns") / namespace / "hosts"  # ip netns exec mounts it on /etc/hosts
            hosts.parent.mkdir(parents=True, exist_ok=True)
            hosts.write_text(table)

    def start(self, pod: int, command: Sequence[str], env: dict[str, str]) -> subprocess.Popen[str]:
        """Run ``command`` in pod ``pod``, under its host name, with ``env`` added to this environment."""
        namespace, host = self.namespaces[pod], self.hosts[pod][0]
        as_host = ["unshare", "--uts", "sh", "-c", 'hostname "$1" && shift && exec "$@"', "sh", host]
        return processes.start(["ip", "netns", "exec", namespace, *as_host, *command], env=os.environ | env)

    def delete(self, pod: int) -> None:
        """SIGKILL every process of pod ``pod``, as Kubernetes deleting it."""
        for pid in self.pids(pod):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def pids(self, pod: int) -> list[int]:
        return [int(pid) for pid in _ip("netns", "pids", self.namespaces[pod]).split()]

    def remove(self) -> None:
        for pod, namespace in enumerate(self.namespaces):
            self.delete(pod)
            subprocess.run(["ip", "netns", "delete", namespace], check=False, timeout=30)
            shutil.rmtree(Path("/etc/netns") / namespace, ignore_errors=True)
        subprocess.run(["ip", "link", "delete", self.bridge], check=False, timeout=30)


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30).stdout


def python_module(command: Sequence[str]) -> list[str]:
    """A manifest's command with its console scripts (torchrun) run by this interpreter, as the image's
    PATH would find them."""
    scripts = {"torchrun": [sys.executable, "-m", "torch.distributed.run"], "python": [sys.executable]}
    return [*scripts.get(command[0], [command[0]]), *command[1:]]


@contextmanager
def running(hosts: Sequence[Sequence[str]]) -> Iterator[Pods]:
    """Pods named ``hosts`` (each pod's names, its host name first), removed with all their processes after."""
    pods = Pods(hosts)
    try:
        pods.make()
        yield pods
    finally:
        pods.remove()
