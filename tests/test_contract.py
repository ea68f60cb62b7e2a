"""The contract of your task: what the machinery relies on of the data module, network and LightningModule
that conf/ composes by default (README: Make it yours; docs/make-it-yours.md). Run it first after replacing the example:

    pytest tests/test_contract.py

Nothing here knows the example: shapes, classes, metric names and keys come from your classes and
config (``monitor``, ``mode``). Each test says in its name what must hold; each failure, what to look at.
"""

import itertools
import math
import time
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from hydra.utils import instantiate
from lightning.fabric.utilities.apply_func import apply_to_collection
from lightning.pytorch.callbacks import ModelCheckpoint
from omegaconf import DictConfig
from torch import Tensor

from mnistlab.runtime.checkpointing.checkpoint_io import load_checkpoint
from mnistlab.runtime.run import run_folder
from mnistlab.tasks import evaluate, train

import fixed_batch
import processes
from composing import OWN, SHORT, compose_config
from fixed_batch import Repeated

pytestmark = pytest.mark.yours  # reads your task: pytest -m yours (docs/make-it-yours.md)

STEPS = 100  # optimizer steps on one fixed batch


def _own(name: str, out: Path, *overrides: str) -> DictConfig:
    return compose_config(name, out, [*overrides, "logger=none"], task=OWN)


def _first_batch(cfg: DictConfig) -> Any:
    """The data module's first training batch, as one process gets it (no trainer: the whole global batch)."""
    data = instantiate(cfg.data)
    data.prepare_data()
    data.setup("fit")
    return next(iter(data.train_dataloader()))


def _inputs(batch: Any) -> Any:
    """The inputs of a batch: its first element where it is a sequence (inputs, targets), else the batch."""
    return batch[0] if isinstance(batch, list | tuple) else batch


@pytest.fixture(scope="session")  # computed once a worker: see test_ray.cluster
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, float]]:
    """A short run of your task: its folder and its metrics."""
    out = tmp_path_factory.mktemp("own")
    return out, train(_own("train", out, *SHORT))


def test_a_fast_dev_run_goes_through_fit_validation_and_test(tmp_path: Path) -> None:
    cfg = _own("train", tmp_path, "debug=fdr")
    metrics = train(cfg)
    assert any(name.startswith("test/") for name in metrics), f"test_step logged no test/ metric: {sorted(metrics)}"
    assert cfg.monitor in metrics, f"monitor={cfg.monitor} (conf/run.yaml) is not among the logged {sorted(metrics)}"


def test_the_monitored_metric_is_logged_and_its_best_returned(trained) -> None:
    out, metrics = trained
    cfg = _own("train", out)
    assert math.isfinite(metrics[cfg.monitor]), f"{cfg.monitor}={metrics[cfg.monitor]}"
    assert metrics[cfg.optimized_metric] == pytest.approx(metrics[cfg.monitor])  # one epoch: its best is itself
    assert list(run_folder.checkpoints(out).glob("epoch*.ckpt")), "no best checkpoint: is monitor logged at validation?"


def _bare_trainer(steps: int, *callbacks: L.Callback) -> L.Trainer:
    """Training alone, on the CPU: no validation, logger, progress bar or checkpoint but those ``callbacks`` save."""
    return L.Trainer(
        accelerator="cpu",
        max_steps=steps,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=any(isinstance(callback, ModelCheckpoint) for callback in callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=list(callbacks),
    )


class _Losses(L.Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer: L.Trainer, module: L.LightningModule, outputs: Any, *args: Any) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.losses.append(float(loss))


def test_a_fixed_batch_is_overfit(tmp_path: Path) -> None:
    """The loss goes down on a batch it sees again and again: gradients reach the weights, the optimizer
    steps them, the loss is the one minimised."""
    cfg = _own("train", tmp_path)
    L.seed_everything(cfg.seed)
    batch, model, recorded = _first_batch(cfg), instantiate(cfg.model), _Losses()
    _bare_trainer(STEPS, recorded).fit(model, train_dataloaders=Repeated(batch, STEPS))
    first, last = recorded.losses[0], min(recorded.losses[-10:])
    # A tenth: a small network on noise falls that far (a CNN on random RGB images: 17% in 100 steps); a loss
    # that does not reach the weights (detached, the wrong tensor returned) does not move at all.
    assert last < 0.9 * first, f"the loss on one batch went from {first:.4g} to {last:.4g} in {STEPS} steps"


def test_a_checkpoint_reloads_to_identical_outputs(trained) -> None:
    out, _ = trained
    cfg = _own("train", out)
    (best,) = run_folder.checkpoints(out).glob("epoch*.ckpt")
    trained_model = instantiate(cfg.model)
    trained_model.load_state_dict(load_checkpoint(best)["state_dict"])
    reloaded = instantiate(cfg.model)  # as eval.py builds it: from conf/, weights from the file
    reloaded.load_state_dict(load_checkpoint(best)["state_dict"])
    inputs = _inputs(_first_batch(cfg))
    with torch.inference_mode():
        assert torch.equal(trained_model.eval()(inputs), reloaded.eval()(inputs))


def test_eval_tests_the_best_checkpoint_as_training_did(trained, tmp_path: Path) -> None:
    out, metrics = trained
    (best,) = run_folder.checkpoints(out).glob("epoch*.ckpt")
    limits = [o for o in SHORT if o.startswith("trainer.limit_test_batches")]
    evaluated = evaluate(_own("eval", tmp_path, f"ckpt_path={best}", *limits))
    tested = {name: value for name, value in metrics.items() if name.startswith("test/")}
    assert tested and {name: evaluated[name] for name in tested} == pytest.approx(tested, rel=1e-6)


@pytest.mark.slow
def test_two_ddp_processes_train_and_test_as_one(tmp_path: Path) -> None:
    """The same fixed global batch, on one process and split over two (tests/fixed_batch.py): the same
    weights after a few steps, if the loss is a mean over the batch and nothing else depends on the rank;
    then the same test metrics over the whole test split, if each sample is tested once on either."""
    # One process, in this one (the reference); two, as a user starts them (Lightning starts the second).
    fixed = ["+fixed.steps=5", f"+fixed.out={tmp_path / '1.pt'}", "trainer.devices=1"]
    fixed_batch.train(compose_config("train", tmp_path / "1", fixed, task=OWN))
    command = processes.python(
        "tests/fixed_batch.py", "trainer.devices=2", f"+fixed.out={tmp_path / '2.pt'}", "+fixed.steps=5",
        f"hydra.run.dir={tmp_path / '2'}",
    )  # fmt: skip
    result = processes.run(command, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    saved = {devices: torch.load(tmp_path / f"{devices}.pt", weights_only=True) for devices in (1, 2)}
    for name, value in saved[1]["state_dict"].items():
        if value.is_floating_point():
            weights = saved[2]["state_dict"][name]
            torch.testing.assert_close(weights, value, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
    one, two = saved[1]["tested"], saved[2]["tested"]
    assert one and two == pytest.approx(one, rel=1e-4, abs=1e-6), (
        f"tested on two ranks {two}, on one process {one}: does the test loader repeat samples on some rank "
        "(Lightning's DistributedSampler pads a split that does not divide; runtime/data/in_memory.py and "
        "runtime/data/streaming.py do not), or does a test metric not reduce over the ranks (sync_dist, torchmetrics)?"
    )


class _Batches(L.Callback):
    """What each training step was given, as numbers: each tensor of the batch summed (its position kept)."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def on_train_batch_start(self, trainer: L.Trainer, module: L.LightningModule, batch: Any, *args: Any) -> None:
        self.seen.append(apply_to_collection(batch, Tensor, lambda t: t.detach().double().sum().item()))


def _resumable(loader: Any) -> bool:
    """Whether Lightning keeps a loader's place in a checkpoint: it has ``state_dict`` and ``load_state_dict``."""
    return callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None))


def test_a_run_resumed_mid_epoch_goes_on_with_the_batches_of_one_never_stopped(tmp_path: Path) -> None:
    """A run stopped after a few steps and resumed from its checkpoint trains on the batches a run never
    stopped trains on, if your training loader keeps its place (``state_dict``/``load_state_dict``: the
    in-memory and streaming data modules do); a plain ``DataLoader`` starts its epoch again, and Lightning
    says so when it resumes."""
    cfg = _own("train", tmp_path, "test=false")
    steps = 3
    never_stopped, stopped, resumed = _Batches(), _Batches(), _Batches()
    saving = ModelCheckpoint(tmp_path, "stopped", every_n_train_steps=steps)  # as a run saves: within the step
    for trainer in (_bare_trainer(2 * steps, never_stopped), _bare_trainer(steps, stopped, saving)):
        L.seed_everything(cfg.seed)
        trainer.fit(instantiate(cfg.model), datamodule=instantiate(cfg.data))
    L.seed_everything(cfg.seed)
    trainer = _bare_trainer(2 * steps, resumed)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        trainer.fit(instantiate(cfg.model), datamodule=instantiate(cfg.data), ckpt_path=tmp_path / "stopped.ckpt")
    if _resumable(trainer.train_dataloader):
        assert stopped.seen + resumed.seen == never_stopped.seen, (
            "resumed from a checkpoint of step 3, your training loader gave other batches than in a run never "
            "stopped: does its load_state_dict restore the place its state_dict gave (and the epoch's order)?"
        )
    else:
        assert any("not resumable" in str(warning.message) for warning in said), [str(w.message) for w in said]


class _StepTimes(L.Callback):
    def __init__(self) -> None:
        self.times: list[float] = []

    def on_train_batch_end(self, *args: Any) -> None:
        self.times.append(time.perf_counter())


def test_the_training_loader_keeps_up_with_training(tmp_path: Path, capsys) -> None:
    """What a step of your task costs: batches per second of the training loader alone, against training
    steps per second (each fetching its batch). Priced, not judged: where fetching takes half a step or
    more, a warning says so, with the usual remedies."""
    cfg = _own("train", tmp_path, *SHORT[:2], "test=false")
    data = instantiate(cfg.data)
    data.prepare_data()
    data.setup("fit")
    batches = itertools.islice(data.train_dataloader(), 50)
    started = time.perf_counter()
    count = sum(1 for batch in batches if apply_to_collection(batch, Tensor, lambda t: t.sum()) is not None)
    loading = count / (time.perf_counter() - started)
    L.seed_everything(cfg.seed)
    steps = _StepTimes()
    _bare_trainer(50, steps).fit(instantiate(cfg.model), datamodule=instantiate(cfg.data))
    training = (len(steps.times) - 1) / (steps.times[-1] - steps.times[0])
    share = training / loading
    line = (
        f"your training loader: {loading:,.0f} batches/s alone; training: {training:,.0f} steps/s, of which "
        f"fetching the batch takes about {share:.0%}"
    )
    with capsys.disabled():
        print(f"\n{line}")
    if share >= 0.5:
        warnings.warn(
            f"{line}: the loader is the bottleneck; try num_workers>0 with persistent_workers=True, pin_memory=True "
            "on a GPU, or hold the data in memory (runtime/data/in_memory.py: InMemoryDataModule)",
            stacklevel=1,
        )
    assert count == 50 or count == len(data.train_dataloader())
