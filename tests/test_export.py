"""export.py: the network alone, runnable without Lightning, checked against the checkpoint."""

import importlib.metadata
import sys

import numpy as np
import pytest
import safetensors.torch
import torch
from hydra import compose, initialize_config_dir

from mnistlab.runtime.checkpointing.checkpoint_io import load_checkpoint
from mnistlab.runtime.config import hydra_versions
from mnistlab.runtime.reporting import provenance
from mnistlab.trained import classifier, loading, model_card
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
    logits = onnxruntime.InferenceSession(sys.argv[1]).run(None, {"images": inputs})[0]
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
    named = classifier.load(trained_checkpoint, data_dir=DATA_DIR, trusted=TRUSTED).classes  # [] when unnamed
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
    alone = processes.run([sys.executable, "-c", USE, str(path), str(tmp_path / "inputs.npy")], timeout=120)
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
    with pytest.raises(RuntimeError, match=r"the exported model disagrees with the checkpoint: logits differ by \d"):
        export(cfg)
