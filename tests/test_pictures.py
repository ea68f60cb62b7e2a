"""What a run leaves to look at: figures and HPARAMS in TensorBoard, the config tree, eval's PNG."""

import json
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from mnistlab.runtime.reporting import pictures
from mnistlab.runtime.run import run_folder
from mnistlab.tasks import evaluate, train

from composing import SHORT, compose_config


def _events(folder: Path) -> EventAccumulator:
    events = EventAccumulator(str(folder), size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    return events


def test_training_leaves_figures_hparams_and_the_config_tree(tmp_path: Path) -> None:
    metrics = train(compose_config("train", tmp_path, SHORT))
    events = _events(tmp_path / "tensorboard")
    assert set(events.Tags()["images"]) == {"test/confusion_matrix", "test/misclassified"}
    for tag in events.Tags()["images"]:
        assert events.Images(tag)[0].encoded_image_string.startswith(b"\x89PNG")
    experiment = plugin_data_pb2.HParamsPluginData.FromString(
        events.PluginTagToContent("hparams")["_hparams_/experiment"]
    ).experiment
    logged = {"model/optimizer/lr", "data/batch_size", "trainer/max_epochs", "seed"}
    assert {h.name for h in experiment.hparam_infos} == logged  # conf/train.yaml's hparams (no command line here)
    assert {"test/acc", "val/acc_best"} <= {m.name.tag for m in experiment.metric_infos}
    assert events.Scalars("test/acc")[-1].value == metrics["test/acc"]  # what HPARAMS shows beside the settings
    # One point per validation (one epoch here): the test adds none to the validation curves.
    assert [len(events.Scalars(tag)) for tag in ("val/acc", "val/acc_best", "val/loss")] == [1, 1, 1]
    tree = (tmp_path / "config_tree.txt").read_text()
    assert "├── model" in tree and "lr: 0.01" in tree  # tests/conf/model/suite.yaml's


def test_no_figure_is_drawn_for_loggers_that_keep_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def drawn(*args: object, **kwargs: object) -> None:
        raise AssertionError("a figure was drawn that no logger keeps")

    monkeypatch.setattr(pictures, "Figure", drawn)  # matplotlib's: 0.7 s a test, for nothing
    metrics = train(compose_config("train", tmp_path, [*SHORT, "logger=csv"]))
    assert metrics["test/samples"] > 0  # the test ran, its pictures skipped


@pytest.mark.slow
def test_eval_writes_the_confusion_matrix_as_png_and_its_metrics_as_json(tmp_path: Path) -> None:
    train(compose_config("train", tmp_path / "train", [*SHORT, "logger=none"]))
    (best,) = [p for p in run_folder.checkpoints(tmp_path / "train").glob("epoch*.ckpt")]
    metrics = evaluate(compose_config("eval", tmp_path / "eval", [f"ckpt_path={best}", "trainer.limit_test_batches=5"]))
    assert (tmp_path / "eval" / "confusion_matrix.png").read_bytes().startswith(b"\x89PNG")
    assert json.loads((tmp_path / "eval" / "metrics.json").read_text())["test/acc"] == metrics["test/acc"]
