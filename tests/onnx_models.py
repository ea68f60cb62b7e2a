"""Hand-made ONNX models of any input shape, with or without a model card: what a user may bring to
predict.py or serve.py in place of one export.py wrote."""

from pathlib import Path

import onnx
from onnx import TensorProto, helper

from mnistlab.trained import model_card

CARD = {"preprocessing": "none: the network takes the inputs as they are", "classes": ["a", "b"]}


def flattening(path: Path, shape: list[int | str], card: dict | None = CARD) -> Path:
    """A model that flattens its input of ``shape`` (a str: any size) into its output; ``card``: the
    metadata export.py writes (None: none)."""
    node = helper.make_node("Flatten", ["images"], ["logits"], axis=1)
    graph = helper.make_graph(
        [node],
        "flattening",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [shape[0], None])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what onnxruntime of any supported release reads
    if card is not None:
        helper.set_model_props(model, model_card.as_strings(card))
    onnx.save(model, path)
    return path
