"""How the processes of a job meet: under an external launcher (torchrun, srun), and in Hydra sweeps.

torchrun and srun start every rank themselves, and each rank composes the config on its own: left
alone, each would name its own run folder after its own clock and save its own copy of the config.
So before Hydra starts, the ranks agree on one folder name (through torchrun's store, or from the
SLURM job id), and only rank 0 saves the config; the others log to <script>_ddp_process_<global rank>.log,
however they were started.

Lightning's DDP launcher starts a job's extra ranks by re-running the command line. In a Hydra sweep
that command line is the whole sweep (``-m ...``): each re-launched rank would run every job of it,
in a second sweep folder, and an adaptive sweeper could pair ranks with different hyperparameters.
So a sweep job that needs several processes re-runs itself as a plain single run in a fresh process,
with exactly its own overrides and its own folder. Lightning then starts that run's ranks, and their
process group lives and dies with the job, whatever sweeper or Hydra launcher made it.
"""

import json
import os
import secrets
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from mnistlab.runtime.config import hydra_versions
from mnistlab.runtime.run import internals, launch, run_folder
from mnistlab.runtime.run.failures import InputError, RunStopped, continue_line
from mnistlab.runtime.run.launch import DISTRIBUTED_VARIABLES, ENTRY_POINT, RUN_ID


def check_environment(cfg: DictConfig | None = None) -> None:
    """Refuse a LOCAL_RANK left over in the shell (every launcher that sets it sets WORLD_SIZE too), and a
    RANK no launcher of ranks set (a PyTorchJob's pod running plain python). Under torchrun, refuse a
    trainer whose devices x num_nodes is not the world torchrun started: each process would train a copy
    of the run of its own, into one folder."""
    started = launch.current()
    if started.launcher == "rank variables" and "LOCAL_RANK" not in os.environ:
        # A Kubeflow PyTorchJob's pod: one process per pod in the operator's view, which Lightning no longer reads.
        raise InputError(
            f"RANK={os.environ['RANK']} is set (as a Kubeflow PyTorchJob sets it in each pod), but no launcher "
            "that starts ranks (torchrun, srun, Lightning) started this process: run train.py under torchrun, as "
            "deploy/kubernetes/pytorchjob.yaml does, or `unset RANK` outside a job"
        )
    if started.launcher == "plain" and "LOCAL_RANK" in os.environ:
        raise InputError(
            f"LOCAL_RANK={os.environ['LOCAL_RANK']} is set, but no launcher started this process (WORLD_SIZE is "
            "not set): it would wait for processes that never come. Run `unset LOCAL_RANK` and start again"
        )
    if cfg is None or not started.by_torchrun:
        return
    devices, nodes = cfg.trainer.get("devices"), cfg.trainer.get("num_nodes", 1)
    if isinstance(devices, int) and isinstance(nodes, int) and devices * nodes != started.world_size:
        raise InputError(
            f"torchrun started {started.world_size} processes (WORLD_SIZE), but trainer.devices x trainer.num_nodes "
            f"is {devices} x {nodes}: leave both out (they follow torchrun's --nproc_per_node and --nnodes) or make "
            "them agree"
        )


def rendezvous_failure(err: Exception) -> InputError:
    """Explain a timed-out rendezvous: usually variables of another run left in the environment."""
    present = " ".join(f"{name}={os.environ[name]}" for name in DISTRIBUTED_VARIABLES if name in os.environ)
    return InputError(
        f"the processes of this run did not all meet within trainer.strategy.timeout ({err}). This process "
        f"took its place from the environment: {present or 'nothing set'}. If no launcher (torchrun, srun) "
        f"started it, run `unset {' '.join(DISTRIBUTED_VARIABLES)}` and start again; if one did, see whether "
        "another rank failed before it"
    )


def lost_peer(err: RuntimeError, trainer: Any) -> Exception:
    """A collective that timed out or lost its connection, as one line that names the ranks that stopped
    answering and how to resume; any other error as it was.

    Gloo and NCCL say only that a collective timed out, not for whom. So every surviving rank answers
    a roll call in the rendezvous store (hosted by rank 0) and, ``ROLL_CALL_S`` later, names the
    ranks that did not.
    """
    if not any(
        sign in str(err) for sign in ("Timed out", "timed out", "Connection closed by peer", "Connection reset")
    ):
        return err
    missing = _roll_call(trainer.global_rank, trainer.world_size)
    who = (
        f"rank {', '.join(map(str, missing))} stopped answering"
        if missing
        else "rank 0, which holds the rendezvous store, stopped answering"
        if missing is None
        else "a rank stopped answering and came back"
    )
    timeout = internals.ddp_timeout(trainer.strategy)
    waited = f"{timeout.total_seconds():g} s (trainer.strategy.timeout.seconds)" if timeout else "its timeout"
    return RunStopped(
        f"Stopped at step {trainer.global_step}: {who}; rank {trainer.global_rank} waited {waited} for it. "
        + continue_line(trainer.default_root_dir, "once its machine is well"),
        exit_code=1,
        then=lambda: _end_started_ranks(trainer.strategy.launcher),
    )


def _end_started_ranks(launcher: Any) -> None:
    """The ranks this process started (Lightning's DDP launcher): the surviving ones end by themselves,
    the one that stopped answering cannot, and would outlive the run. torchrun and srun end their own."""
    started = internals.started_ranks(launcher)
    internals.stop_watching_started_ranks()  # else it would SIGKILL this process before its line
    deadline = time.monotonic() + 2 * ROLL_CALL_S
    for process in started:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()  # SIGKILL: a stopped (SIGSTOP) process too


ROLL_CALL_S = 5.0  # how long the surviving ranks wait for each other's answer


def _roll_call(rank: int, world_size: int) -> list[int] | None:
    """The ranks that do not answer within ROLL_CALL_S; None when the store itself does not answer."""
    if "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ:
        return None
    key = f"mnistlab/roll_call/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    try:
        store = _store(timedelta(seconds=ROLL_CALL_S))
        store.set(f"{key}{rank}", "here")
        time.sleep(ROLL_CALL_S)
        return [other for other in range(world_size) if not store.check([f"{key}{other}"])]
    except (RuntimeError, ValueError):  # DistStoreError, DistNetworkError: the store's host is gone too
        return None


def join_external_launch(config_name: str) -> list[str]:
    """Under torchrun, srun or a launch by hand: one run folder; return the overrides this rank needs."""
    started = launch.current()
    rank = started.rank
    if started.by_torchrun:
        if RUN_ID not in os.environ:  # else named by the job (deploy/kubernetes/): the same after a restart
            os.environ[RUN_ID] = _run_id_from_torchrun_store(started.is_rank_zero)
    elif started.launcher == "slurm" and started.world_size > 1:
        # The job id survives a requeue: a preempted job resumes in its own folder, from the
        # checkpoint Lightning saves there when SLURM signals it (sbatch --signal=SIGUSR1@90) or
        # from its last.ckpt.
        os.environ[RUN_ID] = f"slurm-{os.environ['SLURM_JOB_ID']}"
    elif started.launcher == "lightning" and rank is None:
        # A machine beyond the first started by hand: Lightning numbers its ranks node x processes per
        # machine + local rank, and names their logs by local rank, which machines repeat.
        rank = started.node * _processes_per_node(config_name) + started.local_rank
    elif started.launcher != "lightning":
        return []  # a plain run, which need not wait for Lightning's import to fail fast
    if not rank:  # rank 0 (None only for a rank above, which a machine by hand has numbered)
        return []
    return ["hydra.output_subdir=null", f"hydra.job.name={launch.log_name(rank)}"]


def _processes_per_node(config_name: str) -> int:
    """trainer.devices of this command line's config, counted by Lightning's rules ("auto", lists)."""
    from hydra import compose, initialize_config_dir
    from lightning.pytorch.accelerators import CPUAccelerator, CUDAAccelerator

    conf = Path(os.environ.get(ENTRY_POINT, sys.argv[0])).resolve().parent / "conf"
    # Hydra's settings are for main (Lightning's own among them), but where configs are found counts here too.
    overrides = [arg for arg in sys.argv[1:] if not arg.startswith("hydra.") or arg.startswith("hydra.searchpath=")]
    with initialize_config_dir(config_dir=str(conf), **hydra_versions.BASE):
        trainer = compose(config_name, overrides=overrides).trainer
    on_cpu = trainer.accelerator == "cpu" or not CUDAAccelerator.is_available()
    accelerator = CPUAccelerator if on_cpu else CUDAAccelerator
    devices = accelerator.auto_device_count() if trainer.devices == "auto" else trainer.devices
    return len(accelerator.get_parallel_devices(accelerator.parse_devices(devices)))  # type: ignore[arg-type]


def _run_id_from_torchrun_store(first: bool) -> str:
    store = _store(timedelta(minutes=10))
    if first:  # the agent's store outlives restarts of the workers: they keep the run's folder
        # Named before Hydra composes the config, so not claimed by mkdir (run_folder.py): a random
        # suffix keeps two torchrun jobs of one second apart.
        name = f"{time.strftime('%Y-%m-%d_%H-%M-%S')}_{secrets.token_hex(3)}"
        store.compare_set("mnistlab/run_id", "", name)
    return store.get("mnistlab/run_id").decode()


def is_distributed_sweep_job(cfg: DictConfig) -> bool:
    """True for a job of a Hydra multirun (by Hydra's run mode) that runs on several processes."""
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return False
    if (started := launch.current()).by_torchrun or started.launcher == "slurm":
        return False  # a launcher outside Hydra started this job's ranks (hydra/launcher=slurm)
    return str(cfg.trainer.devices) != "1" or int(cfg.trainer.num_nodes) != 1


def run_job_in_fresh_processes() -> dict[str, float]:
    """Run this sweep job as a single run of the same entry point; return the metrics its rank 0 saved."""
    hydra = HydraConfig.get()
    out = Path(hydra.runtime.output_dir)
    command = [
        sys.executable,
        os.environ.get(ENTRY_POINT, os.path.abspath(sys.argv[0])),
        *hydra.overrides.task,  # this job's values, including the ones the sweeper chose
        # Read by the job too: the sweeper's settings, and where configs are found (a job's data=<option> may
        # come from a folder hydra.searchpath added).
        *(o for o in hydra.overrides.hydra if o.startswith(("hydra.sweeper.", "hydra/sweeper", "hydra.searchpath"))),
        f'hydra.run.dir="{out}"',  # the job's folder, already holding its saved config
        "hydra.output_subdir=null",
        f"hydra.job.name={launch.log_name(0, hydra.job.name, by_rank=True)}",  # <job>_ddp_process_<N>.log
    ]
    finished = subprocess.run(command, check=False)
    if finished.returncode:
        raise RuntimeError(f"sweep job {hydra.job.num} failed (exit code {finished.returncode}); see the logs in {out}")
    return json.loads((out / run_folder.METRICS_FILE).read_text())


def isolate_restarted_workers(strategy: Any) -> None:
    """Under torchrun --max-restarts, give a restarted round of workers a process group of its own.

    torchrun's agent keeps one store for every round of workers, and torch (2.14) builds each
    round's process group under the same keys in it: a rank of the new round can read the address
    a dead rank of the old round left there, and fails to connect (gloo: "connectFullMesh failed:
    Connection refused") or waits forever. Created here under a prefix naming the round, before
    Lightning creates one (it keeps a process group that exists), the keys cannot meet.
    """
    import torch.distributed as dist

    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if restart == "0" or dist.is_initialized() or not hasattr(strategy, "process_group_backend"):
        return
    backend = strategy.process_group_backend or ("nccl" if strategy.root_device.type == "cuda" else "gloo")
    started = launch.current()
    assert started.rank is not None  # torchrun gives every worker its RANK
    dist.init_process_group(
        backend,
        store=dist.PrefixStore(f"mnistlab/round_{restart}", _store(timedelta(minutes=5))),
        rank=started.rank,
        world_size=started.world_size,
        timeout=internals.ddp_timeout(strategy),  # strategy.timeout in conf/strategy/
    )


def _store(timeout: timedelta) -> Any:
    """A client of the job's rendezvous store (torchrun's agent, or rank 0's under Lightning): where the
    ranks agree on a folder, answer a roll call, and keep a restarted round's process group apart."""
    import torch.distributed as dist

    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout)
