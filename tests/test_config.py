import json
import logging
import re
from pathlib import Path

import pytest
import torch
from hydra.errors import ConfigCompositionException
from hydra.utils import instantiate
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, SingleDeviceStrategy
from omegaconf import OmegaConf

from mnistlab.runtime.config import checks, schema
from mnistlab.runtime.config.checks import check_devices
from mnistlab.runtime.distributed import ddp
from mnistlab.runtime.run import run_folder
from mnistlab.runtime.run.failures import InputError
from mnistlab.tasks import train

from composing import OWN, ROOT, SUITE, SUITE_DATA, compose_config
from running import run_script

pytestmark = pytest.mark.yours  # reads your task: pytest -m yours (docs/make-it-yours.md)

CONF = ROOT / "conf"
USERS = {"data", "model", "model/scheduler", "experiment"}  # the user's groups: composed with the user's other defaults
GROUPS = [
    "data",
    "model",
    "model/scheduler",
    "trainer",
    "strategy",
    "callbacks",
    "logger",
    "paths",
    "debug",
    "experiment",
]


def options(group: str) -> list[str]:
    return sorted(path.stem for path in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in options(g)])
@pytest.mark.parametrize("entry", ["train", "eval"])
def test_every_option_composes_resolves_and_fits_the_schema(entry: str, group: str, option: str, tmp_path) -> None:
    extra = ["ckpt_path=some.ckpt"] if entry == "eval" else []
    try:
        cfg = compose_config(entry, tmp_path, [f"{group}={option}", *extra], task=OWN if group in USERS else SUITE)
    except ConfigCompositionException as err:
        if "/" in group and f"Could not override '{group}'. No match in the defaults list" in str(err):
            parent, _, sub = group.rpartition("/")  # model/scheduler: a group of your model config's defaults
            raise pytest.fail.Exception(  # pytest.fail, without Hydra's error chained to it
                f"conf/{group}/{option}.yaml is an option of {parent} configs with a '{sub}' default, and your "
                f"{parent} config has none: remove conf/{group}/ if your {parent} takes no {sub}, or list "
                f"'- {sub}: null' in its defaults (docs/make-it-yours.md)",
                pytrace=False,
            ) from None
        raise
    for key in OmegaConf.missing_keys(cfg):  # the option's own required keys (data=stream: data.input_dir): given
        if key.startswith(f"{group.split('/')[0]}."):
            OmegaConf.update(cfg, key, "given")
    resolved = OmegaConf.to_container(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]), resolve=True)
    assert resolved["trainer"]["max_epochs"] >= 1
    schema.check(cfg, schema.TrainConfig if entry == "train" else schema.EvalConfig)


def test_every_group_and_option_is_covered() -> None:
    """Every group of conf/ is one these tests compose (a group the user emptied, conf/experiment/, may go)."""
    groups = {str(p.parent.relative_to(CONF)) for p in CONF.rglob("*.yaml") if p.parent != CONF}
    # Hydra's own (tests/test_ddp.py, test_sweeps.py) and the Optuna search's (tests/test_optuna.py)
    optuna = {"hparams_search", "hydra/sweeper", "hydra/sweeper/sampler", "hydra/sweeper/pruner"}
    serving = {"decode"}  # serve.py's input (tests/test_serving.py, test_serving_digits.py)
    engines = {"engine"}  # train.py's alone (tests/test_ray.py)
    assert groups <= set(GROUPS) | {"hydra", "hydra/launcher"} | optuna | serving | engines


CPU_STRATEGIES = [
    # option, overrides, strategy class, backend, start method, devices, nodes
    ("auto", [], SingleDeviceStrategy, None, None, 1, 1),
    ("auto", ["trainer.devices=2"], DDPStrategy, "gloo", "popen", 2, 1),
    ("ddp", ["trainer.devices=4"], ddp.DDPStrategy, "gloo", "popen", 4, 1),
    ("ddp", ["trainer.devices=2", "trainer.num_nodes=3"], ddp.DDPStrategy, "gloo", "popen", 2, 3),
    ("ddp_gloo", ["trainer.devices=2"], ddp.DDPStrategy, "gloo", "popen", 2, 1),
    ("ddp_spawn", ["trainer.devices=2"], ddp.DDPStrategy, "gloo", "spawn", 2, 1),
]


@pytest.mark.parametrize("option,overrides,cls,backend,start,devices,nodes", CPU_STRATEGIES)
def test_strategy_builds_the_intended_trainer(option, overrides, cls, backend, start, devices, nodes, tmp_path) -> None:
    cfg = compose_config("train", tmp_path, [f"strategy={option}", *overrides])
    check_devices(cfg)
    trainer = instantiate(cfg.trainer)  # builds only: no process starts before fit
    strategy = trainer.strategy
    assert type(strategy) is cls
    assert (trainer.num_devices, trainer.num_nodes, trainer.world_size) == (devices, nodes, devices * nodes)
    if issubclass(cls, DDPStrategy):
        assert strategy._get_process_group_backend() == backend
        assert strategy._start_method == start
        # conf/strategy/: a silent rank ends the run within 10 minutes (NCCL's default), not gloo's 30;
        # strategy=auto leaves the choice, and its timeout, to Lightning.
        assert strategy._timeout.total_seconds() == (1800 if option == "auto" else 600)


@pytest.mark.parametrize("option,ends", [("ddp_spawn", True), ("ddp_notebook", True), ("ddp", False)])
def test_ranks_the_strategy_started_end_their_process_group(option: str, ends: bool, tmp_path: Path) -> None:
    """A spawned or forked rank lives for one fit or test: left to interpreter exit, gloo can abort it
    (runtime/distributed/ddp.py). A rank re-run from the script keeps its group for the test that follows fit."""
    cfg = compose_config("train", tmp_path, [f"strategy={option}", "trainer.devices=1"])
    strategy = instantiate(cfg.trainer).strategy
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        strategy.teardown()
        assert torch.distributed.is_initialized() is not ends
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


@pytest.fixture
def two_fake_gpus(monkeypatch) -> None:
    """Make torch and Lightning see two CUDA devices, so that GPU-only strategies can be built (not run)."""
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("lightning.fabric.accelerators.cuda.num_cuda_devices", lambda: 2)
    monkeypatch.setattr("lightning.pytorch.accelerators.cuda.num_cuda_devices", lambda: 2)


@pytest.mark.parametrize(
    "option,cls", [("ddp", ddp.DDPStrategy), ("ddp_nccl", ddp.DDPStrategy), ("fsdp", FSDPStrategy)]
)
def test_gpu_strategies_build_the_intended_trainer(option: str, cls: type, two_fake_gpus, tmp_path: Path) -> None:
    overrides = [f"strategy={option}", "trainer.accelerator=gpu", "trainer.devices=2", "trainer.num_nodes=2"]
    cfg = compose_config("train", tmp_path, overrides)
    check_devices(cfg)
    trainer = instantiate(cfg.trainer)
    assert type(trainer.strategy) is cls
    assert (trainer.num_devices, trainer.num_nodes, trainer.world_size) == (2, 2, 4)
    assert trainer.strategy.root_device.type == "cuda"
    assert trainer.strategy._get_process_group_backend() == "nccl"


@pytest.mark.no_gpu
@pytest.mark.parametrize(
    "overrides,message",
    [
        (["trainer.accelerator=gpu"], "trainer.accelerator=gpu .* needs a CUDA GPU"),
        (["strategy=ddp_nccl", "trainer.accelerator=cpu"], "nccl backend .* needs CUDA GPUs"),
        (["strategy=fsdp", "trainer.accelerator=cpu"], "invalid trainer settings: .*fsdp.* requires a GPU"),
    ],
)
def test_gpu_only_settings_are_refused_without_a_gpu(overrides: list[str], message: str, tmp_path: Path) -> None:
    with pytest.raises(InputError, match=message):
        train(compose_config("train", tmp_path, overrides))


def _metrics(run: Path) -> dict:
    return json.loads((run / "metrics.json").read_text())


def _net(run: Path) -> dict:
    return torch.load(run_folder.last_checkpoint(run), weights_only=True)


# Each option that changes what a run does, run as a user runs it (shrunk), and what it promises
# read back from the run's folder: (its overrides, shrinking ones, a check of the run folder, the task).
FEW_BATCHES = ["trainer.limit_train_batches=4", "trainer.limit_val_batches=2", "trainer.limit_test_batches=2"]
BATCH = SUITE_DATA["batch_size"]
EPOCH = SUITE_DATA["train_size"] // BATCH  # batches an epoch
OPTION_RUNS = {
    "debug=fdr": ([], lambda run: _metrics(run)["test/samples"] == BATCH and not list(run.rglob("*.ckpt")), SUITE),
    "debug=overfit": (["trainer.max_epochs=2"], lambda run: _metrics(run)["val/samples"] == 3 * BATCH, SUITE),
    "debug=limit": ([], lambda run: _net(run)["global_step"] == 2 * int(0.1 * EPOCH), SUITE),
    "debug=profiler": (FEW_BATCHES, lambda run: "Action" in (run / "fit-profile.txt").read_text(), SUITE),
    "strategy=ddp_spawn": (
        [*FEW_BATCHES, "trainer.devices=2", "trainer.max_epochs=1"],
        # Each sample counted once: the ranks' metric states are their own (the module's setup resets them).
        lambda run: _net(run)["global_step"] == 4 and _metrics(run)["test/samples"] == 2 * BATCH,
        SUITE,
    ),
}  # the example's own options (experiment/, model/scheduler/, its module's compile): tests/test_model.py


@pytest.mark.slow
@pytest.mark.parametrize("option", OPTION_RUNS)
def test_every_option_that_changes_a_run_runs(option: str, tmp_path: Path) -> None:
    shrunk, check, task = OPTION_RUNS[option]
    if option.startswith("strategy="):  # Lightning starts the ranks from the script: a process of its own
        command = [option, *shrunk, "logger=none", f"hydra.run.dir={tmp_path}"]
        result = run_script("train.py", *command, timeout=400, task=task)
        assert result.returncode == 0, result.stderr[-3000:]
    else:
        train(compose_config("train", tmp_path, [option, *shrunk, "logger=none"], task=task))
    assert check(tmp_path), sorted(p.name for p in tmp_path.rglob("*"))


@pytest.mark.slow
def test_a_minimised_monitor_picks_the_job_with_the_lowest_metric(tmp_path: Path) -> None:
    lrs = "model.optimizer.lr=1e-3,1e-1"  # the second ends with the higher loss
    low = ["monitor=val/loss", "mode=min", *FEW_BATCHES, "trainer.max_epochs=2"]
    result = run_script("train.py", "-m", lrs, *low, "logger=none", f"paths.log_dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    (sweep,) = (tmp_path / "train" / "multiruns").iterdir()
    losses = {job: _metrics(sweep / job)["val/loss_best"] for job in ("0", "1")}
    for job in ("0", "1"):  # the best of the run's validations: the lower
        metrics, (best,) = _metrics(sweep / job), run_folder.checkpoints(sweep / job).glob("epoch*.ckpt")
        assert metrics["val/loss_best"] <= metrics["val/loss"] and f"{losses[job]:.4g}" in best.name
    best = min(losses, key=losses.get)
    assert f"Best: job {best}, val/loss_best={losses[best]:.6g}: {sweep / best}" in result.stdout


def test_the_options_a_defaults_comment_lists_are_the_groups_files() -> None:
    """``- strategy: auto  # auto | ddp | ...``: a list of options in a comment names every file of the group's
    folder and no other, so it cannot go stale when an option is added or removed."""
    listed = 0
    for config in (ROOT / "conf").glob("*.yaml"):
        for group, options in re.findall(r"(?m)^  - (\w+): \S+ +# ([\w ]+(?:\| *\w+ *)+)", config.read_text()):
            named = {option.strip() for option in options.split("|")}
            files = {path.stem for path in (ROOT / "conf" / group).glob("*.yaml")}
            assert named == files, f"{config.name}'s comment on {group}: {sorted(named ^ files)}"
            listed += 1
    assert listed >= 3  # strategy, logger, debug: the check reads real comments


@pytest.mark.parametrize(
    "override,off",
    [
        ("strategy=null", "~strategy"),  # the framework's groups: there whatever the task
        ("+strategy=~", "~strategy"),
        ("logger=null", "logger=none"),
    ],
)
def test_a_group_set_to_null_is_answered_with_how_to_switch_it_off(override: str, off: str) -> None:
    group = override.partition("=")[0].lstrip("+")
    with pytest.raises(InputError, match=re.escape(f"to switch {group} off, write {off}")):
        checks.group_set_to_null(["train.py", "debug=fdr", override], CONF)
    checks.group_set_to_null(["train.py", off, "trainer.profiler=null", "ckpt_path=null"], CONF)  # these work


@pytest.mark.slow
def test_an_entry_point_refuses_a_group_set_to_null_in_one_line(tmp_path: Path) -> None:
    for script in ("train.py", "eval.py"):
        result = run_script(script, "hydra/launcher=null", f"paths.log_dir={tmp_path}", timeout=60)
        assert result.returncode == 1 and "Traceback" not in result.stderr
        assert result.stderr.strip() == (
            "Error: hydra/launcher=null: a group's choice is a file of conf/hydra/launcher/; to switch "
            "hydra/launcher off, write ~hydra/launcher"
        )


@pytest.mark.parametrize(
    "devices,cores,free_gb,refused",
    [
        (2, 2, 20, None),
        (4, 2, 20, None),  # the README's trainer.devices=4 on a 2-core machine: a warning
        (5, 2, 20, "lower trainer.devices (at most 4 here)"),
        (64, 2, 20, "lower trainer.devices (at most 4 here)"),
        (8, 16, 1, "lower trainer.devices"),  # 8 copies of this process do not fit in 1 GB
    ],
)
def test_cpu_processes_past_the_cores_are_warned_of_and_past_twice_or_the_memory_refused(
    devices: int, cores: int, free_gb: int, refused: str | None, monkeypatch, caplog, tmp_path: Path
) -> None:
    monkeypatch.setattr(checks, "_cores", lambda: cores)
    monkeypatch.setattr(checks, "_available_bytes", lambda: free_gb * 2**30)
    cfg = compose_config("train", tmp_path, [f"trainer.devices={devices}", "strategy=ddp", "trainer.accelerator=cpu"])
    processes = devices
    with caplog.at_level(logging.WARNING):
        if refused:
            with pytest.raises(InputError) as error:
                checks.check_cpu_processes(cfg)
            assert f"starts {processes} processes on this machine's {cores} CPU cores" in str(error.value)
            assert f"{free_gb:.1f} GB of memory available" in str(error.value) and refused in str(error.value)
            cfg.allow_cpu_oversubscription = True  # insisting: the same numbers, as a warning
            checks.check_cpu_processes(cfg)
        else:
            checks.check_cpu_processes(cfg)
    warned = [r.getMessage() for r in caplog.records if "CPU cores" in r.getMessage()]
    assert len(warned) == (1 if processes > cores or refused else 0)


@pytest.mark.parametrize(
    "override,closest",
    [
        ("data.batch_sise=32", "data.batch_size"),  # the data module's argument
        ("trainer.max_epoch=3", "trainer.max_epochs"),  # Lightning's
        ("model.net.hiden=8", "model.net.hidden"),  # the network's: the user's own key
        ("callbacks.early_stopping.patiense=3", "callbacks.early_stopping.patience"),
        ("paths.data_dri=x", "paths.data_dir"),  # the project's schema
        ("model.optimizer.lrr=1e-3,1e-2", "model.optimizer.lr"),  # a sweep's values: its first job's
        ("model.optimizer.lrr=tag(log,interval(1e-4,1e-1))", "model.optimizer.lr"),  # Optuna's range
    ],
)
def test_a_key_value_typo_without_plus_gets_the_plus_forms_one_line_with_the_closest_key(
    override: str, closest: str
) -> None:
    from mnistlab.runtime.config import overrides

    with pytest.raises(
        InputError, match=rf"^{re.escape(override.partition('=')[0])} is not .*: did you mean {closest}\?$"
    ):
        overrides.refuse_unknown_keys(["train.py", *SUITE, override], ROOT / "conf", "train", schema.TrainConfig)


def test_overrides_the_config_has_are_left_to_hydra() -> None:
    from mnistlab.runtime.config import overrides

    optuna = ["-m", "hparams_search=mnist_optuna", "model.optimizer.lr=tag(log,interval(1e-4,1e-1))"]
    for argv in (
        ["trainer.max_epochs=3", "+trainer.max_time=null"],
        ["-m", "model.optimizer.lr=1e-3,3e-3"],
        optuna,
        [],
    ):
        overrides.refuse_unknown_keys(["train.py", *SUITE, *argv], ROOT / "conf", "train", schema.TrainConfig)
