"""Shared fixtures: the real ``conf/``, composed with small overrides and temporary output folders."""

import itertools
import os
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from mnistlab.runtime import hydra_versions
from mnistlab.trained import loading

import processes
import suite_task

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("PROJECT_ROOT", str(ROOT))
# Data files come from $DATA_DIR (CI points it at a prepared copy); without it, from the project's
# data/, where a data module downloads what it needs on first use.
DATA_DIR = os.environ.setdefault("DATA_DIR", str(ROOT / "data"))
# What the environment is between tests: in-process training sets PL_GLOBAL_SEED,
# CUBLAS_WORKSPACE_CONFIG and more, which would otherwise leak into the tests after it.
ENVIRONMENT = dict(os.environ)
IN_CI = os.environ.get("CI") == "true"  # .ci/run sets it: there, only a hardware skip is a skip

SUITE = processes.SUITE  # what the machinery's tests train: the suite's own task (tests/suite_task.py)
SUITE_DATA = yaml.safe_load((ROOT / "tests" / "conf" / "data" / "suite.yaml").read_text())  # its sizes, by name
# What the example's own tests and the contract test train: whatever conf/ composes by default.
OWN: list[str] = []
# The modules a checkpoint of the suite's task names (conf/trust.yaml's, and the suite's own).
TRUSTED = (*loading.TRUSTED, "suite_task")
TRUST_SUITE = f"trusted_modules=[{','.join(TRUSTED)}]"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """``gpu(n)``: needs n CUDA GPUs; ``no_gpu``: checks a refusal that only a machine without one gives."""
    gpus = torch.cuda.device_count()
    for item in items:
        if (needs := item.get_closest_marker("gpu")) and gpus < needs.kwargs.get("count", 1):
            item.add_marker(pytest.mark.skip(reason=f"needs {needs.kwargs.get('count', 1)} CUDA GPU(s), has {gpus}"))
        if item.get_closest_marker("no_gpu") and gpus:
            item.add_marker(pytest.mark.skip(reason="checks a refusal on machines without a GPU"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """In CI a skip fails the test (a missing tool, package or permission is CI's fault), except one for
    the hardware the machine lacks: a green CI means every other test ran."""
    report = yield
    hardware = item.get_closest_marker("gpu") or item.get_closest_marker("no_gpu")
    if IN_CI and report.skipped and not hardware and not hasattr(report, "wasxfail"):
        _fail_the_skip(report)
    return report


def _fail_the_skip(report: pytest.TestReport) -> None:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
    report.outcome = "failed"
    report.longrepr = f"skipped in CI (CI=true), where only a test for hardware this machine lacks may skip: {reason}"


SKIPPED_MODULES: list[str] = []


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if IN_CI and report.skipped:  # a whole module skipped (pytest.skip at import, importorskip)
        SKIPPED_MODULES.append(f"{report.nodeid}: {report.longrepr[2]}")


def pytest_sessionfinish(session: pytest.Session) -> None:
    if SKIPPED_MODULES:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        for line in SKIPPED_MODULES:
            reporter.write_line(f"FAILED (skipped in CI, CI=true): {line}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Only a slow test starts processes, its fixtures too: set before any of them (a session fixture
    made for this test would otherwise see the rule of the test before it)."""
    processes.in_slow_test = item.get_closest_marker("slow") is not None


SUITE_MODULES = ["suite_task.*", "faults.*", "test_batch_hooks.*"]  # the suite's own classes that configs name


@pytest.fixture(autouse=True, scope="session")
def _suite_whitelist():
    """Tests build a config's parts themselves, as trusted code: under Hydra 1.4 they name what they call,
    the project's packages and the suite's own modules (tests/test_hydra_versions.py checks that the
    project names its own). Session-wide: session fixtures train too."""
    with hydra_versions.allowed([*hydra_versions.TARGETS, *SUITE_MODULES]):
        yield


@pytest.fixture(autouse=True)
def _test_rules():
    """Every test ends the processes it started, and leaves the environment as it found it."""
    processes.end_all()
    for name in os.environ.keys() - ENVIRONMENT.keys():
        if not name.startswith("PYTEST_"):  # pytest's own (PYTEST_CURRENT_TEST): it removes them itself
            del os.environ[name]
    os.environ.update(ENVIRONMENT)


# A few batches of everything: enough to exercise every hook on real data.
SHORT = [
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=20",
    "trainer.limit_val_batches=5",
    "trainer.limit_test_batches=5",
]

# 3 epochs of 30 steps, deterministic: runs that were stopped and resumed can be compared exactly.
DETERMINISTIC = [
    "trainer.max_epochs=3",
    "trainer.limit_train_batches=30",
    "trainer.limit_val_batches=3",
    "trainer.limit_test_batches=3",
    "trainer.deterministic=true",
]


MARKER = "payload-ran"  # created in the test's folder by any payload that runs


class Payload:
    """Unpickled, it runs ``touch <marker>``: what torch.load(weights_only=False) would do with it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def config_payloads(marker: Path) -> list[dict]:
    """Network configs that would run code if instantiated: each passes torch.load(weights_only=True)."""
    touch = f"open({str(marker)!r}, 'w')"
    return [
        {"_target_": "builtins.exec", "_args_": [touch]},
        {"_target_": "os.system", "command": f"touch {marker}"},
        {"_target_": "mnistlab.tasks.os.system", "command": f"touch {marker}"},  # our prefix, not our class
        {"_target_": "mnistlab.trained.loading.torch.load", "f": str(marker), "weights_only": False},
        {"_target_": "subprocess.Popen", "args": ["touch", str(marker)]},
        {"_target_": "mnistlab.network.SimpleNN", "hidden": {"_target_": "builtins.exec", "_args_": [touch]}},
    ]


@pytest.fixture
def payload_checkpoint(trained_checkpoint: Path, tmp_path: Path) -> Path:
    """The trained checkpoint with its network's config replaced by a payload."""
    checkpoint = torch.load(trained_checkpoint, weights_only=True)
    checkpoint["config"]["model"]["net"] = config_payloads(tmp_path / MARKER)[0]
    torch.save(checkpoint, tmp_path / "config_payload.ckpt")
    return tmp_path / "config_payload.ckpt"


@pytest.fixture
def pickle_checkpoint(trained_checkpoint: Path, tmp_path: Path) -> Path:
    """The trained checkpoint with a pickled object that runs code when unpickled."""
    checkpoint = torch.load(trained_checkpoint, weights_only=True)
    checkpoint["hyper_parameters"] = {"note": Payload(tmp_path / MARKER)}
    torch.save(checkpoint, tmp_path / "pickle_payload.ckpt")
    return tmp_path / "pickle_payload.ckpt"


def last_checkpoint(run: Path) -> dict:
    return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)


def assert_same_weights(a: dict, b: dict, atol: float = 1e-6) -> None:
    """The checkpoints ``a`` and ``b`` hold the same weights and metric states."""
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for name, value in a["state_dict"].items():
        torch.testing.assert_close(
            b["state_dict"][name], value, rtol=0, atol=atol, msg=lambda m, name=name: f"{name}: {m}"
        )


def assert_same_training(a: dict, b: dict, atol: float = 1e-6) -> None:
    """The same weights, and the same optimizer state (Adam's step count and moments, every parameter)."""
    assert_same_weights(a, b, atol)
    (first,), (second,) = a["optimizer_states"], b["optimizer_states"]
    assert first["state"].keys() == second["state"].keys() and first["state"]
    for index, state in first["state"].items():
        for key, value in state.items():
            # Adam's second moment is a square: its scale is the gradient's squared, not the weights'.
            where = f"optimizer state {index}.{key}"
            torch.testing.assert_close(
                second["state"][index][key], value, rtol=1e-4, atol=atol, msg=lambda m, where=where: f"{where}: {m}"
            )


def compose_config(
    name: str, out: Path, overrides: Sequence[str] = (), hydra: bool = False, task: Sequence[str] = SUITE
) -> DictConfig:
    """Compose ``conf/<name>.yaml`` as the entry point would, writing everything under ``out``, training
    ``task`` (the suite's, or ``OWN``: conf/'s default); with ``hydra``, Hydra's own config too (``cfg.hydra``:
    the sweeper, the launcher)."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), **hydra_versions.BASE):
        return compose(
            config_name=name,
            overrides=[*task, f"paths.log_dir={out}", f"paths.output_dir={out}", "trainer.accelerator=cpu", *overrides],
            return_hydra_config=hydra,
        )


TRAINERS = processes.TRAINERS  # the entry points whose config holds a Trainer


def run_script(
    script: str, *overrides: str, timeout: float = 300, cpu: bool = True, task: Sequence[str] = SUITE
) -> subprocess.CompletedProcess[str]:
    """Run an entry point as a user would, in its own process (needed for DDP: Lightning re-runs it), on
    ``task`` (see compose_config). ``cpu``: first of all, trainer.accelerator=cpu: the tests mean CPU
    processes (gloo), which auto would turn into GPUs (nccl) on a machine that has some."""
    pinned = ["trainer.accelerator=cpu"] if cpu and script in TRAINERS else []
    flags = list(itertools.takewhile(lambda arg: arg.startswith("-"), overrides))  # -m: before any override
    command = processes.python(script, *flags, *pinned, *overrides[len(flags) :], task=task)
    return processes.run(command, timeout=timeout)


# Runs from the same seed over the same 2 epochs of 20 global batches (the second epoch reshuffled): one
# process, and 2 or 4 ranks however they are started, stopped and resumed, must end with the same weights.
EQUIVALENCE = [
    "trainer.max_epochs=2",
    "trainer.limit_train_batches=20",
    "trainer.limit_test_batches=2",
    "trainer.accelerator=cpu",
]  # and all validation samples: each validated once, on any number of ranks


def train_like_one_process(out: Path, *overrides: str) -> Path:
    """Train EQUIVALENCE's run in ``out`` (hydra.run.dir), with ``overrides``: the ranks, a checkpoint."""
    result = run_script("train.py", *EQUIVALENCE, *overrides, f"hydra.run.dir={out}")
    assert result.returncode == 0, result.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference: EQUIVALENCE on one process."""
    return train_like_one_process(tmp_path_factory.mktemp("one"))


def assert_trained_as_one_process(run: Path, one_process: Path) -> None:
    """``run`` ends with the weights and Adam state of the single-process run, which moved every weight."""
    one, other = last_checkpoint(one_process), last_checkpoint(run)
    assert one["global_step"] == other["global_step"] == 40
    torch.manual_seed(42)  # the runs' seed: their common starting point
    for name, initial in suite_task.Net().state_dict().items():  # tests/conf/model/suite.yaml's network
        assert (one["state_dict"][f"net.{name}"] - initial).abs().max() > 1e-3  # 40 Adam steps moved it
    # 3e-4, a thirtieth of one Adam step at lr 1e-2: gloo sums 4 ranks' gradients in another order than one
    # process does, and Adam's division by the root of a near-zero second moment magnifies that for the
    # rare weight whose gradients are near 0. A shard served twice or missed, or a rank on its own batch,
    # moves every weight by far more.
    assert_same_training(one, other, atol=3e-4)


def free_port() -> str:
    """A port for the rendezvous of processes that are started separately."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def one_run(log_dir: Path, logs: set[str] = frozenset({"train.log", "train_ddp_process_1.log"})) -> Path:
    """The one run folder of ``log_dir``: one saved config, one TensorBoard run, one log per rank."""
    (run,) = (log_dir / "train" / "runs").iterdir()
    assert_one_run(run, logs)
    return run


def assert_one_run(run: Path, logs: set[str]) -> None:
    assert [p.relative_to(run).as_posix() for p in run.rglob("config.yaml")] == [".hydra/config.yaml"]
    assert {p.name for p in run.glob("*.log")} == logs
    assert [p.name for p in run.rglob("hparams.yaml")] == ["hparams.yaml"]
    for rank, log in enumerate(sorted(logs - {"train.log"}), start=1):  # each rank wrote its own file
        assert f"GLOBAL_RANK: {rank}, MEMBER: {rank + 1}/{len(logs)}" in (run / log).read_text(), log


@pytest.fixture
def train_cfg(tmp_path: Path) -> DictConfig:
    return compose_config("train", tmp_path, [*SHORT, "logger=csv"])


def _trained(out: Path, task: Sequence[str]) -> Path:
    from mnistlab.tasks import train  # not at import: see tests/faults.py

    train(compose_config("train", out, [*SHORT, "logger=none"], task=task))
    (best,) = (out / "checkpoints").glob("epoch*.ckpt")
    return best


@pytest.fixture(scope="session")
def trained_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The best checkpoint of a short run of the suite's task, for the machinery that uses one (export, serve)."""
    return _trained(tmp_path_factory.mktemp("trained"), SUITE)


@pytest.fixture(scope="session")
def trained_example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The best checkpoint of a short run of conf/'s own task: the example's (digits: predict, demo)."""
    return _trained(tmp_path_factory.mktemp("example"), OWN)


@contextmanager
def serving(out: Path, *overrides: str, script: str = "serve.py", ready: str = "/health") -> Iterator[str]:
    """A server entry point (serve.py, demo.py) running on a free local port, as a user starts it; yields
    its address once ``ready`` answers 200, and ends its process group after."""
    port = free_port()
    command = processes.python(script, f"port={port}", f"paths.data_dir={DATA_DIR}", f"hydra.run.dir={out}", *overrides)
    with open(out.parent / f"{out.name}.log", "w") as log:
        server = processes.start(command, output=log)
    url = f"http://127.0.0.1:{port}"
    for _ in range(240):
        if server.poll() is not None:
            pytest.fail(f"{script} ended ({server.returncode}): {(out.parent / f'{out.name}.log').read_text()[-3000:]}")
        try:
            if httpx.get(url + ready, timeout=2).status_code == 200:
                break
        except httpx.TransportError:  # not listening yet
            pass
        time.sleep(0.5)
    else:
        pytest.fail(f"{script} was not ready in 120 s: {(out.parent / f'{out.name}.log').read_text()[-3000:]}")
    try:
        yield url
    finally:
        processes.end_group(server)
        server.wait()
