"""The trained network alone, as a file that runs without Lightning or this package: ONNX (for
onnxruntime, TensorRT, browsers) or TorchScript (``torch.jit.load``). ``export(cfg)`` behind
``export.py`` writes it, then runs it on a batch of test images, the ONNX file through onnxruntime,
and compares its logits with the checkpoint's network's.

The input is a batch of normalised images (N, 1, 28, 28), any N; the output the logits (N, classes).
"""

import logging
import warnings
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig
from torch import Tensor, nn

from mnistlab.runtime.checkpoint_io import load_checkpoint
from mnistlab.runtime.checks import InputError
from mnistlab.trained import loading

log = logging.getLogger(__name__)
SUFFIX = {"onnx": ".onnx", "torchscript": ".pt"}


def export(cfg: DictConfig) -> Path:
    checkpoint = load_checkpoint(Path(cfg.ckpt_path))
    net = loading.network(checkpoint)
    images = sample_inputs(checkpoint, cfg.paths.data_dir, cfg.check_images)
    path = Path(cfg.output_dir) / f"model{SUFFIX[cfg.format]}"
    path.parent.mkdir(parents=True, exist_ok=True)
    run = _to_onnx(net, images, path) if cfg.format == "onnx" else _to_torchscript(net, images, path)
    with torch.inference_mode():
        expected = net(images)
    exported = run(images)
    difference = (exported - expected).abs().max().item()
    same = bool((exported.argmax(1) == expected.argmax(1)).all())
    if difference > cfg.tolerance or not same:
        raise RuntimeError(f"the exported model disagrees with the checkpoint: logits differ by {difference:.3g}")
    log.info(
        "Exported %s (%s). Checked on %d test images: its logits match the checkpoint's within %.2g, the same "
        "predictions",
        path,
        cfg.format,
        len(images),
        difference,
    )
    return path


def sample_inputs(checkpoint: dict, data_dir: str, count: int) -> Tensor:
    """The first ``count`` test inputs, as the checkpoint's data module serves them to the network."""
    datamodule = loading.datamodule(checkpoint, data_dir=data_dir)  # this machine's copy, not the run's
    datamodule.prepare_data()  # downloads the data when it is missing, as training does
    datamodule.setup("test")
    batches, served = [], 0
    for inputs, _ in datamodule.test_dataloader():
        batches.append(inputs)
        served += len(inputs)
        if served >= count:
            break
    return torch.cat(batches)[:count]


def _to_onnx(net: nn.Module, images: Tensor, path: Path):
    try:
        import onnxruntime
    except ImportError as err:
        raise InputError(f"format=onnx needs onnx and onnxruntime: pip install -e '.[export]' ({err})") from None
    for noisy in ("onnx_ir", "onnxscript"):  # their optimisers' notes on every pass
        logging.getLogger(noisy).setLevel(logging.WARNING)
    batch = torch.export.Dim("batch")  # any number of images
    torch.onnx.export(
        *(net, (images,), path),
        input_names=["images"],
        output_names=["logits"],
        dynamic_shapes=[{0: batch}],
        external_data=False,  # one file: the weights inside, not in model.onnx.data beside it
        verbose=False,
    )
    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    return lambda x: torch.from_numpy(session.run(None, {"images": x.numpy().astype(np.float32)})[0])


def _to_torchscript(net: nn.Module, images: Tensor, path: Path):
    with warnings.catch_warnings():
        # torch deprecates TorchScript for torch.export, but torch.jit.load is what most C++ and mobile
        # runtimes still take.
        warnings.filterwarnings("ignore", message=".*torch.jit.trace.* is deprecated")
        torch.jit.trace(net, images[:2]).save(str(path))
    loaded = torch.jit.load(str(path))
    return lambda x: loaded(x).detach()
