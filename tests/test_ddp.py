"""Multi-process DDP on CPU (gloo), started as users start it: Lightning re-runs the script per rank."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mnistlab.runtime.config import hydra_versions
from mnistlab.runtime.run import run_folder
from mnistlab.tasks import evaluate

import processes
from composing import EQUIVALENCE, ROOT, SHORT, SUITE, SUITE_DATA, compose_config
from running import FOUR_RANK_LOGS, assert_one_run, assert_trained_as_one_process, free_port, one_run, run_script

pytestmark = pytest.mark.slow


CPU_DDP = ["strategy=ddp", "trainer.devices=2", "trainer.accelerator=cpu"]  # 2 CPU processes, even beside GPUs
# Two "machines" of 2 processes on this one (the suite's data reads no files: nothing for the nodes to share).
FOUR_BY_HAND = ["strategy=ddp", "trainer.devices=2", "trainer.num_nodes=2"]


def test_four_ranks_on_cpu_train_as_one_process_and_writeone_run(one_process: Path, tmp_path: Path) -> None:
    """The README's headline, ``python train.py trainer.devices=4 strategy=ddp``, on CPU (gloo)."""
    result = run_script("train.py", *EQUIVALENCE, "strategy=ddp", "trainer.devices=4", f"paths.log_dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    run = one_run(tmp_path, FOUR_RANK_LOGS)
    assert run_folder.last_checkpoint(run).is_file() and len(list(run.rglob(run_folder.CHECKPOINTS))) == 1
    assert "Starting with 4 processes" in result.stdout
    # The console is rank 0's: the other ranks log the same final line to their own files only.
    assert result.stdout.count("Tested ") == 1
    assert all("Tested " in (run / log).read_text() for log in FOUR_RANK_LOGS)
    assert "[rank: 1]" not in result.stdout + result.stderr
    metrics = json.loads((run / "metrics.json").read_text())
    # Each sample once, on 4 ranks: the test's 2 global batches, the whole validation set.
    assert metrics["test/samples"] == 2 * SUITE_DATA["batch_size"] and metrics["val/samples"] == SUITE_DATA["val_size"]
    assert_trained_as_one_process(run, one_process)


def test_two_ranks_evaluate_every_test_image_exactly_once_with_any_batch(one_process, tmp_path: Path) -> None:
    checkpoint = run_folder.last_checkpoint(one_process)
    # An odd batch (99) on 2 ranks, over a test set it does not divide: each batch and the last, partial one
    # split unevenly, so padding is all over the evaluation. One process, in this one (the reference); two,
    # as a user starts them.
    single = evaluate(compose_config("eval", tmp_path / "one", [f"ckpt_path={checkpoint}", "data.batch_size=64"]))
    two_ranks = ["strategy=ddp", "trainer.devices=2", f"hydra.run.dir={tmp_path / 'two'}"]
    result = run_script("eval.py", f"ckpt_path={checkpoint}", "data.batch_size=99", *two_ranks)
    assert result.returncode == 0, result.stderr[-3000:]
    two = json.loads((tmp_path / "two" / "metrics.json").read_text())
    assert single["test/samples"] == two["test/samples"] == SUITE_DATA["test_size"]
    assert two["test/acc"] == single["test/acc"]
    assert two["test/loss"] == pytest.approx(single["test/loss"], rel=1e-6)
    assert {p.name for p in (tmp_path / "two").glob("*.log")} == {"eval.log", "eval_ddp_process_1.log"}


def test_a_dataloader_that_repeats_samples_under_ddp_is_named_once_with_the_fix(tmp_path: Path) -> None:
    """Plain DataLoaders (the suite's LoaderPatterns): 255 test samples on 2 ranks, one repeated. The run
    says so once per split, and the count shows it; the in-memory loaders above count each sample once."""
    loaders = ["data=suite_loaders", "data.test_size=255", "data.val_size=255", *CPU_DDP]
    result = run_script("train.py", *loaders, *SHORT[:2], "logger=none", f"hydra.run.dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    log = (tmp_path / "train.log").read_text()
    for split in ("validation", "test"):
        warning = f"The {split} set's 255 samples do not divide among 2 ranks: Lightning's DistributedSampler repeats 1"
        assert log.count(warning) == 1, split
    assert "python eval.py ckpt_path=<checkpoint> trainer.devices=1" in log
    assert json.loads((tmp_path / "metrics.json").read_text())["test/samples"] == 256  # one counted twice


def _torchrun(*args: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "torch.distributed.run", *args]  # the seed's launcher style: torchrun
    return processes.start(command)


def test_torchrun_ranks_without_the_counts_train_as_one_process_in_one_run(one_process: Path, tmp_path) -> None:
    """trainer.devices and trainer.num_nodes follow torchrun: its processes train one run together, not
    copies of it side by side (two prove it: each alone would be a run of one device, the default on a CPU;
    four ranks: the README's headline above, and tests/test_kubernetes.py's pods, which run torchrun on two
    machines in network namespaces of their own)."""
    run = _torchrun("--standalone", "--nproc_per_node=2", "train.py", *SUITE, *EQUIVALENCE, f"paths.log_dir={tmp_path}")
    output = processes.finish(run)
    assert run.returncode == 0, output[-3000:]
    assert "Starting with 2 processes" in output
    assert output.count("Tested ") == 1  # rank 0's console: one test of one run
    assert_trained_as_one_process(one_run(tmp_path), one_process)


def test_two_machines_of_two_processes_started_by_hand(one_process: Path, tmp_path: Path) -> None:
    """The README's recipe with Lightning's variables: each machine's first process starts its second."""
    port = free_port()
    nodes = [
        processes.start(
            processes.python("train.py", *EQUIVALENCE, *FOUR_BY_HAND, f"hydra.run.dir={tmp_path}"),
            env=os.environ | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "NODE_RANK": str(node)},
        )
        for node in (0, 1)
    ]
    outputs = [processes.finish(node) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs[0][-2000:] + outputs[1][-2000:]
    assert_one_run(tmp_path, FOUR_RANK_LOGS)  # global ranks 1 and 3 no longer share local rank 1's file
    assert_trained_as_one_process(tmp_path, one_process)


def _fake_srun_task(rank: int, tasks: int, job_id: str, *overrides: str) -> subprocess.Popen[str]:
    """A process as srun starts it: SLURM's variables say which task of which job it is."""
    slurm = {
        "SLURM_JOB_ID": job_id,
        "SLURM_JOB_NAME": "train",
        "SLURM_NTASKS": str(tasks),
        "SLURM_NTASKS_PER_NODE": str(tasks),
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(rank),
        "SLURM_NODEID": "0",
        "SLURM_NODELIST": "127.0.0.1",
        "SLURM_JOB_NUM_NODES": "1",
    }
    return processes.start(processes.python("train.py", *overrides), env=os.environ | slurm)


def test_srun_tasks_are_recognised_and_share_the_job_folder(tmp_path: Path) -> None:
    job_id = str(40_000 + os.getpid() % 1_000)  # Lightning derives the rendezvous port from it
    tasks = [_fake_srun_task(r, 2, job_id, *CPU_DDP, *SHORT, f"paths.log_dir={tmp_path}") for r in (0, 1)]
    outputs = [processes.finish(task) for task in tasks]
    assert [task.returncode for task in tasks] == [0, 0], outputs[0][-2000:] + outputs[1][-2000:]
    run = one_run(tmp_path)
    assert run.name == f"slurm-{job_id}"  # stable across requeues of the job
    assert "Starting with 2 processes" in outputs[0]


def test_slurm_launcher_submits_one_task_per_rank(tmp_path: Path) -> None:
    from hydra import compose, initialize_config_dir
    from submitit.slurm.slurm import _make_sbatch_string

    with initialize_config_dir(config_dir=str(ROOT / "conf"), **hydra_versions.BASE):
        overrides = ["hydra/launcher=slurm", "trainer.num_nodes=2", "trainer.devices=4", f"paths.log_dir={tmp_path}"]
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert (launcher.nodes, launcher.tasks_per_node) == (2, 4)
    script = _make_sbatch_string(
        "python train.py",
        tmp_path,
        nodes=launcher.nodes,
        ntasks_per_node=launcher.tasks_per_node,
        signal_delay_s=launcher.signal_delay_s,
    )
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=4" in script
    assert "#SBATCH --signal=USR2@120" in script  # submitit asks for the signal 120 s before the limit


def test_stray_distributed_variables_fail_fast_and_say_what_to_unset(tmp_path) -> None:
    """Variables of another run left in the shell: the ranks wait for processes that never come, as long as
    the strategy's timeout, then say so in one line. (A LOCAL_RANK alone is refused before any wait:
    test_launch.py.)"""
    stray = {"LOCAL_RANK": "1", "WORLD_SIZE": "2"}
    command = processes.python(
        "train.py",
        *CPU_DDP,
        "trainer.strategy.timeout.seconds=5",
        f"paths.log_dir={tmp_path}",
    )
    result = processes.run(command, env=os.environ | stray, timeout=120)
    assert result.returncode == 1
    assert "did not all meet within trainer.strategy.timeout" in result.stderr and "unset LOCAL_RANK" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_rank_that_stops_answering_ends_the_run_within_its_timeout(tmp_path: Path) -> None:
    """Rank 1 of 3 freezes (SIGSTOP) at step 10: ranks 0 and 2 wait trainer.strategy.timeout (30 s), each
    logs one line naming rank 1, and no process of the run is left behind. The timeout also bounds the
    rendezvous (torch's), which the two ranks rank 0 starts reach only once imported: 10 s was too short
    for three processes starting on two busy cores."""
    hang = ["+callbacks.hang._target_=faults.HangAt", "+callbacks.hang.step=10", "+callbacks.hang.rank=1"]
    ddp = ["strategy=ddp", "trainer.devices=3", "trainer.accelerator=cpu", "data.batch_size=66"]
    started = time.monotonic()
    result = run_script(
        "train.py", *ddp, *SHORT, *hang, "logger=none", "trainer.strategy.timeout.seconds=30",
        f"paths.log_dir={tmp_path}", timeout=240,
    )  # fmt: skip
    took = time.monotonic() - started
    runs = list((tmp_path / "train" / "runs").iterdir())  # none: the run was refused before its first step
    assert result.returncode == 1 and len(runs) == 1, result.stderr[-3000:]
    (run,) = runs
    assert (run / "train.log").is_file(), result.stdout[-3000:] + result.stderr[-3000:]
    for rank, log in ((0, run / "train.log"), (2, run / "train_ddp_process_2.log")):
        line = (
            f"Stopped at step 10: rank 1 stopped answering; rank {rank} waited 30 s (trainer.strategy.timeout.seconds)"
        )
        assert line in log.read_text(), log
        assert f"Continue with: python train.py resume={run}" in log.read_text()
    assert "Traceback" not in result.stdout + result.stderr
    assert took < 180, took  # the 30 s timeout, the 5 s roll call, start-up: not torch's 30 minutes
    left = subprocess.run(["pgrep", "-f", str(run)], capture_output=True, text=True, check=False, timeout=30)
    assert left.stdout == "", f"processes of the run still alive: {left.stdout}"
