"""The suite's rules and shared fixtures (pytest's own place for them); what tests import lives in
composing.py, running.py and payloads.py."""

import os
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig

from mnistlab.runtime.config import hydra_versions

import processes
from composing import OWN, SHORT, SUITE, SUITE_MODULES, compose_config
from payloads import MARKER, Payload, config_payloads
from running import one_process_reference, trained

# Under pytest-xdist (CI's slow tier: 2 workers on 2 cores) each worker's torch takes its share of the cores,
# it and the processes it starts (OMP_NUM_THREADS): torch's default, a thread per core, spins against the other
# worker's (measured: the default 10-epoch run 9 s alone, 232 s beside another worker).
if workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0")):
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
# What the environment is between tests: in-process training sets PL_GLOBAL_SEED,
# CUBLAS_WORKSPACE_CONFIG and more, which would otherwise leak into the tests after it.
ENVIRONMENT = dict(os.environ)
IN_CI = os.environ.get("CI") == "true"  # .ci/run sets it: there, only a hardware skip is a skip


@pytest.hookimpl(trylast=True)  # after pytest-xdist's own, which names each item's group
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _check_groups(config, items)
    _check_yours(items)
    _skip_for_hardware(items)


def _check_yours(items: list[pytest.Item]) -> None:
    """``pytest -m yours`` is what a user runs after replacing the example (and the generator's walk-throughs
    run): a test that composes their task (``composing.OWN``) or trains it (``trained_example``) carries the
    mark, or it would pass unseen there."""
    for item in items:
        reads = getattr(getattr(item, "module", None), "OWN", None) is OWN or "trained_example" in item.fixturenames
        if reads and not item.get_closest_marker("yours"):
            raise pytest.UsageError(f"{item.nodeid} reads your task (OWN, trained_example): mark it yours")


def _skip_for_hardware(items: list[pytest.Item]) -> None:
    """``gpu(n)``: needs n CUDA GPUs; ``no_gpu``: checks a refusal that only a machine without one gives."""
    gpus = torch.cuda.device_count()
    for item in items:
        if (needs := item.get_closest_marker("gpu")) and gpus < needs.kwargs.get("count", 1):
            item.add_marker(pytest.mark.skip(reason=f"needs {needs.kwargs.get('count', 1)} CUDA GPU(s), has {gpus}"))
        if item.get_closest_marker("no_gpu") and gpus:
            item.add_marker(pytest.mark.skip(reason="checks a refusal on machines without a GPU"))


def _check_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse to run a parallel slow tier whose groups pytest-xdist did not keep together: the SLURM,
    Ray and pods modules would each start their cluster twice, side by side (SLURM's job ports collide)."""
    if not getattr(config.option, "loadgroup", False):  # set in the workers of `-n N --dist loadgroup`
        return
    # A worker cannot stop the session (xdist reports a crash instead): each such test fails at its setup.
    for item in items:
        if item.get_closest_marker("xdist_group") and "@" not in item.nodeid:
            item.stash[UNGROUPED] = (
                "--dist loadgroup did not keep this module's tests on one worker: this pytest and pytest-xdist "
                "do not work together (pytest-xdist#1386, pytest 9.2); lock a pair that does (pyproject.toml)"
            )


UNGROUPED = pytest.StashKey[str]()


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
    if UNGROUPED in item.stash:
        pytest.fail(item.stash[UNGROUPED], pytrace=False)


@pytest.fixture(autouse=True, scope="session")
def _suite_whitelist():
    """Tests build a config's parts themselves, as trusted code: under Hydra 1.4 they name what they call,
    the project's packages and the suite's own modules (tests/test_hydra_versions.py checks that the
    project names its own). Session-wide: session fixtures train too."""
    with hydra_versions.allowed([*hydra_versions.TARGETS, *SUITE_MODULES]):
        yield


@pytest.fixture(autouse=True)
def _test_rules():
    """Every test ends the processes it started, and leaves the environment as it found it: at its end (the
    last test of a session too: a server it started outlived pytest when this ran at the next test's start)."""
    _restore_environment()
    yield
    processes.end_all()
    _restore_environment()


def _restore_environment() -> None:
    for name in os.environ.keys() - ENVIRONMENT.keys():
        if not name.startswith("PYTEST_"):  # pytest's own (PYTEST_CURRENT_TEST): it removes them itself
            del os.environ[name]
    os.environ.update(ENVIRONMENT)


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


@pytest.fixture(scope="session")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference: EQUIVALENCE on one process."""
    return one_process_reference(tmp_path_factory.mktemp("one"))


@pytest.fixture
def train_cfg(tmp_path: Path) -> DictConfig:
    return compose_config("train", tmp_path, [*SHORT, "logger=csv"])


@pytest.fixture(scope="session")
def trained_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The best checkpoint of a short run of the suite's task, for the machinery that uses one (export, serve)."""
    return trained(tmp_path_factory.mktemp("trained"), SUITE)


@pytest.fixture(scope="session")
def trained_example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The best checkpoint of a short run of conf/'s own task: the example's (digits: predict, demo)."""
    return trained(tmp_path_factory.mktemp("example"), OWN)
