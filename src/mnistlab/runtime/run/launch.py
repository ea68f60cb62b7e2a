"""Who started this process, asked in one place: a plain run, Lightning's launcher, torchrun (a Kubeflow
TrainJob runs it), SLURM's srun, a Ray worker, or machines started by hand; with its rank, local rank,
node and world size, as the launcher's environment tells them before Lightning starts.

Every rank-zero decision made before Lightning has counted the ranks (saving the config, claiming or
discarding the folder, the console) and every per-rank file name reads :func:`current`; once Lightning's
strategy has counted them (``ddp_spawn``'s processes get no variables of their own), its
``rank_zero_only.rank`` is the answer too (:func:`is_rank_zero`).
"""

import os
import sys
from dataclasses import dataclass
from pathlib import Path

# The entry script, set by train.py and eval.py: a sweep job may run in a worker process of a Hydra
# launcher (joblib), whose own command line is not the script's.
ENTRY_POINT = "MNISTLAB_ENTRY_POINT"
# Names the run folder when set: the name all ranks agreed on (distributed/rendezvous.py), or a Kubernetes
# job's (deploy/kubernetes/), which its restarted pods keep: they resume from its last.ckpt.
RUN_ID = "MNISTLAB_RUN_ID"
# What launchers (torchrun, Lightning, by hand) tell a process about its place in the world.
DISTRIBUTED_VARIABLES = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class Launch:
    """This process's place in its job. ``rank`` is None where only the run's config can tell it: a
    rank of a machine beyond the first started by hand (its node x processes per node + local rank)."""

    launcher: str  # plain | lightning | torchrun | kubeflow | slurm | ray | rank variables (set by another)
    rank: int | None
    local_rank: int
    node: int
    world_size: int

    @property
    def is_rank_zero(self) -> bool:
        return self.rank == 0

    @property
    def by_torchrun(self) -> bool:
        """Started by torchrun's agent: by hand, or in a Kubeflow TrainJob's pod."""
        return self.launcher in ("torchrun", "kubeflow")


def current() -> Launch:
    """This process's launch, read from the environment its launcher gave it."""
    env = os.environ
    world = int(env.get("WORLD_SIZE", "1"))
    local = int(env.get("LOCAL_RANK", "0"))
    if "TORCHELASTIC_RUN_ID" in env and "RANK" in env:  # as torch.distributed.is_torchelastic_launched
        launcher = "kubeflow" if "PET_NNODES" in env else "torchrun"  # a TrainJob's pod passes PET_* to torchrun
        return Launch(launcher, int(env["RANK"]), local, _int("GROUP_RANK"), world)
    if (tasks := _slurm_tasks()) is not None:
        return Launch("slurm", _int("SLURM_PROCID"), _int("SLURM_LOCALID"), _int("SLURM_NODEID"), tasks)
    node = _int("NODE_RANK")
    if "RANK" in env:  # Ray Train's workers (ray.train.torch sets torchrun's variables); a PyTorchJob's pod
        return Launch("ray" if "ray.train" in sys.modules else "rank variables", int(env["RANK"]), local, node, world)
    if "WORLD_SIZE" in env or node:
        # Lightning's variables: a rank Lightning started, or a machine's first process started by hand.
        return Launch("lightning", local if node == 0 else None, local, node, world)
    return Launch("plain", local, local, 0, 1)  # a LOCAL_RANK left in the shell: rendezvous refuses it


def is_rank_zero() -> bool:
    """Global rank 0: by the launcher's environment, and by Lightning's count once its strategy made it."""
    if not current().is_rank_zero:
        return False
    lightning = sys.modules.get("lightning.fabric.utilities.rank_zero")
    return getattr(getattr(lightning, "rank_zero_only", None), "rank", 0) == 0


def started_by_torchrun(key: str, default: int) -> int:
    """``trainer.devices`` and ``trainer.num_nodes`` (the ``torchrun`` resolver of conf/trainer/): under
    torchrun, or a Kubeflow TrainJob that runs it, the processes it started per node and its nodes; else
    ``default``. So the numbers live in one place, the launcher's command (or the job's PET_* variables)."""
    per_node = os.environ.get("LOCAL_WORLD_SIZE")
    if not (per_node and (launch := current()).by_torchrun):
        return default
    return int(per_node) if key == "devices" else launch.world_size // int(per_node)


def run_id() -> str | None:
    """What identifies this launch across its restarts: the name its ranks agreed on under torchrun
    or srun, or its SLURM job (a requeued job keeps its id); None for a run started by hand."""
    if given := os.environ.get(RUN_ID):
        return given
    return f"slurm-{os.environ['SLURM_JOB_ID']}" if "SLURM_JOB_ID" in os.environ else None


def log_name(rank: int, stem: str | None = None, by_rank: bool = False) -> str:
    """The name (without ``.log``) of rank ``rank``'s log: the entry script's, and ``_ddp_process_<rank>``
    beyond rank 0 (``run_folder.RANK_LOG`` finds them); ``by_rank``: rank 0's too, for ranks whose job
    logs beside them under the plain name (a sweep job run again in processes of its own)."""
    stem = stem or Path(os.environ.get(ENTRY_POINT, sys.argv[0])).stem
    return stem if rank == 0 and not by_rank else f"{stem}_ddp_process_{rank}"


def _slurm_tasks() -> int | None:
    """The tasks of this SLURM job; None outside SLURM and in an interactive allocation, where the user
    starts the processes (as Lightning's SLURMEnvironment.detect reads it)."""
    if "SLURM_NTASKS" not in os.environ or os.environ.get("SLURM_JOB_NAME") in ("bash", "interactive"):
        return None
    return int(os.environ["SLURM_NTASKS"])


def _int(name: str) -> int:
    return int(os.environ.get(name, "0"))
