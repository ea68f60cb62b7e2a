"""What Kubeflow's controllers give each pod of a manifest of deploy/kubernetes/: its host name, its
environment and its command, as the code of the releases whose CRDs the repository vendors does:

- Trainer v2.3 (TrainJob, torch-distributed runtime; ``pkg/runtime/framework/plugins/torch/torch.go``):
  ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK`` (the pod's Job completion index),
  ``PET_MASTER_ADDR=<job>-node-0-0.<job>``, ``PET_MASTER_PORT=29500``; pods named ``<job>-node-0-<index>``.
- Training Operator v1.9 (PyTorchJob; ``pkg/controller.v1/pytorch/envvar.go``, ``master.go``): ``MASTER_ADDR``
  and ``PET_MASTER_ADDR`` (``<job>-master-0``), ``MASTER_PORT`` and ``PET_MASTER_PORT`` (the ``pytorchjob-port``),
  ``WORLD_SIZE`` (pods x nprocPerNode), ``RANK`` and ``PET_NODE_RANK`` (the pod's: Master 0, Worker i + 1),
  ``PET_NPROC_PER_NODE``, ``PET_NNODES``, ``PYTHONUNBUFFERED``; pods named ``<job>-<type>-<index>``.

Each pod's labels (``jobset.sigs.k8s.io/jobset-name``, ``training.kubeflow.org/job-name``) hold the job's
name; the downward API (``valueFrom.fieldRef``) reads them into the variables the manifest names.
"""

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from composing import ROOT

MANIFESTS = ROOT / "deploy" / "kubernetes"
VOLUME = "/workspace/volume"  # where the manifests mount their volume


@dataclass
class Pod:
    host: str  # the pod's host name; the others reach it by this name (a headless Service)
    names: list[str]  # the names its address goes by
    env: dict[str, str]
    command: list[str]  # the container's command and args


def manifest(name: str) -> dict:
    return yaml.safe_load((MANIFESTS / name).read_text())


def trainjob_pods(job: dict, name: str) -> list[Pod]:
    """The pods of TrainJob ``job``, created under the name ``name`` (from its generateName)."""
    trainer = job["spec"]["trainer"]
    labels = {"jobset.sigs.k8s.io/jobset-name": name}
    pods = []
    for index in range(trainer["numNodes"]):
        env = _downward(trainer.get("env", []), labels) | {
            "PET_NNODES": str(trainer["numNodes"]),
            "PET_NPROC_PER_NODE": str(trainer.get("numProcPerNode", "auto")),
            "PET_NODE_RANK": str(index),
            "PET_MASTER_ADDR": f"{name}-node-0-0.{name}",
            "PET_MASTER_PORT": "29500",
        }
        host = f"{name}-node-0-{index}"
        pods.append(Pod(host, [f"{host}.{name}", host], env, [*trainer["command"], *trainer.get("args", [])]))
    return pods


def pytorchjob_pods(job: dict, name: str) -> list[Pod]:
    """The pods of PyTorchJob ``job``, created under the name ``name``: the Master, then the Workers."""
    replicas = job["spec"]["pytorchReplicaSpecs"]
    nproc = job["spec"].get("nprocPerNode")
    pods_count = sum(spec["replicas"] for spec in replicas.values())
    (master,) = [c for c in replicas["Master"]["template"]["spec"]["containers"] if c["name"] == "pytorch"]
    (port,) = [p["containerPort"] for p in master["ports"] if p["name"] == "pytorchjob-port"]
    labels = {"training.kubeflow.org/job-name": name}
    pods, rank = [], 0
    for kind in ("Master", "Worker"):
        (container,) = [c for c in replicas[kind]["template"]["spec"]["containers"] if c["name"] == "pytorch"]
        for index in range(replicas[kind]["replicas"]):
            env = _downward(container.get("env", []), labels) | {
                "PYTHONUNBUFFERED": "1",
                "MASTER_PORT": str(port),
                "PET_MASTER_PORT": str(port),
                "MASTER_ADDR": f"{name}-master-0",
                "PET_MASTER_ADDR": f"{name}-master-0",
                "WORLD_SIZE": str(pods_count * int(nproc or 1)),
                "RANK": str(rank),
                "PET_NODE_RANK": str(rank),
                "PET_NNODES": str(pods_count),
            }
            if nproc is not None:
                env["PET_NPROC_PER_NODE"] = nproc
            host = f"{name}-{kind.lower()}-{index}"
            pods.append(Pod(host, [host], env, [*container["command"], *container.get("args", [])]))
            rank += 1
    return pods


def _downward(variables: list[dict], labels: dict[str, str]) -> dict[str, str]:
    """The container's variables: values as written, label references (the downward API) read from ``labels``."""
    env = {}
    for variable in variables:
        if "value" in variable:
            env[variable["name"]] = variable["value"]
        else:
            path = variable["valueFrom"]["fieldRef"]["fieldPath"]
            (label,) = re.fullmatch(r"metadata\.labels\['(.+)'\]", path).groups()  # type: ignore[union-attr]
            env[variable["name"]] = labels[label]
    return env


def on_volume(command: list[str], volume: Path) -> list[str]:
    """``command`` as it reads in a pod where the manifest's volume is the folder ``volume``."""
    return [part.replace(VOLUME, str(volume)) for part in command]
