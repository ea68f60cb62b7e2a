"""export.py: the network alone, runnable without Lightning, checked against the checkpoint."""

import importlib.metadata
import sys

import numpy as np
import pytest
import safetensors.torch
import torch
from hydra import compose, initialize_config_dir
from torch import Tensor, nn

from mnistlab.runtime.checkpointing.checkpoint_io import load_checkpoint
from mnistlab.runtime.config import hydra_versions
from mnistlab.runtime.reporting import provenance
from mnistlab.trained import exporting, inference, loading, model_card
from mnistlab.trained.exporting import export, sample_inputs

import processes
from composing import DATA_DIR, ROOT, TRUST_SUITE, TRUSTED

# Loads the exported file and classifies 100 test inputs saved as a NumPy array, with Lightning and this
# package made unimportable: what a user of the exported model has.
USE = """
import importlib.metadata
import sys
sys.modules["lightning"] = sys.modules["mnistlab"] = None
import numpy as np, torch
inputs = np.load(sys.argv[2])
if sys.argv[1].endswith(".onnx"):
    import onnxruntime
    logits = onnxruntime.InferenceSession(sys.argv[1]).run(None, {sys.argv[3]: inputs})[0]
elif sys.argv[1].endswith(".pt2"):
    logits = torch.export.load(sys.argv[1]).module()(torch.from_numpy(inputs)).detach().numpy()
else:
    logits = torch.jit.load(sys.argv[1])(torch.from_numpy(inputs)).detach().numpy()
print(" ".join(map(str, logits.argmax(1))))
"""
FILES = {
    "export": ["model.json", "model.pt2"],
    "onnx": ["model.onnx"],
    "safetensors": ["model.safetensors"],
    "torchscript": ["model.pt"],
}


@pytest.mark.slow
@pytest.mark.parametrize("format", list(FILES))
def test_the_exported_network_runs_alone_predicts_as_the_checkpoint_and_says_what_to_feed_it(
    format: str, trained_checkpoint, tmp_path
) -> None:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), **hydra_versions.BASE):
        overrides = [f"ckpt_path={trained_checkpoint}", f"format={format}", f"paths.output_dir={tmp_path}", TRUST_SUITE]
        cfg = compose("export", overrides)
    path = export(cfg)  # raises if its logits differ from the checkpoint's by more than cfg.tolerance
    assert sorted(p.name for p in tmp_path.iterdir()) == FILES[format]  # the weights inside, nothing else
    saved = load_checkpoint(trained_checkpoint)
    card = model_card.read(path)
    shape = sample_inputs(saved, DATA_DIR, 1, TRUSTED).shape  # what the data module serves the network
    assert card["input_shape"] == ["N", *shape[1:]] and card["input_dtype"] == "float32"
    assert {key: card[key] for key in model_card.preprocessing(saved)} == model_card.preprocessing(saved)
    datamodule = loading.datamodule(saved, TRUSTED, data_dir=DATA_DIR)
    assert card["input_format"] == getattr(datamodule, "input_format", model_card.GENERIC_INPUT)
    named = inference.load(trained_checkpoint, data_dir=DATA_DIR, trusted=TRUSTED).classes  # [] when unnamed
    assert card["task"] == "classification" and card["outputs"] == [
        {"name": "logits", "shape": ["N", len(card["classes"])], "dtype": "float32"}
    ]
    assert card["classes"] == (named or [str(label) for label in range(len(card["classes"]))])
    assert card["network"] == saved["config"]["model"]["net"] and card["commit"] == provenance.commit()
    assert card["version"] == importlib.metadata.version("mnistlab")

    inputs = sample_inputs(saved, DATA_DIR, 100, TRUSTED)
    with torch.inference_mode():
        expected = loading.network(saved, TRUSTED)(inputs).argmax(1)
    if format == "safetensors":  # weights for the network's code: the same network, loaded with them
        net = loading.network(saved, TRUSTED)
        net.load_state_dict(safetensors.torch.load_file(path))
        assert net(inputs).argmax(1).tolist() == expected.tolist()
        return
    np.save(tmp_path / "inputs.npy", inputs.numpy())
    use = [sys.executable, "-c", USE, str(path), str(tmp_path / "inputs.npy"), card["input_name"]]
    alone = processes.run(use, timeout=120)
    assert alone.returncode == 0, alone.stderr[-2000:]
    assert [int(p) for p in alone.stdout.split()] == expected.tolist()


@pytest.mark.slow
def test_an_export_whose_logits_differ_beyond_the_tolerance_is_refused(trained_checkpoint, tmp_path) -> None:
    """ONNX's logits differ from the checkpoint's by about 6e-6: refused with tolerance=0."""
    with initialize_config_dir(config_dir=str(ROOT / "conf"), **hydra_versions.BASE):
        cfg = compose(
            "export",
            [
                f"ckpt_path={trained_checkpoint}",
                "format=onnx",
                "tolerance=0",
                f"paths.output_dir={tmp_path}",
                TRUST_SUITE,
            ],
        )
    with pytest.raises(RuntimeError, match=r"the exported model disagrees with the checkpoint: outputs differ by \d"):
        export(cfg)


class OneValue(nn.Module):  # a regression: one value per sample
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.layer(x).squeeze(1)


class SeveralValues(nn.Module):  # several values per sample, (N, 3), no class count in its config
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        return self.layer(x)


class TwoHeads(nn.Module):  # two outputs, by name
    def __init__(self) -> None:
        super().__init__()
        self.trunk, self.mean, self.spread = nn.Linear(8, 16), nn.Linear(16, 2), nn.Linear(16, 1)

    def forward(self, x: Tensor) -> dict[str, Tensor]:
        hidden = self.trunk(x).relu()
        return {"mean": self.mean(hidden), "spread": self.spread(hidden).exp()}


VALUES = "values, as the network computes them (no activation applied): "
NETWORKS = {
    OneValue: ([["values", ["N"]]], f"{VALUES}values (N)"),
    SeveralValues: ([["values", ["N", 3]]], f"{VALUES}values (N, 3)"),
    TwoHeads: ([["mean", ["N", 2]], ["spread", ["N", 1]]], f"{VALUES}mean (N, 2), spread (N, 1)"),
}


@pytest.mark.parametrize("network", NETWORKS, ids=lambda n: n.__name__)
@pytest.mark.parametrize("format", list(FILES))
def test_every_format_takes_a_network_of_values_and_its_card_says_what_comes_out(format, network, tmp_path) -> None:
    """Not only class scores: one value per sample, several, or a dict of outputs, each written, loaded back
    as its user would and run; the card names each output and its shape."""
    torch.manual_seed(0)
    net, inputs = network().eval(), torch.randn(16, 8)
    checkpoint = {"config": {"model": {"net": {"_target_": f"tests.{network.__name__}"}}, "data": {}}}
    card = model_card.describe(checkpoint, net, None, inputs)
    outputs, meaning = NETWORKS[network]
    assert card["task"] == "values" and "classes" not in card and card["input_name"] == "inputs"
    assert [[o["name"], o["shape"]] for o in card["outputs"]] == outputs and card["output"] == meaning
    run = exporting.WRITERS[format](net, inputs, tmp_path / f"model{exporting.SUFFIX[format]}", card)
    with torch.inference_mode():
        expected = model_card.flatten(net(inputs))
    assert exporting.compare(run(inputs), expected, card) < 1e-5
    assert model_card.read(tmp_path / f"model{exporting.SUFFIX[format]}")["outputs"] == card["outputs"]


def test_class_scores_are_told_from_values_by_the_classes_the_data_or_the_network_count() -> None:
    scores = [torch.zeros(4, 5)]
    counted = {"config": {"model": {"net": {"num_classes": 5}}}}
    assert model_card.classes_of(None, counted, scores) == ["0", "1", "2", "3", "4"]
    assert model_card.classes_of(None, {"config": {"model": {"net": {"classes": 5}}}}, scores) is not None
    assert model_card.classes_of(None, {"config": {"model": {"net": {"hidden": 5}}}}, scores) is None
    assert model_card.classes_of(None, counted, [torch.zeros(4, 3)]) is None  # 3 outputs: not those 5 classes
    assert model_card.classes_of(None, counted, [torch.zeros(4, 5), torch.zeros(4)]) is None  # two outputs
