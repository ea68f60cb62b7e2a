"""What a user of an exported model must know to feed it and read it, carried inside the file: the input's
name, shape, dtype and format, its preprocessing, each output's name and shape and what it means (class
scores with the classes' names, or values), the network's config, and the code that made it.

A network's output is read as class scores when it is one (N, C) tensor and the data module names C
classes (``classes``) or the network's config counts them (``num_classes`` or ``classes``: C); anything
else (one value per sample, several, several outputs as a tuple or a dict) is values, as computed.

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
from mnistlab.runtime.run.failures import InputError
from mnistlab.trained import loading

SCALE = 255.0  # pixels arrive as 0..255; the data modules' mean and std are on a 0..1 scale
FILE = "model.json"  # the card beside a .pt2 and inside a TorchScript file
GENERIC_INPUT = "the data module's inputs, as it serves them to the network"
CLASSIFICATION, VALUES = "classification", "values"  # what the card's "task" says the outputs are


def describe(checkpoint: dict[str, Any], net: nn.Module, datamodule: Any, inputs: Tensor) -> dict[str, Any]:
    """The card of the checkpoint's network ``net``; ``inputs`` are a batch as the data module serves them."""
    with torch.inference_mode():
        result = net(inputs[:1])
    outputs = flatten(result)
    classes = classes_of(datamodule, checkpoint, outputs)
    names = output_names(result, classes is not None)
    return {
        "name": provenance.PACKAGE,
        "version": provenance.version(),
        "commit": provenance.commit(),
        "input_name": getattr(datamodule, "input_name", "inputs"),
        "input_shape": ["N", *inputs.shape[1:]],
        "input_dtype": str(inputs.dtype).removeprefix("torch."),
        "input_format": getattr(datamodule, "input_format", GENERIC_INPUT),
        **preprocessing(checkpoint),
        "task": VALUES if classes is None else CLASSIFICATION,
        "outputs": [
            {"name": name, "shape": ["N", *output.shape[1:]], "dtype": str(output.dtype).removeprefix("torch.")}
            for name, output in zip(names, outputs, strict=True)
        ],
        "output": _meaning(names, outputs, classes),
        **({} if classes is None else {"classes": classes}),
        "network": loading.network_config(checkpoint),
        "weights": weights(checkpoint),
    }


def weights(checkpoint: dict[str, Any]) -> str:
    """Which weights a checkpoint's ``state_dict`` holds: as trained, or their moving average (callbacks=ema:
    Lightning's WeightAveraging keeps the trained ones beside it, as ``current_model_state``)."""
    if "current_model_state" not in checkpoint:
        return "as trained"
    callbacks = (checkpoint.get("config") or {}).get("callbacks") or {}
    decays = [c.get("decay") for c in callbacks.values() if isinstance(c, dict) and "decay" in c]
    return "a moving average of the trained weights" + (f" (exponential, decay {decays[0]})" if decays else "")


def flatten(result: Any) -> list[Tensor]:
    """A network's outputs as a list: one tensor, or those of a tuple, list or dict (in its order)."""
    if isinstance(result, Tensor):
        return [result]
    if isinstance(result, dict):
        return [t for value in result.values() for t in flatten(value)]
    if isinstance(result, list | tuple):
        return [t for value in result for t in flatten(value)]
    raise InputError(
        f"the network returns a {type(result).__name__}: an exported network returns a tensor, or a tuple, list "
        "or dict of tensors"
    )


def output_names(result: Any, classification: bool) -> list[str]:
    """The outputs' names: a dict's keys; ``logits`` or ``values`` for one; ``output_<i>`` for a tuple's."""
    if isinstance(result, Tensor):
        return ["logits" if classification else "values"]
    if isinstance(result, dict) and all(isinstance(t, Tensor) for t in result.values()):
        return [str(key) for key in result]
    return [f"output_{i}" for i in range(len(flatten(result)))]


def classes_of(datamodule: Any, checkpoint: dict[str, Any], outputs: list[Tensor]) -> list[str] | None:
    """The classes whose scores the network's one (N, C) output holds, named where the data module names
    them; None where its outputs are values."""
    if len(outputs) != 1 or outputs[0].dim() != 2:
        return None
    width = outputs[0].shape[1]
    if (names := class_names(datamodule)) and len(names) == width:
        return names
    return [str(c) for c in range(width)] if class_count(loading.network_config(checkpoint)) == width else None


def class_count(net: dict[str, Any]) -> int | None:
    """The classes the network's config counts (``num_classes``, or ``classes``), where it does."""
    return next((net[key] for key in ("num_classes", "classes") if isinstance(net.get(key), int)), None)


def _meaning(names: list[str], outputs: list[Tensor], classes: list[str] | None) -> str:
    if classes is not None:
        return f"logits (N, {len(classes)}): softmax over dim 1 gives the probability of each class"
    shapes = ", ".join(f"{name} ({', '.join(map(str, ['N', *o.shape[1:]]))})" for name, o in zip(names, outputs))
    return f"values, as the network computes them (no activation applied): {shapes}"


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
