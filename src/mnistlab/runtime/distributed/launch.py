"""How the processes of a job start: under an external launcher (torchrun, srun), and in Hydra sweeps.

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
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from mnistlab.runtime.checkpointing import run_folder
from mnistlab.runtime.checkpointing.run_folder import RUN_ID
from mnistlab.runtime.config import hydra_versions
from mnistlab.runtime.config.checks import InputError

# The entry script, set by train.py and eval.py: a sweep job may run in a worker process of a Hydra
# launcher (joblib), whose own command line is not the script's.
ENTRY_POINT = "MNISTLAB_ENTRY_POINT"
# What launchers (torchrun, Lightning, by hand) tell a process about its place in the world.
DISTRIBUTED_VARIABLES = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")


def started_by_torchrun(key: str, default: int) -> int:
    """``trainer.devices`` and ``trainer.num_nodes`` (the ``torchrun`` resolver of conf/trainer/): under
    torchrun, or a Kubeflow TrainJob that runs it, the processes it started per node and its nodes; else
    ``default``. So the numbers live in one place, the launcher's command (or the job's PET_* variables)."""
    world, local = os.environ.get("WORLD_SIZE"), os.environ.get("LOCAL_WORLD_SIZE")
    if "TORCHELASTIC_RUN_ID" not in os.environ or not (world and local):
        return default
    return int(local) if key == "devices" else int(world) // int(local)


def check_environment(cfg: DictConfig | None = None) -> None:
    """Refuse a LOCAL_RANK left over in the shell (every launcher that sets it sets WORLD_SIZE too), and a
    RANK no launcher of ranks set (a PyTorchJob's pod running plain python). Under torchrun, refuse a
    trainer whose devices x num_nodes is not the world torchrun started: each process would train a copy
    of the run of its own, into one folder."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    if "RANK" in os.environ and "LOCAL_RANK" not in os.environ and not SLURMEnvironment.detect():
        # A Kubeflow PyTorchJob's pod: one process per pod in the operator's view, which Lightning no longer reads.
        raise InputError(
            f"RANK={os.environ['RANK']} is set (as a Kubeflow PyTorchJob sets it in each pod), but no launcher "
            "that starts ranks (torchrun, srun, Lightning) started this process: run train.py under torchrun, as "
            "deploy/kubernetes/pytorchjob.yaml does, or `unset RANK` outside a job"
        )
    if "LOCAL_RANK" in os.environ and "WORLD_SIZE" not in os.environ and not SLURMEnvironment.detect():
        raise InputError(
            f"LOCAL_RANK={os.environ['LOCAL_RANK']} is set, but no launcher started this process (WORLD_SIZE is "
            "not set): it would wait for processes that never come. Run `unset LOCAL_RANK` and start again"
        )
    world = os.environ.get("WORLD_SIZE")
    if cfg is None or "TORCHELASTIC_RUN_ID" not in os.environ or not world:
        return
    devices, nodes = cfg.trainer.get("devices"), cfg.trainer.get("num_nodes", 1)
    if isinstance(devices, int) and isinstance(nodes, int) and devices * nodes != int(world):
        raise InputError(
            f"torchrun started {world} processes (WORLD_SIZE), but trainer.devices x trainer.num_nodes is "
            f"{devices} x {nodes}: leave both out (they follow torchrun's --nproc_per_node and --nnodes) or make "
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
    from mnistlab.runtime.reporting.failures import RunStopped

    missing = _roll_call(trainer.global_rank, trainer.world_size)
    who = (
        f"rank {', '.join(map(str, missing))} stopped answering"
        if missing
        else "rank 0, which holds the rendezvous store, stopped answering"
        if missing is None
        else "a rank stopped answering and came back"
    )
    timeout = getattr(trainer.strategy, "_timeout", None)
    waited = f"{timeout.total_seconds():g} s (trainer.strategy.timeout.seconds)" if timeout else "its timeout"
    return RunStopped(
        f"Stopped at step {trainer.global_step}: {who}; rank {trainer.global_rank} waited {waited} for it. "
        f"Continue with: python train.py resume={trainer.default_root_dir} (once its machine is well)",
        exit_code=1,
        then=lambda: _end_started_ranks(trainer.strategy.launcher),
    )


def _end_started_ranks(launcher: Any) -> None:
    """The ranks this process started (Lightning's DDP launcher): the surviving ones end by themselves,
    the one that stopped answering cannot, and would outlive the run. torchrun and srun end their own."""
    started = getattr(launcher, "procs", [])  # Lightning's _SubprocessScriptLauncher: its Popen objects
    for thread in threading.enumerate():
        # Lightning's (2.6) watcher of those ranks SIGKILLs this process too as soon as one of them exits
        # with an error, so the run would end by SIGKILL (-9) rather than with its own line and exit code.
        if thread.name == "child-process-observer":
            thread._child_processes = []  # type: ignore[attr-defined]  # Lightning's _ChildProcessObserver
    deadline = time.monotonic() + 2 * ROLL_CALL_S
    for process in started:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()  # SIGKILL: a stopped (SIGSTOP) process too


ROLL_CALL_S = 5.0  # how long the surviving ranks wait for each other's answer


def _roll_call(rank: int, world_size: int) -> list[int] | None:
    """The ranks that do not answer within ROLL_CALL_S; None when the store itself does not answer."""
    import torch.distributed as dist

    if "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ:
        return None
    key = f"mnistlab/roll_call/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    try:
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=timedelta(seconds=ROLL_CALL_S),
        )
        store.set(f"{key}{rank}", "here")
        time.sleep(ROLL_CALL_S)
        return [other for other in range(world_size) if not store.check([f"{key}{other}"])]
    except (RuntimeError, ValueError):  # DistStoreError, DistNetworkError: the store's host is gone too
        return None


def join_external_launch(config_name: str) -> list[str]:
    """Under torchrun, srun or a launch by hand: one run folder; return the overrides this rank needs."""
    if not {"RANK", "SLURM_NTASKS", "NODE_RANK", "LOCAL_RANK"} & os.environ.keys():
        return []  # launched by no one: a plain run, which need not wait for Lightning's import to fail fast
    from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    if TorchElasticEnvironment.detect():
        rank = int(os.environ["RANK"])
        if RUN_ID not in os.environ:  # else named by the job (deploy/kubernetes/): the same after a restart
            os.environ[RUN_ID] = _run_id_from_torchrun_store(rank)
    elif SLURMEnvironment.detect() and int(os.environ["SLURM_NTASKS"]) > 1:
        rank = int(os.environ["SLURM_PROCID"])
        # The job id survives a requeue: a preempted job resumes in its own folder, from the
        # checkpoint Lightning saves there when SLURM signals it (sbatch --signal=SIGUSR1@90) or
        # from its last.ckpt.
        os.environ[RUN_ID] = f"slurm-{os.environ['SLURM_JOB_ID']}"
    elif os.environ.get("NODE_RANK", "0") != "0" or "WORLD_SIZE" in os.environ:
        # Lightning's variables: a machine's first process started by hand (the user names the
        # folder, hydra.run.dir), or a rank Lightning started. Lightning names its ranks' logs by
        # local rank, which machines repeat: renamed here by global rank.
        rank = _global_rank_by_hand(config_name)
    else:
        return []
    if rank == 0:
        return []
    return ["hydra.output_subdir=null", f"hydra.job.name={Path(sys.argv[0]).stem}_ddp_process_{rank}"]


def _global_rank_by_hand(config_name: str) -> int:
    """NODE_RANK x processes per machine + LOCAL_RANK, as Lightning numbers its ranks."""
    node, local = int(os.environ.get("NODE_RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    return local if node == 0 else node * _processes_per_node(config_name) + local


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


def _run_id_from_torchrun_store(rank: int, timeout: timedelta = timedelta(minutes=10)) -> str:
    import torch.distributed as dist

    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout)
    if rank == 0:  # the agent's store outlives restarts of the workers: they keep the run's folder
        # Named before Hydra composes the config, so not claimed by mkdir (run_folder.py): a random
        # suffix keeps two torchrun jobs of one second apart.
        name = f"{time.strftime('%Y-%m-%d_%H-%M-%S')}_{secrets.token_hex(3)}"
        store.compare_set("mnistlab/run_id", "", name)
    return store.get("mnistlab/run_id").decode()


def run_id() -> str | None:
    """What identifies this launch across its restarts: the name its ranks agreed on under torchrun
    or srun, or its SLURM job (a requeued job keeps its id); None for a run started by hand."""
    if given := os.environ.get(RUN_ID):
        return given
    return f"slurm-{os.environ['SLURM_JOB_ID']}" if "SLURM_JOB_ID" in os.environ else None


def is_distributed_sweep_job(cfg: DictConfig) -> bool:
    """True for a job of a Hydra multirun (by Hydra's run mode) that runs on several processes."""
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return False
    from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    if SLURMEnvironment.detect() or TorchElasticEnvironment.detect():
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
        f"hydra.job.name={hydra.job.name}_ddp_process_0",  # its ranks log to <job>_ddp_process_<N>.log
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
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    dist.init_process_group(
        backend,
        store=dist.PrefixStore(f"mnistlab/round_{restart}", store),
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout=getattr(strategy, "_timeout", None),  # strategy.timeout in conf/strategy/
    )


hydra_versions.register_resolver("torchrun", started_by_torchrun)
