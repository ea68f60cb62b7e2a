"""What a user of an exported model must know to feed it, carried inside the file: the input's shape,
dtype and format, its preprocessing, the class names, the network's config, and the code that made it.

Every exported format holds the same card: ONNX as ``metadata_props``, safetensors as its metadata,
TorchScript as an extra file ``model.json``, a ``torch.export`` program in ``model.json`` beside it.
Those stores take strings only: lists and mappings are JSON in them (``as_strings``).
"""

import json
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from mnistlab.runtime.reporting import provenance
from mnistlab.trained import loading

SCALE = 255.0  # pixels arrive as 0..255; the data modules' mean and std are on a 0..1 scale
FILE = "model.json"  # the card beside a .pt2 and inside a TorchScript file
GENERIC_INPUT = "the data module's inputs, as it serves them to the network"


def describe(checkpoint: dict[str, Any], net: nn.Module, datamodule: Any, inputs: Tensor) -> dict[str, Any]:
    """The card of the checkpoint's network ``net``; ``inputs`` are a batch as the data module serves them."""
    with torch.inference_mode():
        outputs = net(inputs[:1]).shape[1]
    classes = class_names(datamodule) or [str(c) for c in range(outputs)]
    return {
        "name": provenance.PACKAGE,
        "version": provenance.version(),
        "commit": provenance.commit(),
        "input_name": "images",
        "input_shape": ["N", *inputs.shape[1:]],
        "input_dtype": str(inputs.dtype).removeprefix("torch."),
        "input_format": getattr(datamodule, "input_format", GENERIC_INPUT),
        **preprocessing(checkpoint),
        "output": f"logits (N, {len(classes)}): softmax over dim 1 gives the probability of each class",
        "classes": classes,
        "network": loading.network_config(checkpoint),
    }


def class_names(datamodule: Any) -> list[str] | None:
    """The data module's names of its classes (``classes``: "7 - seven", "Sneaker"), where it has them: a
    list of strings, not a count."""
    names = getattr(datamodule, "classes", None)
    if isinstance(names, list | tuple) and names and all(isinstance(name, str) for name in names):
        return list(names)
    return None


def preprocessing(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """How raw inputs become the network's: ``(x / scale - mean) / std`` where the data module normalises
    (``data.mean``, ``data.std``), else nothing."""
    data = checkpoint.get("config", {}).get("data", {})
    if "mean" not in data and "std" not in data:
        return {"preprocessing": "none: the network takes the inputs as they are"}
    mean, std = loading.normalization(checkpoint)
    return {"preprocessing": "x = (x / scale - mean) / std", "scale": SCALE, "mean": mean, "std": std}


def as_strings(card: dict[str, Any]) -> dict[str, str]:
    """The card for stores of strings: strings as they are, everything else as JSON."""
    return {key: value if isinstance(value, str) else json.dumps(value) for key, value in card.items()}


def from_strings(stored: dict[str, str]) -> dict[str, Any]:
    """``as_strings`` undone: what an exported file's metadata says, as values."""
    card: dict[str, Any] = {}
    for key, value in stored.items():
        try:
            card[key] = json.loads(value)
        except json.JSONDecodeError:  # a plain string
            card[key] = value
    return card


def read(path: Path) -> dict[str, Any]:
    """The card an exported file carries, as values."""
    if path.suffix == ".pt2":
        return json.loads((path.parent / FILE).read_text())
    if path.suffix == ".onnx":
        import onnx

        return from_strings({p.key: p.value for p in onnx.load(path, load_external_data=False).metadata_props})
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(path, "pt") as file:
            return from_strings(file.metadata())
    files = {FILE: ""}  # TorchScript: torch.jit.load fills it in
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.jit.load.* is deprecated")
        torch.jit.load(path, _extra_files=files)
    return json.loads(files[FILE])
