"""Multi-process DDP on CPU (gloo), started as users start it: Lightning re-runs the script per rank."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mnistlab.network import SimpleNN

from conftest import ROOT, SHORT, run_script

pytestmark = pytest.mark.slow


def test_ddp_on_cpu_writes_one_run(tmp_path: Path) -> None:
    result = run_script(
        "train.py",
        "strategy=ddp",
        "trainer.devices=2",
        "trainer.max_epochs=2",
        "trainer.limit_train_batches=40",
        "trainer.limit_val_batches=10",
        f"paths.log_dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = (tmp_path / "train" / "runs").iterdir()  # one run directory, shared by both ranks
    assert [p.relative_to(run).as_posix() for p in run.rglob("config.yaml")] == [".hydra/config.yaml"]
    assert len(list(run.rglob("checkpoints"))) == 1 and (run / "checkpoints" / "last.ckpt").is_file()
    assert [p.name for p in run.rglob("hparams.yaml")] == ["hparams.yaml"]  # one TensorBoard run
    assert {p.name for p in run.glob("*.log")} == {"train.log", "train_ddp_process_1.log"}
    assert "Starting with 2 processes" in result.stdout
    # The console is rank 0's: rank 1 logs the same final line to its own file only.
    assert result.stdout.count("Tested ") == 1
    assert "Tested " in (run / "train_ddp_process_1.log").read_text()
    assert "[rank: 1]" not in result.stdout + result.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on machines without a GPU")
def test_gpu_only_strategy_stops_at_once_without_a_gpu(tmp_path: Path) -> None:
    result = run_script("train.py", "strategy=ddp_nccl", "trainer.devices=2", f"paths.log_dir={tmp_path}", timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        (
            "Error: trainer.accelerator=gpu (also set by strategy=ddp_nccl and strategy=fsdp) needs a CUDA GPU and "
            "this machine has none; use trainer.accelerator=cpu, with strategy=ddp for several processes"
        )
    ]


@pytest.mark.parametrize("launcher", ["basic", "joblib"])  # jobs in this process, or in a pool of workers
def test_sweep_over_ddp_jobs_gives_each_job_its_own_ranks(launcher: str, tmp_path: Path) -> None:
    result = run_script(
        "train.py",
        "-m",
        f"hydra/launcher={launcher}",
        "strategy=ddp",
        "trainer.devices=2",
        "model.optimizer.lr=1e-3,3e-3",
        *SHORT,
        f"paths.log_dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert [p.name for p in (tmp_path / "train").iterdir()] == ["multiruns"]  # no second tree from the ranks
    (sweep,) = (tmp_path / "train" / "multiruns").iterdir()
    for job, lr in [("0", "0.001"), ("1", "0.003")]:
        folder = sweep / job
        assert [p.relative_to(folder).as_posix() for p in folder.rglob("config.yaml")] == [".hydra/config.yaml"]
        for rank_log in ("train_ddp_process_0.log", "train_ddp_process_1.log"):  # both ranks ran this job's lr
            assert f"model.optimizer.lr={lr}" in (folder / rank_log).read_text()
        metrics = json.loads((folder / "metrics.json").read_text())
        assert metrics["test/samples"] == 5 * 64 and (folder / "checkpoints" / "last.ckpt").is_file()


# Two runs from the same seed, over the same 20 global batches of 64: one process, and two DDP ranks of 32.
EQUIVALENCE = ["trainer.max_epochs=1", "trainer.limit_train_batches=20", "trainer.limit_val_batches=2", "test=false"]


@pytest.fixture(scope="module")
def one_and_two_processes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    runs = []
    for name, processes in [("one", []), ("two", ["strategy=ddp", "trainer.devices=2"])]:
        out = tmp_path_factory.mktemp(name)
        result = run_script("train.py", *EQUIVALENCE, *processes, f"hydra.run.dir={out}")
        assert result.returncode == 0, result.stderr[-3000:]
        runs.append(out)
    return runs[0], runs[1]


def test_ddp_computes_what_one_process_computes(one_and_two_processes: tuple[Path, Path]) -> None:
    one, two = (torch.load(run / "checkpoints" / "last.ckpt", weights_only=True) for run in one_and_two_processes)
    assert one["global_step"] == two["global_step"] == 20
    torch.manual_seed(42)  # the runs' seed: their common starting point
    start = {f"net.{name}": value for name, value in SimpleNN().state_dict().items()}
    for name, initial in start.items():  # every weight of the network (the state_dict also holds val_acc_best)
        value = one["state_dict"][name]
        assert (value - initial).abs().max() > 1e-3  # 20 Adam steps moved every tensor
        torch.testing.assert_close(two["state_dict"][name], value, rtol=0, atol=1e-5)


def test_three_ranks_evaluate_every_test_image_exactly_once_with_any_batch(
    one_and_two_processes, tmp_path: Path
) -> None:
    checkpoint = one_and_two_processes[0] / "checkpoints" / "last.ckpt"
    results = []
    # 10,000 images do not divide by 3, nor a batch of 100: evaluation takes any batch on any processes.
    for batch, processes in (("64", []), ("100", ["strategy=ddp", "trainer.devices=3"])):
        out = tmp_path / str(len(processes))
        result = run_script(
            "eval.py", f"ckpt_path={checkpoint}", f"data.batch_size={batch}", *processes, f"hydra.run.dir={out}"
        )
        assert result.returncode == 0, result.stderr[-3000:]
        results.append(json.loads((out / "metrics.json").read_text()))
    single, three = results
    assert single["test/samples"] == three["test/samples"] == 10_000
    assert three["test/acc"] == single["test/acc"]
    assert three["test/loss"] == pytest.approx(single["test/loss"], rel=1e-6)


@pytest.mark.parametrize("processes", [1, 2])
def test_ddp_run_resumes_on_any_number_of_processes(one_and_two_processes, processes: int, tmp_path: Path) -> None:
    checkpoint = one_and_two_processes[1] / "checkpoints" / "last.ckpt"
    overrides = [*EQUIVALENCE, "trainer.max_epochs=2", f"ckpt_path={checkpoint}", f"hydra.run.dir={tmp_path}"]
    if processes > 1:
        overrides += ["strategy=ddp", f"trainer.devices={processes}"]
    result = run_script("train.py", *overrides)
    assert result.returncode == 0, result.stderr[-3000:]
    resumed = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert (resumed["epoch"], resumed["global_step"]) == (1, 40)  # picked up after the first 20 steps


def _torchrun(*args: str, timeout: float = 300) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "torch.distributed.run", *args]  # the seed's launcher style: torchrun
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _free_port() -> str:
    """A port for the rendezvous of processes that are started separately."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def _one_run(log_dir: Path) -> Path:
    (run,) = (log_dir / "train" / "runs").iterdir()
    assert [p.relative_to(run).as_posix() for p in run.rglob("config.yaml")] == [".hydra/config.yaml"]
    assert {p.name for p in run.glob("*.log")} == {"train.log", "train_ddp_process_1.log"}
    assert [p.name for p in run.rglob("hparams.yaml")] == ["hparams.yaml"]
    return run


def test_torchrun_ranks_share_one_run(tmp_path: Path) -> None:
    run = _torchrun(
        "--standalone",
        "--nproc_per_node=2",
        "train.py",
        "strategy=ddp",
        "trainer.devices=2",
        *SHORT,
        f"paths.log_dir={tmp_path}",
    )
    output = run.communicate(timeout=300)[0]
    assert run.returncode == 0, output[-3000:]
    assert "Starting with 2 processes" in output
    assert json.loads((_one_run(tmp_path) / "metrics.json").read_text())["test/samples"] == 5 * 64


def test_two_simulated_nodes_train_together(tmp_path: Path) -> None:
    port = _free_port()
    agents = [
        _torchrun(
            "--nnodes=2",
            f"--node_rank={node}",
            "--nproc_per_node=1",
            "--master_addr=127.0.0.1",
            f"--master_port={port}",
            "train.py",
            "strategy=ddp",
            "trainer.devices=1",
            "trainer.num_nodes=2",
            "data.prepare_data_per_node=false",
            *SHORT,
            f"paths.log_dir={tmp_path}",
        )
        for node in (0, 1)
    ]
    outputs = [agent.communicate(timeout=300)[0] for agent in agents]
    assert [agent.returncode for agent in agents] == [0, 0], outputs[0][-2000:] + outputs[1][-2000:]
    assert "Starting with 2 processes" in outputs[0]
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in (_one_run(tmp_path) / "train_ddp_process_1.log").read_text()


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
    command = [sys.executable, "train.py", *overrides]
    return subprocess.Popen(
        command, cwd=ROOT, env=os.environ | slurm, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def test_srun_tasks_are_recognised_and_share_the_job_folder(tmp_path: Path) -> None:
    job_id = str(40_000 + os.getpid() % 1_000)  # Lightning derives the rendezvous port from it
    tasks = [
        _fake_srun_task(r, 2, job_id, "strategy=ddp", "trainer.devices=2", *SHORT, f"paths.log_dir={tmp_path}")
        for r in (0, 1)
    ]
    outputs = [task.communicate(timeout=300)[0] for task in tasks]
    assert [task.returncode for task in tasks] == [0, 0], outputs[0][-2000:] + outputs[1][-2000:]
    run = _one_run(tmp_path)
    assert run.name == f"slurm-{job_id}"  # stable across requeues of the job
    assert "Starting with 2 processes" in outputs[0]


def test_slurm_launcher_submits_one_task_per_rank(tmp_path: Path) -> None:
    from hydra import compose, initialize_config_dir
    from submitit.slurm.slurm import _make_sbatch_string

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
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


@pytest.mark.parametrize(
    "stray,message",
    [
        ({"LOCAL_RANK": "1"}, "Error: LOCAL_RANK=1 is set, but no launcher started this process"),
        ({"LOCAL_RANK": "1", "WORLD_SIZE": "2"}, "did not all meet within trainer.strategy.timeout"),
    ],
)
def test_stray_distributed_variables_fail_fast_and_say_what_to_unset(stray: dict, message: str, tmp_path) -> None:
    command = [
        sys.executable,
        "train.py",
        "strategy=ddp",
        "trainer.devices=2",
        "trainer.strategy.timeout.seconds=5",
        f"paths.log_dir={tmp_path}",
    ]
    result = subprocess.run(
        command, cwd=ROOT, env=os.environ | stray, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 1
    assert message in result.stderr and "unset LOCAL_RANK" in result.stderr
    assert "Traceback" not in result.stderr


def test_two_machines_started_by_hand_with_lightnings_variables(tmp_path: Path) -> None:
    port = _free_port()
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "train.py",
                "strategy=ddp",
                "trainer.devices=1",
                "trainer.num_nodes=2",
                "data.prepare_data_per_node=false",
                *SHORT,
                f"hydra.run.dir={tmp_path}",
            ],
            cwd=ROOT,
            env=os.environ | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "NODE_RANK": str(node)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in (0, 1)
    ]
    outputs = [node.communicate(timeout=300)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs[0][-2000:] + outputs[1][-2000:]
    assert [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("config.yaml")] == [".hydra/config.yaml"]
    assert {p.name for p in tmp_path.glob("*.log")} == {"train.log", "train_node_1.log"}
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in (tmp_path / "train_node_1.log").read_text()


def test_optuna_sweep_over_ddp_jobs_reads_each_jobs_real_metric(tmp_path: Path) -> None:
    result = run_script(
        "train.py",
        "-m",
        "hydra/sweeper=optuna",
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.direction=maximize",
        "model.optimizer.lr=interval(1e-4,1e-2)",
        "strategy=ddp",
        "trainer.devices=2",
        *SHORT,
        f"paths.log_dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (sweep,) = (tmp_path / "train" / "multiruns").iterdir()
    best = {}
    for job in ("0", "1"):
        (lr,) = [o for o in (sweep / job / ".hydra" / "overrides.yaml").read_text().split() if "optimizer.lr=" in o]
        for rank_log in ("train_ddp_process_0.log", "train_ddp_process_1.log"):  # the sampled lr, on both ranks
            assert lr in (sweep / job / rank_log).read_text()
        best[lr] = json.loads((sweep / job / "metrics.json").read_text())["val/acc_best"]
    results = (sweep / "optimization_results.yaml").read_text()
    assert f"best_value: {max(best.values())}" in results


DDP_RUN = [
    "strategy=ddp",
    "trainer.devices=2",
    "trainer.max_epochs=2",
    "trainer.limit_train_batches=40",
    "trainer.limit_val_batches=5",
    "trainer.limit_test_batches=5",
    "trainer.log_every_n_steps=10",
    "callbacks.last_checkpoint.every_n_train_steps=10",
    "callbacks.last_checkpoint.every_n_epochs=null",
]


def test_ddp_ranks_stop_together_on_a_signal_to_rank_0(tmp_path: Path) -> None:
    signalled = ["+callbacks.signal._target_=faults.SignalAt", "+callbacks.signal.step=25"]
    result = run_script(
        "train.py", *DDP_RUN, *signalled, "+callbacks.signal.signal=SIGUSR1", f"paths.log_dir={tmp_path}"
    )
    assert result.returncode == 128 + 10, result.stderr[-3000:]
    run = _one_run(tmp_path)
    # The ranks agree at the next check (every trainer.log_every_n_steps=10 steps): step 30.
    assert result.stdout.count("Stopped by SIGUSR1 at step 30 (epoch 0)") == 1  # rank 0's console only
    assert "Stopped by SIGUSR1 at step 30" in (run / "train_ddp_process_1.log").read_text()  # the other rank, too
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 30
    resumed = run_script("train.py", f"resume={run}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 80


def test_ddp_ranks_stop_together_when_one_diverges(tmp_path: Path) -> None:
    poisoned = ["+callbacks.poison._target_=faults.PoisonAt", "+callbacks.poison.step=12", "+callbacks.poison.rank=1"]
    result = run_script("train.py", *DDP_RUN, *poisoned, f"paths.log_dir={tmp_path}", timeout=180)
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stdout.count("The training loss became non-finite (NaN or inf) between steps 10 and 20") == 1
    run = _one_run(tmp_path)
    assert "became non-finite" in (run / "train_ddp_process_1.log").read_text()
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 10


def test_torchrun_restarts_a_killed_worker_from_the_runs_last_checkpoint(tmp_path: Path) -> None:
    longer = [*DDP_RUN, "trainer.limit_train_batches=200", "callbacks.last_checkpoint.every_n_train_steps=20"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--max-restarts=1", "--nproc_per_node=2"]
    console = (tmp_path / "console.txt").open("w")  # not a pipe: nobody reads it while the test waits
    agent = subprocess.Popen(
        [*torchrun, "train.py", *longer, f"paths.log_dir={tmp_path}"], cwd=ROOT, stdout=console, stderr=console
    )
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("train/runs/*/checkpoints/last.ckpt")) and time.monotonic() < deadline:
        time.sleep(0.05)
    workers = Path(f"/proc/{agent.pid}/task/{agent.pid}/children").read_text().split()
    assert len(workers) == 2, workers
    os.kill(int(workers[1]), signal.SIGKILL)  # one worker dies mid-training
    agent.wait(timeout=300)
    assert agent.returncode == 0, (tmp_path / "console.txt").read_text()[-3000:]
    run = _one_run(tmp_path)
    log = (run / "train.log").read_text()
    assert f"Resuming from {run / 'checkpoints' / 'last.ckpt'}, this run folder's last checkpoint" in log
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 400
    assert json.loads((run / "metrics.json").read_text())["test/samples"] == 5 * 64


def test_a_rank_that_stops_answering_ends_the_run_within_its_timeout(tmp_path: Path) -> None:
    """Rank 1 of 3 freezes (SIGSTOP) at step 10: ranks 0 and 2 wait trainer.strategy.timeout (10 s), each
    logs one line naming rank 1, and no process of the run is left behind."""
    hang = ["+callbacks.hang._target_=faults.HangAt", "+callbacks.hang.step=10", "+callbacks.hang.rank=1"]
    ddp = ["strategy=ddp", "trainer.devices=3", "trainer.accelerator=cpu", "data.batch_size=66"]
    started = time.monotonic()
    result = run_script(
        "train.py", *ddp, *SHORT, *hang, "logger=none", "trainer.strategy.timeout.seconds=10",
        f"paths.log_dir={tmp_path}", timeout=240,
    )  # fmt: skip
    took = time.monotonic() - started
    (run,) = (tmp_path / "train" / "runs").iterdir()
    assert result.returncode == 1, result.stderr[-3000:]
    for rank, log in ((0, run / "train.log"), (2, run / "train_ddp_process_2.log")):
        line = (
            f"Stopped at step 10: rank 1 stopped answering; rank {rank} waited 10 s (trainer.strategy.timeout.seconds)"
        )
        assert line in log.read_text(), log
        assert f"Continue with: python train.py resume={run}" in log.read_text()
    assert "Traceback" not in result.stdout + result.stderr
    assert took < 180, took  # the 10 s timeout, the 5 s roll call, start-up: not torch's 30 minutes
    left = subprocess.run(["pgrep", "-f", str(run)], capture_output=True, text=True, check=False, timeout=30)
    assert left.stdout == "", f"processes of the run still alive: {left.stdout}"
