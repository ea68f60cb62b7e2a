"""A trained network ready to answer: raw inputs (as the model card describes them: for the example, images
as pixels of 0 to 255) in, its outputs out, read as the card says: the probability of each class for class
scores, the values themselves otherwise. Made from a checkpoint (the network rebuilt as data, ``loading``)
or from an exported ``model.onnx`` (its card tells the preprocessing, the outputs and the classes), so that
predict.py, the server and the demo answer alike whatever they were given.
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

Outputs = dict[str, np.ndarray]  # the network's outputs by name, each with the batch first


@dataclass
class TrainedModel:
    run: Callable[[np.ndarray], Outputs]  # the network's inputs (N, ...), normalised -> its outputs
    card: dict[str, Any]  # the preprocessing (scale, mean, std), the task and the class names
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

    def outputs(self, inputs: np.ndarray) -> Outputs:
        """Raw inputs (N, ...), as the network takes them before normalisation -> its outputs by name."""
        if not self.takes(inputs.shape[1:]):
            raise InputError(
                f"an input of shape {_shown(inputs.shape[1:])}: the model takes {_shown(self.input_shape)}"
            )
        x = inputs.astype(np.float32)
        if "mean" in self.card:
            x = (x / self.card["scale"] - self.card["mean"]) / self.card["std"]
        return self.run(x)

    def scores(self, outputs: Outputs) -> np.ndarray | None:
        """The class scores among ``outputs``: its one (N, classes) output, where the card says the model
        classifies (a card of before "task" did: class scores were all it wrote)."""
        if self.card.get("task", model_card.CLASSIFICATION) != model_card.CLASSIFICATION:
            return None
        (only, *others) = outputs.values()
        return only if not others and only.ndim == 2 else None

    def probabilities(self, inputs: np.ndarray) -> np.ndarray:
        """Raw inputs (N, ...) -> the probability of each class (N, classes), for a model of class scores."""
        scores = self.scores(self.outputs(inputs))
        if scores is None:
            raise InputError("the model's outputs are values, not class scores: it has no classes to predict")
        return torch.from_numpy(scores).softmax(dim=1).numpy()

    def answers(self, inputs: np.ndarray) -> list[dict[str, Any]]:
        """Each input's answer: its class, the class's name and every class's probability for class scores;
        its values otherwise (``values``, or ``outputs`` by name for several)."""
        outputs = self.outputs(inputs)
        if (scores := self.scores(outputs)) is not None:
            probabilities = torch.from_numpy(scores).softmax(dim=1).numpy()
            return [_chosen(self, p) for p in probabilities]
        if len(outputs) == 1:
            (values,) = outputs.values()
            return [{"values": v.tolist()} for v in values]
        return [{"outputs": {name: o[i].tolist() for name, o in outputs.items()}} for i in range(len(inputs))]

    def name(self, label: int) -> str:
        return self.classes[label] if label < len(self.classes) else str(label)


def _chosen(model: TrainedModel, probabilities: np.ndarray) -> dict[str, Any]:
    label = int(probabilities.argmax())
    return {"class": label, "name": model.name(label), "probabilities": probabilities.tolist()}


def load(
    path: str | Path, device: str = "cpu", data_dir: str = "data", trusted: Sequence[str] = loading.TRUSTED
) -> TrainedModel:
    """The network in a checkpoint of train.py or an exported ``.onnx``; ``device``: cpu or cuda;
    ``trusted``: the modules whose classes the checkpoint's config may name."""
    path = Path(path)
    if path.suffix == ".onnx":
        return _from_onnx(path, device)
    checkpoint = load_checkpoint(path)
    net = loading.network(checkpoint, trusted).to(device)
    datamodule = loading.datamodule(checkpoint, trusted, data_dir=data_dir)  # built, never set up: no data is read
    run_record.warn_if_different(checkpoint, str(path), run_record.data_files(datamodule))  # code, versions, data
    count = model_card.class_count(loading.network_config(checkpoint))
    classes = model_card.class_names(datamodule) or ([str(c) for c in range(count)] if count is not None else None)
    task = model_card.VALUES if classes is None else model_card.CLASSIFICATION  # as export's card would say
    card = {**model_card.preprocessing(checkpoint), "task": task, "classes": classes}

    def run(x: np.ndarray) -> Outputs:
        with torch.inference_mode():
            result = net(torch.from_numpy(x).to(device))
        outputs = model_card.flatten(result)
        names = model_card.output_names(result, task == model_card.CLASSIFICATION)  # decided once, at load
        return {name: output.cpu().numpy() for name, output in zip(names, outputs, strict=True)}

    shape = checkpoint.get(run_record.INPUT_KEY, {}).get("shape")  # a checkpoint of before it was recorded: none
    return TrainedModel(run, card, device, tuple(shape) if isinstance(shape, list) else None)


def _from_onnx(path: Path, device: str) -> TrainedModel:
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
            "its inputs are normalised or what its outputs are; export the checkpoint again with python export.py "
            "format=onnx"
        )
    (entry,) = session.get_inputs()
    batch, *shape = entry.shape
    if isinstance(batch, int):
        raise InputError(f"{path} takes batches of exactly {batch}: export it with any batch size (export.py does)")
    names = [output.name for output in session.get_outputs()]

    def run(x: np.ndarray) -> Outputs:
        return dict(zip(names, session.run(None, {entry.name: x}), strict=True))

    return TrainedModel(run, card, device, tuple(shape))


def _shown(shape: Sequence[int | str | None] | None) -> str:
    return "(" + ", ".join(str(d) if isinstance(d, int) else "any" for d in (shape or ())) + ")"
