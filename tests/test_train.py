import re
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import pytest
import torch
from hydra.utils import instantiate

from mnistlab.runtime.checkpointing.checkpoint_io import AtomicCheckpointIO, load_checkpoint
from mnistlab.runtime.run import run_folder
from mnistlab.runtime.run.failures import InputError
from mnistlab.tasks import evaluate, train
from mnistlab.trained import loading

import onnx_models
import processes
import running
from composing import SHORT, SUITE_DATA, TRUSTED, compose_config
from running import run_script


def _best_checkpoint(out: Path) -> Path:
    (best,) = [p for p in run_folder.checkpoints(out).glob("*.ckpt") if p.name != "last.ckpt"]
    return best


def test_train_logs_every_metric_and_saves_plain_checkpoints(train_cfg, tmp_path: Path) -> None:
    metrics = train(train_cfg)
    for key in ("train/loss", "val/loss", "val/acc", "val/acc_best", "test/loss", "test/acc"):
        assert key in metrics
    chance = 1 / train_cfg.model.net.classes  # the suite's task (tests/suite_task.py)
    assert metrics["val/acc"] > 2 * chance and metrics["test/acc"] > 2 * chance  # 20 steps of Adam learned
    checkpoint = torch.load(_best_checkpoint(tmp_path), weights_only=True)  # no pickled objects inside
    assert checkpoint["config"]["model"]["optimizer"]["lr"] == train_cfg.model.optimizer.lr
    assert (run_folder.last_checkpoint(tmp_path)).is_file()
    assert (tmp_path / "csv" / "metrics.csv").is_file()


def test_cpu_runs_do_not_probe_for_gpus_at_every_optimizer_step(train_cfg, monkeypatch) -> None:
    # Lightning's NVML-based CUDA check makes Adam re-open libnvidia-ml at each step() of a CPU run.
    monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # as importing Lightning sets it
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    probes = []
    probe = torch.cuda._raw_device_count_nvml
    monkeypatch.setattr(torch.cuda, "_raw_device_count_nvml", lambda: probes.append(1) or probe())
    train(train_cfg)  # 20 optimizer steps
    assert len(probes) < 5, f"{len(probes)} NVML probes: one per step"


def test_a_wrong_matmul_precision_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="float32_matmul_precision=fast: one of highest, high"):
        train(compose_config("train", tmp_path, [*SHORT, "float32_matmul_precision=fast"]))


@pytest.mark.slow
def test_eval_of_the_best_checkpoint_matches_the_end_of_training(tmp_path: Path) -> None:
    cfg = compose_config("train", tmp_path / "train", [*SHORT[:3], "logger=none"])  # the whole test set
    trained = train(cfg)
    best = _best_checkpoint(tmp_path / "train")
    evaluated = evaluate(compose_config("eval", tmp_path / "eval", [f"ckpt_path={best}"]))
    assert evaluated["test/acc"] == trained["test/acc"]
    assert evaluated["test/loss"] == pytest.approx(trained["test/loss"], rel=1e-6)


def test_eval_refuses_missing_and_corrupt_checkpoints(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        evaluate(compose_config("eval", tmp_path, [f"ckpt_path={tmp_path / 'nope.ckpt'}"]))
    corrupt = tmp_path / "corrupt.ckpt"
    corrupt.write_bytes(b"PK\x03\x04 not really a checkpoint")
    with pytest.raises(InputError, match="not a readable checkpoint"):
        evaluate(compose_config("eval", tmp_path, [f"ckpt_path={corrupt}"]))


def test_a_checkpoint_of_another_model_is_refused_naming_the_layer(train_cfg, tmp_path: Path) -> None:
    """eval.py and train.py ckpt_path= with a model of other settings; a checkpoint whose own config and
    weights disagree (predict, export, serve): one line naming the first layer and both shapes."""
    train(train_cfg)
    best = _best_checkpoint(tmp_path)
    layer = r"its weights do not fit the model: (net\.)?\S+ is \(\d+(, \d+)*\) in the checkpoint and \(\d+(, \d+)*\) in the model"
    with pytest.raises(InputError, match=rf"^ckpt_path={re.escape(str(best))}: {layer}; use the model settings"):
        evaluate(compose_config("eval", tmp_path / "eval", [f"ckpt_path={best}", "model.net.hidden=32"]))
    run = tmp_path / "again"
    with pytest.raises(InputError, match=rf"^ckpt_path={re.escape(str(best))}: {layer}"):
        train(compose_config("train", run, [*SHORT, f"ckpt_path={best}", "model.net.hidden=32", "logger=tensorboard"]))
    assert not (run / "tensorboard").exists() and not run_folder.checkpoints(run).exists()  # refused before they write
    altered = torch.load(best, weights_only=True)
    altered["config"]["model"]["net"]["hidden"] = 32
    with pytest.raises(InputError, match=rf"^the checkpoint: {layer}; its saved config and its weights disagree"):
        loading.network(altered, TRUSTED)


def test_an_onnx_model_or_a_pickle_given_as_a_checkpoint_gets_no_advice_to_unpickle(
    pickle_checkpoint: Path, tmp_path: Path
) -> None:
    onnx = onnx_models.flattening(tmp_path / "model.onnx", ["N", 4])
    with pytest.raises(InputError, match=re.escape(f"ckpt_path={onnx} is an ONNX model: this takes a checkpoint")):
        evaluate(compose_config("eval", tmp_path / "eval", [f"ckpt_path={onnx}"]))
    with pytest.raises(InputError) as refused:
        load_checkpoint(pickle_checkpoint)
    assert str(refused.value) == (
        f"ckpt_path={pickle_checkpoint} is not a readable checkpoint: it holds objects other than tensors and plain "
        "values, which are never unpickled (a checkpoint is data)"
    )


@pytest.mark.slow
def test_train_and_eval_scripts_end_to_end(tmp_path: Path) -> None:
    trained = run_script("train.py", *SHORT, f"paths.log_dir={tmp_path}")
    assert trained.returncode == 0, trained.stderr[-3000:]
    (run,) = (tmp_path / "train" / "runs").iterdir()
    assert (run / ".hydra" / "config.yaml").is_file() and (run / "train.log").is_file()
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    console = trained.stdout + trained.stderr  # what a user needs, without Lightning's noise
    assert "Tested " in console and "GPU available:" in console
    for noise in ("Tip:", "TPU available", "Trainer already configured", "LeafSpec", "Traceback"):
        assert noise not in console
    assert "Tip:" in (run / "train.log").read_text()  # the log file keeps everything
    evaluated = run_script("eval.py", f"ckpt_path={_best_checkpoint(run)}", f"paths.log_dir={tmp_path}")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "test/acc=" in evaluated.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    "script,overrides,message",
    [
        ("eval.py", ["ckpt_path=/nonexistent.ckpt"], "Error: ckpt_path=/nonexistent.ckpt: no such file"),
        ("train.py", ["trainer.devices=3"], f"Error: data.batch_size={SUITE_DATA['batch_size']} is the global batch"),
        # A key=value typo, no +: the + form's one line, naming the closest key (Hydra: six, advising the typo).
        ("train.py", ["data.batch_sise=32"], "Error: data.batch_sise is not an argument of suite_task.Patterns: did"),
        ("eval.py", ["ckpt_path=x.ckpt", "trainer.max_epoch=3"], "did you mean trainer.max_epochs?"),
    ],
)
def test_bad_input_is_refused_with_a_clear_message(script: str, overrides: list[str], message: str, tmp_path) -> None:
    result = run_script(script, *overrides, f"paths.log_dir={tmp_path}", timeout=120)
    assert result.returncode != 0
    assert message in result.stderr
    assert "Traceback" not in result.stderr and result.stderr.strip().count("\n") == 0, result.stderr


def test_last_checkpoint_follows_every_epoch_without_improvement(tmp_path: Path) -> None:
    """With lr=0, val/acc never improves after epoch 0: last.ckpt must still be written at the end of
    each epoch (Lightning 2.6's save_last writes it only beside a new best, or when training ends)."""
    overrides = [*SHORT, "trainer.max_epochs=2", "model.optimizer.lr=0", "test=false", "logger=none"]
    train(compose_config("train", tmp_path, overrides))
    last = torch.load(run_folder.last_checkpoint(tmp_path), weights_only=True)
    assert (last["epoch"], last["global_step"]) == (1, 40)  # epoch 2 would mean: written after training


def test_a_checkpoint_write_cut_short_leaves_the_previous_file_whole(tmp_path: Path, monkeypatch) -> None:
    """A job killed while writing last.ckpt (a time limit, a preemption) must still find the last one."""
    path = run_folder.last_checkpoint(tmp_path)
    AtomicCheckpointIO().save_checkpoint({"global_step": 1}, path)

    def killed_mid_write(obj: object, file: BinaryIO) -> None:
        file.write(b"half a checkpoint")
        raise KeyboardInterrupt  # what SIGINT, or SLURM's signal before the kill, raises

    monkeypatch.setattr(torch, "save", killed_mid_write)
    with pytest.raises(KeyboardInterrupt):
        AtomicCheckpointIO().save_checkpoint({"global_step": 2}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=True)["global_step"] == 1
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]  # and no partial file left behind


def test_training_writes_checkpoints_through_the_atomic_writer(train_cfg) -> None:
    trainer = instantiate(train_cfg.trainer)
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)


def test_no_profiler_by_default_and_a_real_one_with_debug_profiler(tmp_path: Path) -> None:
    from lightning.pytorch.profilers import SimpleProfiler

    from mnistlab.runtime.reporting.profiler import NoProfiler

    default = instantiate(compose_config("train", tmp_path, SHORT).trainer)
    assert isinstance(default.profiler, NoProfiler)
    with default.profiler.profile("[Callback]x.on_train_batch_end"), default.profiler.profile("nested"):
        pass  # reusable, nestable: what Lightning does around every hook
    profiled = instantiate(compose_config("train", tmp_path, ["debug=profiler"]).trainer)
    assert isinstance(profiled.profiler, SimpleProfiler)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB file system (tmpfs): room for one 2.4 MB checkpoint, not two."""
    with running.small_disk(tmp_path / "disk", "4m") as disk:
        yield disk


@pytest.mark.slow
def test_a_full_disk_is_one_line_and_the_checkpoints_before_stay_whole(small_disk: Path) -> None:
    wide = "model.net.hidden=2200"  # a 2.4 MB checkpoint (weights and Adam's two moments): one fits, two do not
    result = run_script("train.py", *SHORT, wide, "logger=none", f"hydra.run.dir={small_disk}")
    last = run_folder.last_checkpoint(small_disk)
    assert result.returncode == 1
    message = result.stderr.strip()
    assert message.startswith(f"Error: cannot write the checkpoint {last}: no space left on its disk (")
    assert f"MiB free in {last.parent}). The checkpoints written before it are intact" in message
    assert "Traceback" not in message and "\n" not in message
    (best,) = run_folder.checkpoints(small_disk).glob("epoch*.ckpt")  # written first, whole
    assert torch.load(best, weights_only=True)["global_step"] == 20
    assert not last.exists() and not list(small_disk.rglob("*.partial"))


@pytest.mark.slow
def test_after_a_full_disk_a_resume_goes_on_from_the_newest_checkpoint_and_keeps_its_new_top_k(tmp_path: Path) -> None:
    """8 MiB, 2.4 MB checkpoints, the 3 best kept: epoch 1's best is written, its last.ckpt is not. The resume
    goes on from epoch 1's best (last.ckpt would train epoch 1 again, and write its best again as a -v1 copy),
    and save_top_k=1 given now deletes the best checkpoints beyond one, so the disk holds the rest of the run."""
    wide = [
        "model.net.hidden=2200",
        "logger=none",
        *SHORT,
        "trainer.max_epochs=3",
        "callbacks.model_checkpoint.save_top_k=3",
    ]
    with running.small_disk(tmp_path / "disk", "8m") as disk:
        command = processes.python("train.py", "trainer.accelerator=cpu", *wide, f"hydra.run.dir={disk}")
        stopped = processes.finish(processes.start(command), timeout=300)  # stdout and stderr as one terminal shows
        last = run_folder.last_checkpoint(disk)
        assert f"\nError: cannot write the checkpoint {last}: no space left on its disk" in stopped, stopped[-3000:]
        best = sorted(run_folder.checkpoints(disk).glob("epoch*.ckpt"))
        assert [torch.load(p, weights_only=True)["global_step"] for p in (*best, last)] == [20, 40, 20]

        resumed = run_script("train.py", f"resume={disk}", "callbacks.model_checkpoint.save_top_k=1")
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        log = (disk / "train.log").read_text()
        assert f"{best[1].name} is newer than last.ckpt, which could not be written then: continuing from it" in log
        kept = sorted(p.name for p in run_folder.checkpoints(disk).iterdir())
        assert len(kept) == 2 and "last.ckpt" in kept and not any("-v" in name for name in kept), kept
        assert torch.load(last, weights_only=True)["global_step"] == 60


@pytest.mark.slow
@pytest.mark.parametrize("problem", ["missing", "cut short"])
def test_a_bad_ckpt_path_is_refused_before_the_run_folder_is_made(problem: str, tmp_path: Path) -> None:
    checkpoint = tmp_path / "given.ckpt"
    if problem == "cut short":
        torch.save({"state_dict": {"w": torch.zeros(1000)}}, checkpoint)
        checkpoint.write_bytes(checkpoint.read_bytes()[:2000])
    run = tmp_path / "run"  # named here: a folder the refused run would have made, and not deleted
    result = run_script("train.py", f"ckpt_path={checkpoint}", f"hydra.run.dir={run}", timeout=120)
    assert result.returncode == 1
    expected = "no such file" if problem == "missing" else "is not a readable checkpoint (truncated, or not one)"
    assert result.stderr.startswith(f"Error: ckpt_path={checkpoint}") and expected in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not run.exists()
