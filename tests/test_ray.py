"""engine=ray (conf/engine/ray.yaml): Ray Train's workers run a run's ranks, on a real Ray cluster of this
machine (tests/ray_cluster.py: a head and two worker nodes)."""

import ipaddress
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray_cluster
from hydra.utils import instantiate
from test_optuna import PRUNES_THE_LAST, check_pruned

from mnistlab.runtime.config import schema
from mnistlab.runtime.run import run_folder
from mnistlab.runtime.run.failures import InputError

import processes
from composing import EQUIVALENCE, compose_config
from running import assert_trained_as_one_process, free_port

# One local Ray cluster for the module: its tests run in one worker of a parallel run (.ci/run: --dist loadgroup).
pytestmark = pytest.mark.xdist_group("ray")

RAY = ["engine=ray"]


def test_engine_ray_composes_and_fits_the_schema(tmp_path: Path) -> None:
    cfg = compose_config("train", tmp_path, RAY)
    schema.check(cfg, schema.TrainConfig)
    scaling = instantiate(cfg.engine.scaling_config)
    assert (scaling.num_workers, scaling.use_gpu) == (2, False)
    assert cfg.trainer.strategy._target_ == "ray.train.lightning.RayDDPStrategy"


def test_workers_that_do_not_divide_the_batch_are_refused_in_one_line(tmp_path: Path) -> None:
    cfg = compose_config("train", tmp_path, [*RAY, "engine.scaling_config.num_workers=3", "data.batch_size=64"])
    with pytest.raises(InputError, match=r"multiple of the world size 3 \(engine.scaling_config.num_workers\)"):
        schema.check(cfg, schema.TrainConfig)


def test_devices_beside_ray_workers_are_refused_in_one_line(tmp_path: Path) -> None:
    cfg = compose_config("train", tmp_path, [*RAY, "trainer.devices=2"])
    with pytest.raises(InputError, match=r"^engine=ray runs one rank per Ray worker, so trainer.devices=2 and"):
        schema.check(cfg, schema.TrainConfig)


@pytest.mark.no_gpu
def test_ray_asked_for_gpus_on_a_machine_without_is_refused_in_one_line(tmp_path: Path) -> None:
    from mnistlab.tasks import train

    cfg = compose_config("train", tmp_path, [*RAY, "engine.scaling_config.use_gpu=true"])
    with pytest.raises(InputError, match=r"^engine.scaling_config.use_gpu=true asks for 2 GPUs and this machine has 0"):
        train(cfg)
    assert not run_folder.checkpoints(tmp_path).exists()


def test_an_unreachable_ray_address_is_refused_in_one_line_within_its_timeout(tmp_path: Path) -> None:
    from mnistlab.tasks import train

    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    cfg = compose_config("train", tmp_path, [*RAY, f"engine.address={address}", "engine.connect_timeout_s=2"])
    started = time.monotonic()
    with pytest.raises(InputError, match=rf"^engine.address={address}: no Ray cluster answered there within 2"):
        train(cfg)
    assert time.monotonic() - started < 10


# The session's: a worker of a parallel run interleaves other modules' tests with these, and pytest ends a
# module's fixtures whenever the next test is another module's (a second cluster cost 40 s).
@pytest.fixture(scope="session")
def cluster() -> Iterator[tuple[str, dict[str, str]]]:
    with ray_cluster.cluster(workers=2) as running:
        yield running


def _train(
    cluster: tuple[str, dict[str, str]], *overrides: str, engine: bool = True
) -> subprocess.CompletedProcess[str]:
    """train.py with ``overrides``, a client of ``cluster``: the suite's task on its CPUs; ``engine``: with
    engine=ray on it (a resumed run has it from its folder)."""
    address, client = cluster
    flags = [arg for arg in overrides if arg.startswith("-")]
    command = processes.python("train.py", *flags, "trainer.accelerator=cpu", *overrides[len(flags) :])
    if engine and not any(override.startswith("resume=") for override in overrides):
        command += [*RAY, f"engine.address={address}"]
    return processes.run(command, env=os.environ | client, timeout=300)


@pytest.mark.slow
def test_a_killed_ray_worker_stops_the_run_with_the_resume_line(cluster: tuple[str, dict[str, str]], tmp_path) -> None:
    """Rank 1's worker is killed (SIGKILL) at step 30, in the second epoch: the run stops in one line that
    gives the resume command, within bounded time. (Ray starting the workers again from the run's last.ckpt,
    to one process's end: the max_failures test below; ``resume=`` replaying a run's overrides: test_resume.)"""
    kill = ["+callbacks.kill._target_=faults.KillAt", "+callbacks.kill.step=30", "+callbacks.kill.rank=1"]
    started = time.monotonic()
    result = _train(cluster, *EQUIVALENCE, *kill, f"paths.log_dir={tmp_path}")
    took = time.monotonic() - started
    (run,) = (tmp_path / "train" / "runs").iterdir()
    assert result.returncode == 1, result.stderr[-3000:]
    (said,) = [
        line.partition(" - ")[2] for line in result.stdout.splitlines() if " - Stopped: " in line
    ]  # the driver's
    assert said == (
        "Stopped: a Ray worker failed (The actor is dead because its worker process has died). "
        f"Continue with: python train.py resume={run}"
    )
    assert said in (run / "train.log").read_text()
    assert run_folder.last_checkpoint(run).is_file()  # step 20's, for the resume the line gives
    assert took < 180, took


@pytest.mark.slow
def test_an_optuna_sweep_on_ray_runs_each_job_there_and_prunes_its_hopeless_trial(
    cluster: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    """hydra/launcher=ray: each job a Ray task of the cluster, two at a time, in its own folder of the sweep;
    the Optuna sweeper prunes the hopeless one from the values they report, and the table ends it."""
    address, _ = cluster
    on_ray = ["hydra/launcher=ray", f"hydra.launcher.address={address}", "hydra.sweeper.n_jobs=2"]
    result = _train(cluster, *PRUNES_THE_LAST, *on_ray, f"paths.log_dir={tmp_path}", engine=False)
    assert "Launching 2 jobs on Ray" in result.stdout
    sweep = check_pruned(tmp_path, result)
    given = [(sweep / str(job) / ".hydra" / "overrides.yaml").read_text() for job in range(3)]
    assert sorted(re.findall(r"model\.optimizer\.lr=([\d.e-]+)", "".join(given))) == ["0.003", "0.01", "1e-07"]


@pytest.mark.slow
def test_with_max_failures_ray_starts_the_workers_again_and_they_resume(
    cluster: tuple[str, dict[str, str]], one_process: Path, tmp_path: Path
) -> None:
    """Two Ray workers train as one process does, in one run folder; with engine.failure_config.max_failures=1
    they do so through a failure: rank 1's worker killed at step 30, Ray starts both again, and they continue
    from the run's last.ckpt (step 20), which this launch wrote, to one process's end."""
    kill = [
        "+callbacks.kill._target_=faults.SignalAt",  # a fresh run's rank 1 only: not again once resumed
        "+callbacks.kill.step=30",
        "+callbacks.kill.signal=SIGKILL",
        "+callbacks.kill.rank=1",
    ]
    retry = ["engine.failure_config.max_failures=1"]
    result = _train(cluster, *EQUIVALENCE, *kill, *retry, f"paths.log_dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = (tmp_path / "train" / "runs").iterdir()
    last = run_folder.last_checkpoint(run)
    assert f"Resuming from {last}, this run folder's last checkpoint" in (run / "train.log").read_text()
    assert [p.relative_to(run).as_posix() for p in run.rglob("config.yaml")] == [".hydra/config.yaml"]
    assert [p.name for p in run.rglob("hparams.yaml")] == ["hparams.yaml"]  # one TensorBoard run
    for rank, log in enumerate(["train.log", "train_ddp_process_1.log"]):
        assert f"Ray Train's worker of rank {rank} of 2" in (run / log).read_text()
    assert json.loads((run / "metrics.json").read_text())["test/acc"] > 0
    assert_trained_as_one_process(run, one_process)


GCS_PROBE = """
import sys
from ray._raylet import GcsClient
try:
    GcsClient(address=sys.argv[1]).internal_kv_get(b"probe", None, timeout=10)
    print("answered")
except Exception as err:
    print(type(err).__name__)
"""  # a request to the GCS at argv[1], with whatever token the environment gives


def _started_by(raylet: int) -> list[int]:
    """The processes whose environment names ``raylet``: what it started (agents, workers)."""
    mark = f"RAY_RAYLET_PID={raylet}".encode()
    found = []
    for process in Path("/proc").iterdir():
        try:
            if process.name.isdigit() and mark in (process / "environ").read_bytes().split(b"\0"):
                found.append(int(process.name))
        except OSError:
            pass
    return [pid for pid in found if _running(pid)]


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, waiting for a parent to reap it, does not)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def _loopback(address: str) -> bool:
    """Whether a listening address of ``ss`` (``127.0.0.1:80``, ``[::ffff:127.0.0.1]:80``, ``*:80``) is loopback."""
    host = address.rpartition(":")[0].strip("[]").removeprefix("::ffff:")
    return ipaddress.ip_address(host).is_loopback if host != "*" else False


def _children(pid: int) -> dict[int, str]:
    command = ["ps", "-o", "pid=,comm=", "--ppid", str(pid)]
    listed = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return {int(pid): name for pid, name in (line.split(None, 1) for line in listed.splitlines())}


@pytest.mark.slow
def test_a_local_ray_cluster_keeps_its_token_private_and_ends_with_its_driver(tmp_path: Path) -> None:
    """engine.address null: the driver starts a cluster of this machine for the run. Its token is in no file
    (Ray's default, ~/.ray/auth_token, is readable by every user); a client without it is refused; its
    processes listen on loopback alone; SIGKILL of the driver leaves none of them behind."""
    home = tmp_path / "home"
    home.mkdir()
    command = processes.python(
        "train.py", *RAY, "trainer.accelerator=cpu", "trainer.max_epochs=100", f"paths.log_dir={tmp_path}"
    )
    driver = processes.start(command, env=os.environ | {"HOME": str(home)}, output=subprocess.DEVNULL)
    log = processes.until(lambda: next(tmp_path.glob("train/runs/*/train.log"), None), 120, "the run's train.log")
    processes.until(lambda: "Ray Train's worker of rank 0" in log.read_text(), 120, "Ray's workers training")
    (raylet,) = [pid for pid, name in _children(driver.pid).items() if name == "raylet"]
    (gcs,) = [pid for pid, name in _children(driver.pid).items() if name == "gcs_server"]
    cluster = {driver.pid, raylet, gcs, *_started_by(raylet)}
    sockets = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout.splitlines()
    listening = {line.split()[3]: line for line in sockets if any(f"pid={pid}," in line for pid in cluster)}
    print("listening:", *sorted(listening.values()), sep="\n")
    # Every server of Ray's is on loopback. The one exception is torch's: the store of the workers' process
    # group (a TCPStore, which binds every interface in any DDP run: torch gives it no address), which the
    # other rank is connected to.
    elsewhere = [address.rpartition(":")[2] for address in listening if not _loopback(address)]
    assert len(elsewhere) == 1, listening
    established = subprocess.run(["ss", "-tnH", "state", "established"], capture_output=True, text=True, check=True)
    peers = [line.split()[3] for line in established.stdout.splitlines()]
    assert any(_loopback(peer) and peer.endswith(f":{elsewhere[0]}") for peer in peers), established.stdout
    (gcs_port,) = {address.rpartition(":")[2] for address, line in listening.items() if f"pid={gcs}," in line}
    assert not (home / ".ray").exists()
    token = (Path("/proc") / str(raylet) / "environ").read_bytes().split(b"RAY_AUTH_TOKEN=")[1].split(b"\0")[0]
    for given, answered in (
        ({}, False),
        ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "wrong"}, False),
        ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token.decode()}, True),
    ):
        client = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_TOKEN"} | {"HOME": str(home)} | given
        probe = processes.run([sys.executable, "-c", GCS_PROBE, f"127.0.0.1:{gcs_port}"], env=client, timeout=60)
        assert probe.stdout.strip() == ("answered" if answered else "AuthenticationError"), probe.stderr[-2000:]

    driver.kill()  # SIGKILL: no atexit, no ray.shutdown
    driver.wait()

    def ended() -> bool:
        return not _started_by(raylet) and not any(map(_running, (raylet, gcs)))

    processes.until(ended, 15, "the GCS, raylet, agents and workers of the killed driver's cluster ending")
