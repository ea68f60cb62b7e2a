"""A trained network ready to classify: raw inputs (as the model card describes them: images as pixels of
0 to 255) in, the probability of each class out. Made from a checkpoint (the network rebuilt
as data, ``loading``) or from an exported ``model.onnx`` (its card tells the preprocessing and the
classes), so that predict.py, the server and the demo classify alike whatever they were given.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mnistlab.runtime.checkpointing.checkpoint_io import load_checkpoint
from mnistlab.runtime.reporting import run_record
from mnistlab.runtime.run.failures import InputError
from mnistlab.trained import loading, model_card


@dataclass
class TrainedClassifier:
    logits: Callable[[np.ndarray], np.ndarray]  # the network's inputs (N, ...) -> logits (N, classes)
    card: dict[str, Any]  # the preprocessing (scale, mean, std) and the class names
    device: str = "cpu"
    input_shape: tuple[int | str | None, ...] | None = None  # of one input, where the model says (ONNX); str: any
    classes: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.classes = list(self.card.get("classes") or [])

    def takes(self, shape: Sequence[int]) -> bool:
        """Whether the model takes one input of ``shape``, as far as it says (a checkpoint says nothing)."""
        wanted = self.input_shape
        return wanted is None or (
            len(wanted) == len(shape) and all(not isinstance(w, int) or w == s for w, s in zip(wanted, shape))
        )

    def expect(self, shape: Sequence[int], source: str) -> None:
        """Refuse, in one line, a model that cannot take what ``source`` gives it: one input of ``shape``."""
        if not self.takes(shape):
            raise InputError(
                f"the model takes inputs of shape {_shown(self.input_shape)}, but {source} gives {_shown(shape)}: "
                "serve or predict with a model exported from a checkpoint of this task"
            )

    def probabilities(self, inputs: np.ndarray) -> np.ndarray:
        """Raw inputs (N, ...), as the network takes them before normalisation -> the probability of each
        class (N, classes)."""
        if not self.takes(inputs.shape[1:]):
            raise InputError(
                f"an input of shape {_shown(inputs.shape[1:])}: the model takes {_shown(self.input_shape)}"
            )
        x = inputs.astype(np.float32)
        if "mean" in self.card:
            x = (x / self.card["scale"] - self.card["mean"]) / self.card["std"]
        logits = torch.from_numpy(self.logits(x))
        return logits.softmax(dim=1).numpy()

    def name(self, label: int) -> str:
        return self.classes[label] if label < len(self.classes) else str(label)


def load(
    path: str | Path, device: str = "cpu", data_dir: str = "data", trusted: Sequence[str] = loading.TRUSTED
) -> TrainedClassifier:
    """The classifier in a checkpoint of train.py or an exported ``.onnx``; ``device``: cpu or cuda;
    ``trusted``: the modules whose classes the checkpoint's config may name."""
    path = Path(path)
    if path.suffix == ".onnx":
        return _from_onnx(path, device)
    checkpoint = load_checkpoint(path)
    net = loading.network(checkpoint, trusted).to(device)
    datamodule = loading.datamodule(checkpoint, trusted, data_dir=data_dir)  # built, never set up: no data is read
    run_record.warn_if_different(checkpoint, str(path), run_record.data_files(datamodule))  # code, versions, data
    classes = model_card.class_names(datamodule) or _numbered(loading.network_config(checkpoint))
    card = {**model_card.preprocessing(checkpoint), "classes": classes}

    def logits(x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return net(torch.from_numpy(x).to(device)).cpu().numpy()

    return TrainedClassifier(logits, card, device)


def _numbered(net: dict[str, Any]) -> list[str] | None:
    """Classes without names: "0", "1", ... as many as the network's ``num_classes``, when it says."""
    count = net.get("num_classes")
    return [str(label) for label in range(count)] if isinstance(count, int) else None


def _from_onnx(path: Path, device: str) -> TrainedClassifier:
    try:
        import onnxruntime
    except ImportError as err:
        raise InputError(f"an .onnx model needs onnxruntime: pip install -e '.[export]' ({err})") from None
    if not path.is_file():
        raise InputError(f"ckpt_path={path}: no such file")
    providers = ["CUDAExecutionProvider"] if device == "cuda" else []
    try:
        session = onnxruntime.InferenceSession(path, providers=[*providers, "CPUExecutionProvider"])
    except Exception as err:  # noqa: BLE001 -- onnxruntime raises its own Fail/InvalidProtobuf types
        raise InputError(f"{path} is not an ONNX model onnxruntime can load: {str(err).splitlines()[0]}") from None
    card = model_card.from_strings(session.get_modelmeta().custom_metadata_map)
    if "preprocessing" not in card:
        raise InputError(
            f"{path} carries no model card (export.py writes one into the file): without it, nothing says how "
            "its inputs are normalised or what its classes are; export the checkpoint again with python export.py "
            "format=onnx"
        )
    (entry,) = session.get_inputs()
    batch, *shape = entry.shape
    if isinstance(batch, int):
        raise InputError(f"{path} takes batches of exactly {batch}: export it with any batch size (export.py does)")
    return TrainedClassifier(lambda x: session.run(None, {entry.name: x})[0], card, device, tuple(shape))


def _shown(shape: Sequence[int | str | None] | None) -> str:
    return "(" + ", ".join(str(d) if isinstance(d, int) else "any" for d in (shape or ())) + ")"
