"""The trained network alone, as a file that runs without Lightning or this package: a ``torch.export``
program (``.pt2``, ``torch.export.load``), ONNX (onnxruntime, TensorRT, browsers), the weights alone
(safetensors: model hubs, serving stacks), or TorchScript (legacy: ``torch.jit`` is deprecated for
``torch.export``, but many C++ and mobile runtimes still take it). ``export(cfg)`` behind ``export.py``
writes it with its model card (``model_card.py``: what to feed it, what comes out), loads it back as its user
would, runs it on a batch of test inputs and compares its outputs with the checkpoint's network's.

The input is a batch of the data module's inputs, as it serves them to the network (for the example,
normalised images (N, 1, 28, 28)), any N; the outputs are the network's: class scores (N, classes), values
(one per sample, or several), or several tensors (a tuple or a dict), each with the batch first.
"""

import copy
import json
import logging
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig
from torch import Tensor, nn

from mnistlab.runtime.checkpointing.checkpoint_io import load_checkpoint
from mnistlab.runtime.run import atomic
from mnistlab.runtime.run.failures import InputError
from mnistlab.trained import loading, model_card

log = logging.getLogger(__name__)
SUFFIX = {"export": ".pt2", "onnx": ".onnx", "safetensors": ".safetensors", "torchscript": ".pt"}
Runner = Callable[[Tensor], list[Tensor]]  # the exported file, loaded back: inputs -> its outputs


def export(cfg: DictConfig) -> Path:
    checkpoint = load_checkpoint(Path(cfg.ckpt_path))
    trusted = list(cfg.trusted_modules)
    net = loading.network(checkpoint, trusted)
    images = sample_inputs(checkpoint, cfg.paths.data_dir, cfg.check_images, trusted)
    datamodule = loading.datamodule(checkpoint, trusted, data_dir=cfg.paths.data_dir)
    card = model_card.describe(checkpoint, net, datamodule, images)
    path = Path(cfg.output_dir) / f"model{SUFFIX[cfg.format]}"
    path.parent.mkdir(parents=True, exist_ok=True)
    run = WRITERS[cfg.format](net, images, path, card)
    with torch.inference_mode():
        expected = model_card.flatten(net(images))
    difference = compare(run(images), expected, card)
    if difference > cfg.tolerance:
        raise RuntimeError(f"the exported model disagrees with the checkpoint: outputs differ by {difference:.3g}")
    log.info(
        "Exported %s (%s). Checked on %d test inputs: its outputs match the checkpoint's within %.2g%s",
        path,
        cfg.format,
        len(images),
        difference,
        ", the same predicted classes" if card["task"] == model_card.CLASSIFICATION else "",
    )
    return path


def compare(exported: list[Tensor], expected: list[Tensor], card: dict[str, Any]) -> float:
    """The largest difference between the exported file's outputs and the network's; infinite where their
    shapes differ, or (class scores) where they pick another class."""
    if [tuple(t.shape) for t in exported] != [tuple(t.shape) for t in expected]:
        return float("inf")
    if card["task"] == model_card.CLASSIFICATION and not bool((exported[0].argmax(1) == expected[0].argmax(1)).all()):
        return float("inf")
    return max((e.float() - x.float()).abs().max().item() for e, x in zip(exported, expected, strict=True))


def sample_inputs(checkpoint: dict, data_dir: str, count: int, trusted: Sequence[str] = loading.TRUSTED) -> Tensor:
    """The first ``count`` test inputs, as the checkpoint's data module serves them to the network (a batch's
    first item, where it is a tuple or list: (inputs, targets))."""
    datamodule = loading.datamodule(checkpoint, trusted, data_dir=data_dir)  # this machine's copy, not the run's
    datamodule.prepare_data()  # downloads the data when it is missing, as training does
    datamodule.setup("test")
    batches, served = [], 0
    for batch in datamodule.test_dataloader():
        inputs = batch[0] if isinstance(batch, list | tuple) else batch
        batches.append(inputs)
        served += len(inputs)
        if served >= count:
            break
    return torch.cat(batches)[:count]


def _to_program(net: nn.Module, images: Tensor, path: Path, card: dict[str, Any]) -> Runner:
    batch = torch.export.Dim("batch")  # any number of images
    with atomic.replacing(path) as file:
        torch.export.save(torch.export.export(net, (images,), dynamic_shapes=[{0: batch}]), file)
    atomic.write_text(path.parent / model_card.FILE, json.dumps(card, indent=2) + "\n")
    loaded = torch.export.load(path).module()
    return lambda x: [t.detach() for t in model_card.flatten(loaded(x))]


def _to_onnx(net: nn.Module, images: Tensor, path: Path, card: dict[str, Any]) -> Runner:
    try:
        import onnx
        import onnxruntime
    except ImportError as err:
        raise InputError(f"format=onnx needs onnx and onnxruntime: pip install -e '.[export]' ({err})") from None
    for noisy in ("onnx_ir", "onnxscript"):  # their optimisers' notes on every pass
        logging.getLogger(noisy).setLevel(logging.WARNING)
    batch = torch.export.Dim("batch")  # any number of inputs
    with torch.inference_mode():
        outputs = net(images[:1])
    torch.onnx.export(
        *(net, (images,), path),
        input_names=[card["input_name"]],
        output_names=model_card.output_names(outputs, card["task"] == model_card.CLASSIFICATION),
        dynamic_shapes=[{0: batch}],
        external_data=False,  # one file: the weights inside, not in model.onnx.data beside it
        verbose=False,
    )
    model = onnx.load(path)
    onnx.helper.set_model_props(model, model_card.as_strings(card))
    atomic.write_bytes(path, model.SerializeToString())  # torch's own file, whole, replaced by the one with the card
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    name = card["input_name"]
    return lambda x: [torch.from_numpy(o) for o in session.run(None, {name: x.numpy().astype(np.float32)})]


def _to_safetensors(net: nn.Module, images: Tensor, path: Path, card: dict[str, Any]) -> Runner:
    try:
        from safetensors.torch import load_file, save
    except ImportError as err:
        raise InputError(f"format=safetensors needs safetensors: pip install -e '.[export]' ({err})") from None

    atomic.write_bytes(path, save(net.state_dict(), metadata=model_card.as_strings(card)))  # save_file: 0600
    loaded = copy.deepcopy(net)
    loaded.load_state_dict(load_file(path))
    return lambda x: [t.detach() for t in model_card.flatten(loaded(x))]


def _to_torchscript(net: nn.Module, images: Tensor, path: Path, card: dict[str, Any]) -> Runner:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.jit.trace.* is deprecated")  # the module's docstring
        traced = torch.jit.trace(net, images[:2], strict=False)  # strict=False: a dict of outputs too
    with atomic.replacing(path) as file:
        torch.jit.save(traced, file, _extra_files={model_card.FILE: json.dumps(card, indent=2)})
    loaded = torch.jit.load(str(path))
    return lambda x: [t.detach() for t in model_card.flatten(loaded(x))]


WRITERS: dict[str, Callable[[nn.Module, Tensor, Path, dict[str, Any]], Runner]] = {
    "export": _to_program,
    "onnx": _to_onnx,
    "safetensors": _to_safetensors,
    "torchscript": _to_torchscript,
}
