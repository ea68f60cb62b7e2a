# Part of the MNIST example: a project generated without it has no such file.
import json
from pathlib import Path

import lightning as L
import pytest
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from mnistlab.network import SimpleNN
from mnistlab.runtime.data.in_memory import PAD_LABEL
from mnistlab.runtime.run import run_folder

from composing import OWN, SHORT, compose_config

pytestmark = pytest.mark.yours  # reads your task: pytest -m yours (docs/make-it-yours.md)


@pytest.fixture
def train_cfg(tmp_path: Path) -> DictConfig:
    """The example's own model (what conf/ composes by default), in a short run's config."""
    return compose_config("train", tmp_path, [*SHORT, "logger=csv"], task=OWN)


def test_simple_nn_is_the_seed_network() -> None:
    net = SimpleNN()
    layers = list(net.layers)
    assert [type(layer) for layer in layers] == [nn.Linear, nn.ReLU, nn.Linear]
    assert (layers[0].in_features, layers[0].out_features) == (784, 256)
    assert (layers[2].in_features, layers[2].out_features) == (256, 10)
    assert net(torch.randn(5, 1, 28, 28)).shape == (5, 10)


def test_one_step_lowers_the_loss_on_a_fixed_batch(train_cfg) -> None:
    torch.manual_seed(0)
    model = instantiate(train_cfg.model)
    x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))
    with torch.no_grad():
        before = nn.functional.cross_entropy(model(x), y)
    trainer = L.Trainer(
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        limit_val_batches=0,
    )
    trainer.fit(model, train_dataloaders=DataLoader(TensorDataset(x, y), batch_size=64))
    with torch.no_grad():
        after = nn.functional.cross_entropy(model(x), y)
    assert trainer.global_step == 1 and after < before


def test_padding_rows_count_in_no_loss_or_metric(train_cfg) -> None:
    model = instantiate(train_cfg.model)
    model.trainer = L.Trainer(logger=False, accelerator="cpu")  # attached, not fitting
    x, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    padded_y = y.clone()
    padded_y[6:] = PAD_LABEL
    model.on_train_start()
    loss = model.training_step((x, padded_y), 0)
    expected = nn.functional.cross_entropy(model(x[:6]), y[:6], reduction="sum") / 8
    torch.testing.assert_close(loss, expected)
    loss_sum, rows = model.train_sums
    assert rows == 6
    torch.testing.assert_close(loss_sum / rows, expected * 8 / 6)
    model.validation_step((x, padded_y), 0)
    logits = model(x[:6])
    torch.testing.assert_close(model.val_metrics["acc"].compute(), (logits.argmax(1) == y[:6]).float().mean())
    torch.testing.assert_close(model.val_metrics["loss"].compute(), nn.functional.cross_entropy(logits, y[:6]))


@pytest.mark.parametrize("scheduler,cls", [("cosine", "CosineAnnealingLR"), ("plateau", "ReduceLROnPlateau")])
def test_scheduler_group_plugs_into_the_optimizer(scheduler: str, cls: str, tmp_path: Path) -> None:
    cfg = compose_config("train", tmp_path, [f"model/scheduler={scheduler}", "model.optimizer.lr=0.01"], task=OWN)
    optimizers = instantiate(cfg.model).configure_optimizers()
    assert optimizers["optimizer"].param_groups[0]["lr"] == 0.01
    assert type(optimizers["lr_scheduler"]["scheduler"]).__name__ == cls


# The example's options that change what its run does, run shrunk, and what each promises read back.
FEW_BATCHES = ["trainer.limit_train_batches=4", "trainer.limit_val_batches=2", "trainer.limit_test_batches=2"]
EXAMPLE_OPTIONS = {
    "experiment=cosine_wide": (
        [*FEW_BATCHES, "trainer.max_epochs=1"],
        lambda run: _last(run)["state_dict"]["net.layers.0.weight"].shape == (512, 784),
    ),
    "model.compile=true": (
        ["debug=fdr"],
        lambda run: json.loads((run / "metrics.json").read_text())["test/samples"] == 64,
    ),
    "model/scheduler=plateau": (
        [*FEW_BATCHES, "trainer.max_epochs=2"],
        lambda run: _last(run)["lr_schedulers"][0]["patience"] == 1,
    ),
}


def _last(run: Path) -> dict:
    return torch.load(run_folder.last_checkpoint(run), weights_only=True)


@pytest.mark.slow  # training, in this process: as long as a slow test's
@pytest.mark.parametrize("option", EXAMPLE_OPTIONS)
def test_the_examples_options_change_its_run_as_they_say(option: str, tmp_path: Path) -> None:
    from mnistlab.tasks import train  # not at import: see tests/faults.py

    shrunk, check = EXAMPLE_OPTIONS[option]
    train(compose_config("train", tmp_path, [option, *shrunk, "logger=none"], task=OWN))
    assert check(tmp_path), sorted(p.name for p in tmp_path.rglob("*"))
