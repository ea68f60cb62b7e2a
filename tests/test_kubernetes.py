"""Kubernetes (deploy/kubernetes/): each manifest checked against its Kubeflow CRD's own schema, vendored
(deploy/kubernetes/schemas/), and its exact command run in two "pods" (network namespaces: tests/pods.py)
with what Kubeflow's controller gives each pod (tests/kubeflow.py). No API server runs here."""

import json
import time
from pathlib import Path

import jsonschema
import kubeflow
import pods as namespaces
import pytest
from omegaconf import OmegaConf

from mnistlab.runtime.distributed import rendezvous
from mnistlab.runtime.run import run_folder
from mnistlab.runtime.run.failures import InputError

from composing import EQUIVALENCE, SUITE
from running import FOUR_RANK_LOGS, assert_one_run, assert_trained_as_one_process, one_run

# The pods' network namespaces share one subnet: its tests run in one worker of a parallel run (.ci/run: --dist loadgroup).
pytestmark = pytest.mark.xdist_group("pods")

SCHEMAS = kubeflow.MANIFESTS / "schemas"
MANIFESTS = {"trainjob.yaml": "trainjob.json", "pytorchjob.yaml": "pytorchjob.json"}
JOB = "train-x7k2p"  # a name the API server made from the manifests' generateName


def strict(schema: dict) -> dict:
    """``schema`` refusing unknown fields, as the API server does (kubectl's default strict field validation)."""
    if isinstance(schema, dict):
        schema = {key: strict(value) for key, value in schema.items()}
        known = "properties" in schema and "additionalProperties" not in schema
        if known and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        schema = [strict(item) for item in schema]
    return schema


@pytest.mark.parametrize("name", MANIFESTS)
def test_the_manifest_validates_against_its_crds_vendored_schema(name: str) -> None:
    schema = json.loads((SCHEMAS / MANIFESTS[name]).read_text())
    assert "kubeflow/trainer/blob/v" in schema["$comment"]  # where it came from, at which release
    validator = jsonschema.Draft7Validator(strict(schema))
    manifest = kubeflow.manifest(name)
    assert [error.message for error in validator.iter_errors(manifest)] == []
    manifest["spec"]["nodes"] = 2  # a field of no Kubeflow release: refused, as kubectl would
    assert any("'nodes' was unexpected" in error.message for error in validator.iter_errors(manifest))


@pytest.mark.parametrize("name", MANIFESTS)
def test_the_manifest_holds_the_only_copy_of_the_jobs_shape(name: str) -> None:
    """trainer.num_nodes and trainer.devices follow torchrun, which reads the job's: no second copy."""
    pods = _pods(name)
    assert len(pods) == 2 and all(pod.command[:2] == ["torchrun", "train.py"] for pod in pods)
    assert not [arg for pod in pods for arg in pod.command if arg.startswith(("trainer.devices", "trainer.num_nodes"))]
    assert {pod.env["MNISTLAB_RUN_ID"] for pod in pods} == {JOB}  # the job's name, from its pods' labels


def test_a_pytorchjob_pod_running_plain_python_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in _pods("pytorchjob.yaml")[1].env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(InputError, match=r"^RANK=1 is set \(as a Kubeflow PyTorchJob sets it in each pod\).*torchrun"):
        rendezvous.check_environment(None)


def test_a_job_whose_nodes_disagree_with_trainer_num_nodes_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker of the TrainJob, as torchrun starts it, given trainer.num_nodes=3 on the job's command."""
    env = _pods("trainjob.yaml")[1].env
    nodes, per_node = int(env["PET_NNODES"]), int(env["PET_NPROC_PER_NODE"])
    torchrun = {"TORCHELASTIC_RUN_ID": "none", "WORLD_SIZE": str(nodes * per_node), "LOCAL_WORLD_SIZE": str(per_node)}
    for name, value in (env | torchrun | {"RANK": "2", "LOCAL_RANK": "0"}).items():
        monkeypatch.setenv(name, value)
    cfg = OmegaConf.create({"trainer": {"devices": per_node, "num_nodes": 3}})
    with pytest.raises(InputError, match=r"^torchrun started 4 processes \(WORLD_SIZE\), but .* is 2 x 3"):
        rendezvous.check_environment(cfg)


def _pods(name: str) -> list[kubeflow.Pod]:
    made = kubeflow.trainjob_pods if name == "trainjob.yaml" else kubeflow.pytorchjob_pods
    return made(kubeflow.manifest(name), JOB)


def _start(pods: namespaces.Pods, job: list[kubeflow.Pod], volume: Path, *overrides: str) -> list:
    """Each pod's command, on the volume ``volume``, with the suite's task and ``overrides`` after it."""
    return [
        pods.start(i, [*namespaces.python_module(kubeflow.on_volume(pod.command, volume)), *overrides], pod.env)
        for i, pod in enumerate(job)
    ]


@pytest.mark.slow
def test_two_pods_of_a_pytorchjob_train_as_one_process_in_the_jobs_folder(one_process: Path, tmp_path: Path) -> None:
    """The PyTorchJob's environment (PET_* for torchrun); the TrainJob's trains as one through a lost pod, below."""
    job = _pods("pytorchjob.yaml")
    with namespaces.running([pod.names for pod in job]) as pods:
        started = _start(pods, job, tmp_path, *SUITE, *EQUIVALENCE)
        outputs = [namespaces.processes.finish(process) for process in started]
    assert [process.returncode for process in started] == [0, 0], outputs[0][-2000:] + outputs[1][-2000:]
    run = one_run(tmp_path / "outputs", FOUR_RANK_LOGS)
    assert run.name == JOB
    assert "Starting with 4 processes" in outputs[0]
    assert_trained_as_one_process(run, one_process)


@pytest.mark.slow
def test_a_deleted_pod_ends_the_job_in_bounded_time_and_its_restarted_pods_finish_the_run(
    one_process: Path, tmp_path: Path
) -> None:
    """A TrainJob of two pods of two processes, in the job's folder. Rank 2 (the second pod's first process)
    stops at step 30, in the second epoch; the test then deletes that pod. The first pod's ranks end with the
    resume line; the job's pods, started again as Kubernetes restarts them, continue from the run's last.ckpt
    (step 20) and end as one process does, in one run folder."""
    job = _pods("trainjob.yaml")
    hang = ["+callbacks.hang._target_=faults.HangAt", "+callbacks.hang.step=30", "+callbacks.hang.rank=2"]
    with namespaces.running([pod.names for pod in job]) as pods:
        first, second = _start(pods, job, tmp_path, *SUITE, *EQUIVALENCE, *hang)
        _wait_until_stopped(pods, pod=1, timeout=240)
        deleted = time.monotonic()
        pods.delete(1)
        output = namespaces.processes.finish(first, timeout=120)
        took = time.monotonic() - deleted
        second.wait(timeout=30)
        run = tmp_path / "outputs" / "train" / "runs" / JOB
        assert first.returncode != 0 and took < 60, output[-3000:]  # not the strategy's 600 s timeout
        log = (run / "train.log").read_text()
        assert "Stopped at step 30: rank 2, 3 stopped answering" in log, log[-3000:]
        assert f"Continue with: python train.py resume={run}" in log
        restarted = _start(pods, job, tmp_path, *SUITE, *EQUIVALENCE, *hang)
        outputs = [namespaces.processes.finish(process) for process in restarted]
    assert [process.returncode for process in restarted] == [0, 0], outputs[0][-2000:] + outputs[1][-2000:]
    assert "Starting with 4 processes" in outputs[0]
    assert f"Resuming from {run_folder.last_checkpoint(run)}" in (run / "train.log").read_text()
    assert_one_run(run, FOUR_RANK_LOGS)
    assert_trained_as_one_process(run, one_process)


def _wait_until_stopped(pods: namespaces.Pods, pod: int, timeout: float) -> None:
    """Until a process of pod ``pod`` is stopped (SIGSTOP: state T)."""
    stopped = lambda: "T" in map(namespaces.processes.state, pods.pids(pod))
    namespaces.processes.until(stopped, timeout, f"a process of pod {pod} stopped", every=0.5)
