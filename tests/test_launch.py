"""Who started this process, as every launcher gives it (runtime/run/launch.py): the one answer that the
folder lock, the run folder's claim, the console, per-rank logs and the SLURM requeue read."""

import os

import pytest

from mnistlab.runtime.run import launch
from mnistlab.runtime.run.failures import InputError
from mnistlab.runtime.run.launch import Launch

from composing import compose_config

# Each launcher's variables, as it sets them in the process it starts (a second node's second process
# where there are nodes), and what this process is then.
STARTED = {
    "plain": ({}, Launch("plain", 0, 0, 0, 1), "train"),
    "Lightning's launcher": (
        {"LOCAL_RANK": "1", "NODE_RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"},
        Launch("lightning", 1, 1, 0, 2),
        "train_ddp_process_1",
    ),
    "a second machine started by hand": (
        {"NODE_RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "4"},
        Launch("lightning", None, 1, 1, 4),  # its global rank needs trainer.devices (rendezvous)
        None,
    ),
    "torchrun": (
        {
            "TORCHELASTIC_RUN_ID": "job",
            "RANK": "3",
            "LOCAL_RANK": "1",
            "GROUP_RANK": "1",
            "WORLD_SIZE": "4",
            "LOCAL_WORLD_SIZE": "2",
        },
        Launch("torchrun", 3, 1, 1, 4),
        "train_ddp_process_3",
    ),
    "a Kubeflow TrainJob's torchrun": (
        {"TORCHELASTIC_RUN_ID": "job", "RANK": "2", "LOCAL_RANK": "0", "GROUP_RANK": "1", "WORLD_SIZE": "4"}
        | {"LOCAL_WORLD_SIZE": "2", "PET_NNODES": "2"},
        Launch("kubeflow", 2, 0, 1, 4),
        "train_ddp_process_2",
    ),
    "srun": (
        {"SLURM_NTASKS": "4", "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1"}
        | {"SLURM_JOB_NAME": "train", "SLURM_JOB_ID": "7"},
        Launch("slurm", 3, 1, 1, 4),
        "train_ddp_process_3",
    ),
    "an interactive SLURM allocation (the user starts the processes)": (
        {"SLURM_NTASKS": "4", "SLURM_PROCID": "0", "SLURM_JOB_NAME": "interactive"},
        Launch("plain", 0, 0, 0, 1),
        "train",
    ),
    "a PyTorchJob's pod running plain python": (
        {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "master", "MASTER_PORT": "1"},
        Launch("rank variables", 1, 0, 0, 2),
        "train_ddp_process_1",
    ),
}


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch):
    """Sets exactly the given variables of every launcher's: none left from the shell running the suite."""

    def use(variables: dict[str, str]) -> None:
        for name in [*launch.DISTRIBUTED_VARIABLES, "GROUP_RANK", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID"]:
            monkeypatch.delenv(name, raising=False)
        for name in [n for n in os.environ if n.startswith(("SLURM_", "PET_"))]:
            monkeypatch.delenv(name)
        for name, value in variables.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv(launch.ENTRY_POINT, "/project/train.py")

    return use


@pytest.mark.parametrize("how", sorted(STARTED))
def test_each_launcher_is_read_as_one_launch(how: str, environment) -> None:
    variables, expected, log = STARTED[how]
    environment(variables)
    started = launch.current()
    assert started == expected
    assert started.is_rank_zero == (expected.rank == 0) == launch.is_rank_zero()
    if started.rank is not None:
        assert launch.log_name(started.rank) == log
    assert launch.log_name(0, "train_job", by_rank=True) == "train_job_ddp_process_0"  # a sweep job's own run


def test_torchruns_counts_fill_the_trainer_and_nothing_else_does(environment) -> None:
    environment(STARTED["torchrun"][0])
    assert (launch.started_by_torchrun("devices", 1), launch.started_by_torchrun("num_nodes", 1)) == (2, 2)
    environment(STARTED["srun"][0])
    assert (launch.started_by_torchrun("devices", 1), launch.started_by_torchrun("num_nodes", 3)) == (1, 3)


def test_lightnings_count_of_the_ranks_overrules_a_process_without_variables(environment, monkeypatch) -> None:
    """``ddp_spawn``'s processes get no variables of their own: Lightning's strategy counts them."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    environment({})
    monkeypatch.setattr(rank_zero_only, "rank", 1, raising=False)
    assert launch.current().is_rank_zero and not launch.is_rank_zero()


# The refusals that depend on who started the process, as train() meets them: the environment each launcher
# gives (above), set in this process, before anything of the run is written. (Printed as one line by the
# entry point, as every InputError is: test_schema.py.)
REFUSED = {
    "torchrun's count of processes against the trainer's": (
        STARTED["torchrun"][0],
        ["trainer.devices=1"],  # its nodes follow torchrun's (2)
        (
            "torchrun started 4 processes (WORLD_SIZE), but trainer.devices x trainer.num_nodes is 1 x 2: leave "
            "both out (they follow torchrun's --nproc_per_node and --nnodes) or make them agree"
        ),
    ),
    "a LOCAL_RANK left in the shell": (
        {"LOCAL_RANK": "1"},
        ["strategy=ddp", "trainer.devices=2"],
        (
            "LOCAL_RANK=1 is set, but no launcher started this process (WORLD_SIZE is not set): it would wait "
            "for processes that never come. Run `unset LOCAL_RANK` and start again"
        ),
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_launch_the_config_cannot_run_is_refused_before_anything_is_written(case, environment, tmp_path) -> None:
    from mnistlab.tasks import train

    variables, overrides, message = REFUSED[case]
    environment(variables)
    cfg = compose_config("train", tmp_path / "run", overrides)
    with pytest.raises(InputError) as refused:
        train(cfg)
    assert str(refused.value) == message
    assert not (tmp_path / "run").exists()
