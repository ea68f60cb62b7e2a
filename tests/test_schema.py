"""Every key of conf/ is typed: a wrong value is refused in one line, before torch is imported."""

import os
from pathlib import Path

import pytest

from mnistlab.runtime.config import bounds, schema, signatures
from mnistlab.runtime.run.failures import InputError

import processes
from composing import compose_config
from running import run_script

TRAINER = "(lightning.pytorch.Trainer)"
REFUSED = [
    (["trainer.max_epochs=abc"], f"trainer.max_epochs=abc: should be an integer or null {TRAINER}"),
    # callbacks.safe_stop.check_every_n_steps copies it, and comes first: the key given is named, not its copy
    (["trainer.log_every_n_steps=abc"], f"trainer.log_every_n_steps=abc: should be an integer or null {TRAINER}"),
    (["trainer.max_epochs=-5"], f"trainer.max_epochs=-5: should be at least -1 {TRAINER}"),
    (["trainer.max_epochs=10.0"], f"trainer.max_epochs=10.0: should be an integer or null {TRAINER}"),
    (["trainer.precision=fp8"], "trainer.precision=fp8: should be 64 or 32 or 16 or 'transformer-engine' or "),
    (["model.optimizer.lr=0"], "model.optimizer.lr=0: should be greater than 0 (torch.optim.Adam)"),
    (["trainer.devices=3"], "data.batch_size=32 is the global batch (all devices of all nodes) and must be a multiple"),
    (["trainer.devices=0"], f"trainer.devices=0: should be at least 1, or -1 (all of them) {TRAINER}"),
    (["trainer.devices=1.5"], f"trainer.devices=1.5: should be a list or a string or an integer {TRAINER}"),
    (["+trainer.foo=1"], "trainer.foo is not an argument of lightning.pytorch.Trainer: it takes accelerator, "),
    (["+trainer.max_epoch=1"], "trainer.max_epoch is not an argument of lightning.pytorch.Trainer: did you mean "),
    (["+callbacks.early_stopping.patince=1"], "callbacks.early_stopping.patince is not an argument of lightning."),
    (["test=yes"], "test=yes: should be a valid boolean"),
    (["trainer.limit_train_batches=1.5"], "trainer.limit_train_batches=1.5: should be a fraction from 0.0 to 1.0 or a"),
    (["trainer.deterministic=sometimes"], "trainer.deterministic=sometimes: should be true or false or 'warn' "),
    (["strategy=ddp", "trainer.strategy.start_method=x"], "trainer.strategy.start_method=x: should be 'popen' or "),
    (["callbacks.early_stopping.patience=-1"], "callbacks.early_stopping.patience=-1: should be at least 0"),
    (["callbacks.model_checkpoint.save_top_k=-2"], "callbacks.model_checkpoint.save_top_k=-2: should be at least -1"),
    (["callbacks.safe_stop.check_every_n_steps=0"], "callbacks.safe_stop.check_every_n_steps=0: should be at least 1"),
    (
        ["engine=ray", "engine.scaling_config.num_workers=0"],
        "engine.scaling_config.num_workers=0: should be at least 1",
    ),
    (["engine=ray", "engine.torch_config.timeout_s=soon"], "engine.torch_config.timeout_s=soon: should be an integer"),
]


@pytest.mark.parametrize("overrides,message", REFUSED)
def test_a_wrong_value_is_refused_naming_key_value_and_what_is_allowed(overrides, message, tmp_path) -> None:
    with pytest.raises(InputError) as refused:
        schema.check(compose_config("train", tmp_path, overrides), schema.TrainConfig)
    assert str(refused.value).startswith(message)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("owner", sorted(bounds.RANGES))
def test_each_range_names_an_argument_its_class_still_takes(owner: str) -> None:
    """A release that renames an argument (or moves the class) fails here, not silently unchecked."""
    signature = signatures.read(owner)
    if signature is None:  # a package: each of its classes with the argument
        assert signatures.read(f"{owner}.SGD") is not None, f"{owner} lists no class"
        classes = [signatures.read(f"{owner}.{name}") for name in ("SGD", "Adam", "AdamW")]
        assert all(set(bounds.RANGES[owner]) <= set(c.parameters) for c in classes if c)
        return
    assert set(bounds.RANGES[owner]) <= set(signature.parameters), signature.describe()
    assert signatures.ranges(owner) == bounds.RANGES[owner]


def test_a_range_reaches_a_subclass_that_keeps_the_constructor_and_a_package_s_classes() -> None:
    assert signatures.ranges("mnistlab.runtime.checkpointing.top_k.TopKCheckpoint")["save_top_k"].description == (
        "at least -1"
    )
    assert set(signatures.ranges("torch.optim.AdamW")) == {"lr"}
    assert signatures.ranges("lightning.pytorch.callbacks.LearningRateMonitor") == {}


def test_a_missing_value_is_asked_for(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"^ckpt_path needs a value: pass ckpt_path=\.\.\. on the command line$"):
        schema.check(compose_config("eval", tmp_path), schema.EvalConfig)


def test_evaluation_takes_a_batch_that_does_not_divide(tmp_path: Path) -> None:
    """Training refuses a global batch that 3 processes cannot share; evaluation counts every sample anyway."""
    with pytest.raises(InputError, match="is the global batch"):
        schema.check(compose_config("train", tmp_path, ["trainer.devices=3"]), schema.TrainConfig)
    schema.check(compose_config("eval", tmp_path, ["ckpt_path=x.ckpt", "trainer.devices=3"]), schema.EvalConfig)


@pytest.mark.slow
@pytest.mark.parametrize(
    "script,overrides,message",
    [
        (
            "train.py",
            ["trainer.max_epochs=abc"],
            "Error: trainer.max_epochs=abc: should be an integer or null (lightning.pytorch.Trainer)",
        ),
        ("eval.py", [], "Error: ckpt_path needs a value: pass ckpt_path=... on the command line"),
        ("train.py", ["modle.optimizer.lr=1"], "Could not override 'modle.optimizer.lr'"),
        ("train.py", ["strategy=nope"], "Could not find 'strategy/nope'"),
    ],
)
def test_config_errors_are_answered_without_importing_torch(script, overrides, message, tmp_path) -> None:
    """A torch that cannot be imported: the answer must come before anything tries."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('torch imported')")
    command = processes.python(script, *overrides, f"paths.log_dir={tmp_path / 'out'}")
    result = processes.run(command, env=os.environ | {"PYTHONPATH": str(tmp_path)}, timeout=60)
    assert result.returncode == 1
    assert message in result.stderr
    assert "torch imported" not in result.stderr and "Traceback" not in result.stderr
    assert not list((tmp_path / "out").rglob("*.log"))  # nothing left of the refused run


@pytest.mark.slow
def test_hydra_full_error_shows_the_whole_traceback(tmp_path: Path) -> None:
    command = processes.python("train.py", "trainer.max_epochs=abc", f"paths.log_dir={tmp_path}")
    result = processes.run(command, env=os.environ | {"HYDRA_FULL_ERROR": "1"}, timeout=60)
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr and "trainer.max_epochs" in result.stderr


@pytest.mark.slow
def test_an_output_folder_that_cannot_be_written_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("in the way")
    result = run_script("train.py", f"paths.log_dir={tmp_path / 'file' / 'out'}", timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip().startswith(f"Error: cannot write the output folder {tmp_path / 'file' / 'out'}")
    assert "(Not a directory); point paths.log_dir at a folder you can write to" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
