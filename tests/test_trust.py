"""A checkpoint, an image, a run folder are data (docs/reliability.md, Trust): none of them makes this project run
code. Each payload below would create a marker file if it ran; every entry point refuses it in one
line, and the marker never appears."""

import importlib
import shutil
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig, OmegaConf

from mnistlab.runtime.checkpointing import resume
from mnistlab.runtime.config import schema
from mnistlab.runtime.run import run_folder
from mnistlab.runtime.run.failures import InputError
from mnistlab.trained import loading

from composing import SHORT, TRUSTED, compose_config
from payloads import MARKER, config_payloads
from running import run_script


def test_no_config_payload_builds_a_network(trained_checkpoint: Path, tmp_path: Path) -> None:
    checkpoint = torch.load(trained_checkpoint, weights_only=True)
    for payload in config_payloads(tmp_path / MARKER):
        checkpoint["config"]["model"]["net"] = payload
        with pytest.raises(InputError, match="a checkpoint is data and may not choose code to run"):
            loading.network(checkpoint)
    assert not (tmp_path / MARKER).exists()


def test_no_config_payload_builds_a_data_module(trained_checkpoint: Path, tmp_path: Path) -> None:
    checkpoint = torch.load(trained_checkpoint, weights_only=True)
    checkpoint["config"]["data"] = config_payloads(tmp_path / MARKER)[1]
    with pytest.raises(InputError, match="is not a LightningDataModule class of mnistlab"):
        loading.datamodule(checkpoint, data_dir=str(tmp_path))
    assert not (tmp_path / MARKER).exists()


def test_the_trained_network_and_its_own_layers_still_load(trained_checkpoint: Path) -> None:
    checkpoint = torch.load(trained_checkpoint, weights_only=True)
    assert isinstance(loading.network(checkpoint, TRUSTED), torch.nn.Module)  # the suite's network, trusted
    checkpoint["config"]["model"]["net"] = {
        "_target_": "torch.nn.Sequential",
        "_args_": [{"_target_": "torch.nn.Flatten"}],
    }
    checkpoint["state_dict"] = {}
    assert isinstance(loading.network(checkpoint)[0], torch.nn.Flatten)  # torch.nn's classes are allowed


# What each entry point runs once Hydra has composed its config: its schema's check, then its task (eval.py,
# export.py, serve.py, train.py; predict.py's: test_prediction.py). Called here as the script calls it; the
# script prints a refusal as it prints every InputError, in one line (the subprocess test below).
ENTRY_POINTS = {
    "eval": (schema.EvalConfig, "mnistlab.tasks:evaluate"),
    "export": (schema.ExportConfig, "mnistlab.trained.exporting:export"),
    "serve": (schema.ServeConfig, "mnistlab.trained.serving.server:serve"),
    "train": (schema.TrainConfig, "mnistlab.tasks:train"),
}


def _entry_point(name: str, cfg: DictConfig) -> None:
    config, task = ENTRY_POINTS[name]
    schema.check(cfg, config)
    module, _, function = task.partition(":")
    getattr(importlib.import_module(module), function)(cfg)


def test_every_entry_point_refuses_a_malicious_checkpoint(payload_checkpoint, pickle_checkpoint, tmp_path) -> None:
    runs = {
        "export, config payload": ("export", payload_checkpoint),
        "export, pickle": ("export", pickle_checkpoint),
        "serve, config payload": ("serve", payload_checkpoint),
        "serve, pickle": ("serve", pickle_checkpoint),
        "eval, pickle": ("eval", pickle_checkpoint),
        "train, pickle": ("train", pickle_checkpoint),
        "train, a URL": ("train", "http://127.0.0.1:9/x.ckpt"),
    }
    for name, (entry_point, checkpoint) in runs.items():
        out = tmp_path / "out" / name.replace(", ", "-").replace(" ", "_")
        cfg = compose_config(entry_point, out, [f"ckpt_path={checkpoint}", *(SHORT if entry_point == "train" else [])])
        with pytest.raises(InputError) as refused:
            _entry_point(entry_point, cfg)
        assert "weights_only" not in str(refused.value), name  # no advice to unpickle
        assert not (tmp_path / MARKER).exists(), f"{name}: the payload ran"
        assert not run_folder.checkpoints(out).exists(), name  # the refused run trained nothing


@pytest.mark.slow
def test_a_script_given_a_malicious_checkpoint_says_why_in_one_line(pickle_checkpoint: Path, tmp_path: Path) -> None:
    result = run_script("train.py", f"ckpt_path={pickle_checkpoint}", *SHORT, f"paths.log_dir={tmp_path / 'out'}")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and lines and lines[-1].startswith("Error: "), result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "weights_only" not in result.stderr
    assert not (tmp_path / MARKER).exists()
    assert not any((tmp_path / "out" / "train" / "runs").iterdir())  # the refused run left no folder behind


@pytest.mark.slow
def test_resume_refuses_a_pickled_last_checkpoint_and_planted_overrides(
    pickle_checkpoint: Path, tmp_path: Path
) -> None:
    run = tmp_path / "planted"
    (run / ".hydra").mkdir(parents=True)
    run_folder.checkpoints(run).mkdir()
    shutil.copy(pickle_checkpoint, run_folder.last_checkpoint(run))
    (run / ".hydra" / "overrides.yaml").write_text("- trainer.max_epochs=1\n")
    result = run_script("train.py", f"resume={run}", *SHORT, timeout=240)
    assert result.returncode == 1 and result.stderr.strip().splitlines()[-1].startswith("Error: "), result.stderr
    assert "is not a readable checkpoint" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / MARKER).exists()
    assert not (run / ".hydra" / "resumes").exists()  # a refused resume adds nothing to the run's history


def test_resume_replays_no_override_that_could_run_code(tmp_path: Path) -> None:
    (tmp_path / ".hydra").mkdir()
    run_folder.checkpoints(tmp_path).mkdir()
    torch.save({"state_dict": {}}, run_folder.last_checkpoint(tmp_path))
    planted = [
        "model.net.hidden=64",
        "+callbacks.evil._target_=builtins.exec",
        "+callbacks.evil._args_=['open(1)']",
        "+callbacks.evil.note=x",  # the rest of a refused node goes with it
        "trainer.plugins=[{_target_:faults.HangAt,step:5}]",
        "callbacks.safe_stop=${oc.decode:'{a: 1}'}",
        "hydra.job_logging.root.level=DEBUG",
        "+model.optimizer.momentum=0.9",
    ]
    OmegaConf.save(OmegaConf.create(planted), tmp_path / ".hydra" / "overrides.yaml")
    argv = resume.expand(["train.py", f"resume={tmp_path}"])
    assert argv[1:3] == ["model.net.hidden=64", "+model.optimizer.momentum=0.9"]
    assert resume.refused == planted[1:7]


def test_lightnings_own_loading_reads_checkpoints_as_data(pickle_checkpoint: Path, tmp_path: Path) -> None:
    """fit(ckpt_path=...), test(ckpt_path=...) and resuming all load through trainer.plugins' reader."""
    from mnistlab.runtime.checkpointing.checkpoint_io import AtomicCheckpointIO

    reader = AtomicCheckpointIO()
    with pytest.raises(InputError, match="is not a readable checkpoint"):
        reader.load_checkpoint(pickle_checkpoint, weights_only=False)  # Lightning's fallback, refused
    with pytest.raises(InputError, match="checkpoints are read from local files only"):
        reader.load_checkpoint("https://example.invalid/model.ckpt")
    assert not (tmp_path / MARKER).exists()
