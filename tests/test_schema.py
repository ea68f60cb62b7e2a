"""Every key of conf/ is typed: a wrong value is refused in one line, before torch is imported."""

import os
from pathlib import Path

import pytest

from mnistlab.runtime.config import schema
from mnistlab.runtime.run.failures import InputError

import processes
from composing import compose_config
from running import run_script

REFUSED = [
    (["trainer.max_epochs=abc"], "trainer.max_epochs=abc: should be a valid integer"),
    (["trainer.max_epochs=-5"], "trainer.max_epochs=-5: should be greater than or equal to -1"),
    (["trainer.max_epochs=10.0"], "trainer.max_epochs=10.0: should be a valid integer"),
    (["trainer.precision=fp8"], "trainer.precision=fp8: should be '32-true', '32', 32, 'bf16-mixed', '16-mixed', "),
    (["model.optimizer.lr=0"], "model.optimizer.lr=0: should be greater than 0"),
    (["trainer.devices=3"], "data.batch_size=32 is the global batch (all devices of all nodes) and must be a multiple"),
    (["trainer.devices=abc"], "trainer.devices=abc: should be a valid integer or 'auto' or -1 or a valid list"),
    (["+trainer.foo=1"], "trainer.foo is not an argument of lightning.pytorch.Trainer: it takes accelerator, "),
    (["+trainer.max_epoch=1"], "trainer.max_epoch is not an argument of lightning.pytorch.Trainer: did you mean "),
    (["+callbacks.early_stopping.patince=1"], "callbacks.early_stopping.patince is not an argument of lightning."),
    (["test=yes"], "test=yes: should be a valid boolean"),
    (["trainer.limit_train_batches=1.5"], "trainer.limit_train_batches=1.5: should be less than or equal to 1 or "),
    (["strategy=ddp", "trainer.strategy.start_method=x"], "trainer.strategy.start_method=x: should be 'popen', "),
    (["callbacks.early_stopping.patience=-1"], "callbacks.early_stopping.patience=-1: should be greater than or"),
    (["callbacks.safe_stop.check_every_n_steps=0"], "callbacks.safe_stop.check_every_n_steps=0: should be greater"),
]


@pytest.mark.parametrize("overrides,message", REFUSED)
def test_a_wrong_value_is_refused_naming_key_value_and_what_is_allowed(overrides, message, tmp_path) -> None:
    with pytest.raises(InputError) as refused:
        schema.check(compose_config("train", tmp_path, overrides), schema.TrainConfig)
    assert str(refused.value).startswith(message)
    assert "\n" not in str(refused.value)


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
        ("train.py", ["trainer.max_epochs=abc"], "Error: trainer.max_epochs=abc: should be a valid integer"),
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
