"""The SLURM tier: the project run by a real SLURM cluster, started for these tests on this machine.

tests/slurm/cluster.sh starts it (two nodes of this host, private ports and folders); it needs root
and Debian's slurmctld, slurmd, slurm-client and munge, which .ci/run installs. Where it cannot
start these tests skip, saying why; in CI (CI=true) they fail (conftest).
"""

import csv
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import optuna
import pytest
import torch
from omegaconf import OmegaConf

from mnistlab.runtime.run import run_folder

import processes
from composing import DETERMINISTIC, ROOT, SUITE, SUITE_DATA
from running import assert_same_weights, free_port
from running import last_checkpoint as _last

# One cluster for the module: its tests run in one worker of a parallel run (.ci/run: --dist loadgroup).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]
CLUSTER = ROOT / "tests" / "slurm" / "cluster.sh"
SBATCH = ROOT / "slurm" / "train.sbatch"
# Two DDP ranks, 3 epochs of 600 steps (about 3 s each here), last.ckpt at each epoch end.
STEPS = 600
RUN = [
    "trainer.accelerator=cpu",
    *DETERMINISTIC,
    f"trainer.limit_train_batches={STEPS}",
    f"data.train_size={STEPS * SUITE_DATA['batch_size']}",  # STEPS batches an epoch of the suite's data
]


@pytest.fixture(scope="session")  # not the module's: see test_ray.cluster
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A private SLURM cluster for this module's tests: the environment its clients (sbatch, scontrol) need."""
    missing = [tool for tool in ("munged", "slurmctld", "slurmd", "sbatch") if shutil.which(tool) is None]
    if missing or os.geteuid() != 0:
        pytest.skip(
            f"needs root and {', '.join(missing) or 'SLURM'} (apt-get install slurmctld slurmd slurm-client munge)"
        )
    folder = tmp_path_factory.mktemp("slurm")
    ports = [free_port() for _ in range(3)]
    started = subprocess.run(
        ["bash", CLUSTER, "start", folder, *ports], capture_output=True, text=True, timeout=120, check=False
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")} | {"SLURM_CONF": f"{folder}/slurm.conf"}
    env = processes.with_tests_importable(env)  # the suite's task (suite_task), the faults, in every job
    try:
        if started.returncode:
            pytest.skip(f"the cluster did not start: {started.stderr.strip()[-500:]}")
        yield env
    finally:
        subprocess.run(["bash", CLUSTER, "stop", folder], env=env, capture_output=True, timeout=120, check=False)


def _sbatch(env: dict[str, str], out: Path, *overrides: str, options: tuple[str, ...] = ()) -> str:
    """Submit slurm/train.sbatch from the project's folder (as docs/distributed.md says); return the job id."""
    command = ["sbatch", "--parsable", "--cpus-per-task=1", f"--output={out}/slurm-%j.out", *options, SBATCH, *SUITE]
    submitted = subprocess.run(
        [*command, *overrides, f"paths.log_dir={out}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,  # the assertion below shows sbatch's message
    )
    assert submitted.returncode == 0, submitted.stderr
    return submitted.stdout.strip()


def _job(env: dict[str, str], job: str) -> dict[str, str]:
    command = ["scontrol", "-o", "show", "job", job]
    shown = subprocess.run(command, env=env, capture_output=True, text=True, timeout=30, check=True)
    return dict(field.split("=", 1) for field in shown.stdout.split() if "=" in field)


def _wait(env: dict[str, str], job: str, until: object, timeout: float = 600) -> dict[str, str]:
    seen: dict[str, str] = {}

    def reached() -> dict[str, str] | None:
        seen.update(_job(env, job))
        return dict(seen) if until(seen) else None

    return processes.until(reached, timeout, lambda: f"job {job} past {seen.get('JobState')}", every=0.1)


def _completing_nodes(env: dict[str, str]) -> list[str]:
    command = ["sinfo", "-h", "-N", "-t", "completing", "-o", "%N"]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=30, check=True).stdout.split()


def _start_requeued(env: dict[str, str], job: str, *changes: str) -> None:
    """SLURM holds a requeued job back for a while (BeginTime); start it again soon, but only once the
    nodes have cleaned up after it and in a later second than its kill: slurmd refuses a credential
    made in the second it revoked the job's old one ("Job credential revoked"; seen in CI)."""
    _wait(env, job, lambda s: s.get("JobState") == "PENDING" and s.get("Restarts") == "1")
    _wait(env, job, lambda s: not _completing_nodes(env))
    second = int(time.time())  # (StartTime=now+1 would wait for the backfill scheduler: up to 30 s)
    processes.until(lambda: int(time.time()) > second, 5, "the next second", every=0.05)
    update = ["scontrol", "update", f"JobId={job}", "StartTime=now", *changes]
    subprocess.run(update, env=env, check=True, timeout=30)


def _finished(env: dict[str, str], job: str, out: Path) -> dict[str, str]:
    """Wait for the job's end; if it did not complete, show what it printed (the job's output file)."""
    # A whole training job: 10 minutes, for a CI worker that shares its cores with the other's (loadgroup).
    state = _wait(env, job, lambda s: s.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), 600)
    if state["JobState"] != "COMPLETED":
        printed = out / f"slurm-{job}.out"
        # Without the C++ stack frames a failed rendezvous prints: in CI they filled the tail, hiding the cause.
        lines = printed.read_text().splitlines() if printed.is_file() else ["(no output file)"]
        shown = "\n".join(line for line in lines if not line.lstrip().startswith(("frame #", "<omitting")))
        pytest.fail(f"job {job}: {state['JobState']} ({state.get('Reason')}):\n{shown[-6000:]}")
    return state


@pytest.fixture(scope="session")
def uninterrupted(slurm: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("uninterrupted")
    job = _sbatch(slurm, out, *RUN)
    _finished(slurm, job, out)
    return out / "train" / "runs" / f"slurm-{job}"


def test_the_readme_shows_the_batch_script_the_tests_submit() -> None:
    assert SBATCH.read_text() in (ROOT / "docs" / "distributed.md").read_text()


def test_sbatch_and_srun_run_one_ddp_run_in_one_folder(slurm: dict[str, str], uninterrupted: Path) -> None:
    run = uninterrupted
    assert [p.name for p in run.parent.iterdir()] == [run.name]  # slurm-<job id>, nothing else
    assert {p.name for p in run.glob("*.log")} == {"train.log", "train_ddp_process_1.log"}
    assert "Starting with 2 processes" in (run / "train.log").read_text()
    assert [p.relative_to(run).as_posix() for p in run.rglob("config.yaml")] == [".hydra/config.yaml"]
    assert {p.parent.name for p in run.rglob("events.out.tfevents.*")} == {"tensorboard"}  # rank 0's alone
    assert _last(run)["global_step"] == 3 * STEPS


def _next_time_limit_check(env: dict[str, str]) -> float:
    """When slurmctld next checks time limits, and sends the --signal warnings due: every 30 s (its
    PERIODIC_TIMEOUT) from its start, logged at debug2 (the cluster's log level)."""
    log = (Path(env["SLURM_CONF"]).parent / "log" / "slurmctld.log").read_text()
    pattern = r"^\[([^\]]+)\] (?:debug2: Testing job time limits|slurmctld version)"  # its start: the first
    checked = datetime.fromisoformat(re.findall(pattern, log, re.MULTILINE)[-1]).timestamp()
    return checked + 30 * math.ceil((time.time() - checked) / 30)


@pytest.mark.parametrize("how", ["scontrol requeue", "time limit"])
def test_a_requeued_job_resumes_from_the_step_the_signal_came(how, slurm, uninterrupted, tmp_path) -> None:
    """Preempted (``scontrol requeue``: SIGTERM, mid-epoch 1) or warned of its time limit (``--time=1
    --signal=USR1@59``: SLURM sends the warning at its first time-limit check, here about 5 s after the start,
    while the tasks import or set up; they act on it at the first step the ranks agree on): the job saves,
    comes back under its job id, resumes from that step and ends with the uninterrupted run's weights."""
    if how == "time limit":

        def far_enough() -> float | None:  # a check too close is let pass: the one after it
            start = _next_time_limit_check(slurm) - 5
            return start if start >= time.time() + 1 else None

        start = processes.until(far_enough, 120, "a time-limit check far enough ahead", every=1)
        processes.until(lambda: time.time() >= start, 120, "5 s before SLURM's time-limit check", every=0.05)
        job = _sbatch(slurm, tmp_path, *RUN, options=("--time=1", "--signal=USR1@59"))
    else:
        job = _sbatch(slurm, tmp_path, *RUN)
    run = tmp_path / "train" / "runs" / f"slurm-{job}"
    if how == "scontrol requeue":
        _wait(slurm, job, lambda s: (run_folder.last_checkpoint(run)).is_file())  # epoch 0 done: training
        subprocess.run(["scontrol", "requeue", job], env=slurm, check=True, timeout=30)
    _start_requeued(slurm, job, "TimeLimit=10")  # no second warning
    _finished(slurm, job, tmp_path)

    log = (run / "train.log").read_text()
    signal = "SIGTERM" if how == "scontrol requeue" else "SIGUSR1"
    stop = re.search(rf"Stopped by {signal} at step (\d+) \(epoch \d\); saved {run}/checkpoints/last.ckpt", log)
    assert stop, log[-3000:]
    assert int(stop[1]) % STEPS, "saved where the signal came, not at an epoch end"
    if signal == "SIGUSR1":
        assert f"Requeuing SLURM job {job}: it resumes from there" in log
    assert f"Restored all states from the checkpoint at {run}/checkpoints/last.ckpt" in log
    assert [p.name for p in run.parent.iterdir()] == [run.name]  # the same folder, the same job id
    assert _last(run)["global_step"] == 3 * STEPS
    assert_same_weights(_last(uninterrupted), _last(run))


def test_two_nodes_of_one_task_each_train_as_one_run(slurm: dict[str, str], tmp_path: Path) -> None:
    """Two slurmd of this host stand for two machines: trainer.num_nodes=2 follows --nodes=2."""
    nodes = ("--nodes=2", "--ntasks-per-node=1")
    job = _sbatch(slurm, tmp_path, "trainer.accelerator=cpu", *DETERMINISTIC[:4], options=nodes)
    assert _finished(slurm, job, tmp_path)["NumNodes"] == "2"
    run = tmp_path / "train" / "runs" / f"slurm-{job}"
    log = (run / "train.log").read_text()
    assert "trainer.num_nodes=2 trainer.devices=1" in log and "Starting with 2 processes" in log
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in (run / "train_ddp_process_1.log").read_text()
    assert _last(run)["global_step"] == 3 * 30


def test_a_sweep_on_slurm_runs_each_job_as_ddp_ranks_survives_a_failed_one_and_prunes(slurm, tmp_path: Path) -> None:
    """hparams_search=mnist_optuna on hydra/launcher=slurm: 3 jobs x 2 tasks, one at a time; one diverges,
    a hopeless one (lr=1e-7) is pruned after its first epoch on both ranks. Each job folder: one config,
    rank 0's train.log, rank 1's own log; the study gets each job's real val/acc_best, the failure, the
    pruned trial."""
    command = [
        *(sys.executable, "train.py", "-m", *SUITE, "hydra/launcher=slurm", "hparams_search=mnist_optuna"),
        *("hydra.sweeper.params=null", "model.optimizer.lr=choice(1e-3,1e30,1e-7)", "hydra/sweeper/sampler=grid"),
        *("hydra.sweeper.sampler.seed=5", "hydra.sweeper.n_trials=3"),
        *("hydra.sweeper.pruner.n_startup_trials=1", "hydra.sweeper.pruner.n_warmup_steps=0"),
        *("hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=1", "strategy=ddp", "trainer.devices=2"),
        *("trainer.accelerator=cpu", "logger=none", *DETERMINISTIC[:4]),
        f"paths.log_dir={tmp_path}",
    ]
    result = processes.run(command, env=slurm, timeout=600)
    assert result.returncode == 1, result.stderr[-3000:]
    (sweep,) = (p for p in (tmp_path / "train" / "multiruns").iterdir() if p.is_dir())
    study = optuna.load_study(study_name="mnist_optuna", storage=f"sqlite:///{sweep.parent}/optuna.db")
    states = {t.params["model.optimizer.lr"]: t.state.name for t in study.trials}
    assert states == {1e-3: "COMPLETE", 1e30: "FAIL", 1e-7: "PRUNED"}
    jobs = {t.params["model.optimizer.lr"]: sweep / str(t.number) for t in study.trials}
    for job in jobs.values():
        assert [p.relative_to(job).as_posix() for p in job.rglob("config.yaml")] == [".hydra/config.yaml"]
        assert {p.name for p in job.glob("*.log")} == {"train.log", "train_ddp_process_1.log"}
        assert "GLOBAL_RANK: 1, MEMBER: 2/2" not in (job / "train.log").read_text()
    best = OmegaConf.load(sweep / "optimization_results.yaml").best_value
    assert best == json.loads((jobs[1e-3] / "metrics.json").read_text())["val/acc_best"]
    assert f"1 of 3 jobs of the sweep in {sweep} failed:" in result.stderr
    assert "non-finite" in (jobs[1e30] / "failure.txt").read_text()
    assert (jobs[1e-7] / "pruned.txt").read_text().startswith("pruned after epoch 0")
    assert torch.load(run_folder.last_checkpoint(jobs[1e-7]), weights_only=True)["epoch"] == 0  # both ranks stopped
    noise = ("Bypassing sacct error", "accounting storage is disabled")  # no sacct on this cluster: squeue
    assert not [
        line for line in result.stdout.splitlines() + result.stderr.splitlines() if any(n in line for n in noise)
    ]


def test_a_sweep_job_warned_by_submitit_resumes_from_the_step_the_signal_came(slurm, uninterrupted, tmp_path) -> None:
    """hydra/launcher=slurm: submitit's time-limit warning (SIGUSR2, sent here with scancel) saves the job at
    the next step and requeues it; it resumes there and ends with the uninterrupted run's weights."""
    command = [sys.executable, "train.py", "-m", *SUITE, "hydra/launcher=slurm", "hydra.launcher.cpus_per_task=1"]
    command += ["hydra.launcher.mem_gb=1", "strategy=ddp", "trainer.devices=2", *RUN, f"paths.log_dir={tmp_path}"]
    sweep = processes.start(command, env=slurm, output=subprocess.DEVNULL)
    job_folder = tmp_path / "train" / "multiruns"

    def training() -> list[Path]:  # epoch 0 done
        assert sweep.poll() is None
        return list(job_folder.glob(f"*/0/{run_folder.CHECKPOINTS}/last.ckpt"))

    processes.until(training, 240, "the sweep job's first epoch", every=0.1)
    queue = subprocess.run(["squeue", "-h", "-o", "%i"], env=slurm, capture_output=True, text=True, check=True)
    (job,) = queue.stdout.split()
    subprocess.run(["scancel", "--signal=USR2", job], env=slurm, check=True, timeout=30)
    _start_requeued(slurm, job)
    processes.finish(sweep)
    assert sweep.returncode == 0
    (run,) = job_folder.glob("*/0")
    log = (run / "train.log").read_text()
    assert re.search(rf"Stopped by SIGUSR2 at step \d+ \(epoch \d\); saved .*Requeuing SLURM job {job}:", log), log[
        -3000:
    ]
    assert f"Restored all states from the checkpoint at {run}/checkpoints/last.ckpt" in log
    assert_same_weights(_last(uninterrupted), _last(run))


def test_a_sweep_on_slurm_resumed_reruns_only_its_killed_job_from_its_checkpoint(slurm, tmp_path: Path) -> None:
    """hydra/launcher=slurm, 2 single-task jobs of 2 epochs of 10 steps; job 1 SIGKILLed at step 15, job 0
    finishes. resume=<sweep> (the launcher's settings given again: hydra.* values are not replayed)
    reruns job 1 alone, from its own last.ckpt, and ends with the whole table."""
    launcher = ["hydra/launcher=slurm", "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=1"]
    short = ["trainer.max_epochs=2", "trainer.limit_train_batches=10", "trainer.limit_val_batches=5", "test=false"]
    kill = ["+callbacks.kill._target_=faults.KillAt", "+callbacks.kill.step=15", "+callbacks.kill.job=1"]
    command = [sys.executable, "train.py", "-m", *SUITE, *launcher, "model.optimizer.lr=1e-3,2e-3", *short, *kill]
    first = processes.run([*command, "trainer.accelerator=cpu", "logger=none", f"paths.log_dir={tmp_path}"], env=slurm)
    assert first.returncode != 0
    (sweep,) = (p for p in (tmp_path / "train" / "multiruns").iterdir() if p.is_dir())
    assert [(sweep / job / "metrics.json").is_file() for job in "01"] == [True, False]
    finished = (run_folder.last_checkpoint(sweep / "0")).stat().st_mtime_ns
    again = [sys.executable, "train.py", *SUITE, f"resume={sweep}", *launcher[1:]]
    resumed = processes.run(again, env=slurm, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (run_folder.last_checkpoint(sweep / "0")).stat().st_mtime_ns == finished  # not run again
    rows = list(csv.DictReader((sweep / "summary.csv").open()))
    assert [(r["job"], r["status"]) for r in rows] == [("0", "ok"), ("1", "ok")]
    assert f"Resuming from {sweep / '1' / 'checkpoints' / 'last.ckpt'}" in (sweep / "1" / "train.log").read_text()
    assert _last(sweep / "1")["global_step"] == 20
