"""Classify digit images with a trained checkpoint: ``predict(cfg)`` behind ``predict.py``.

Each image is prepared as MNIST's were (``digits.py``), normalised as the network was trained
(its checkpoint's ``data.mean``/``data.std``, or an ONNX file's card), and classified in batches
(``trained/inference.py``), on the GPU when there is one. The result is a CSV (file, predicted class, the probability of each class) and a summary line.

Images are data from anyone: one that cannot be read (not an image, cut short, over ``max_pixels``)
is skipped with a warning and named in the summary, and the others are classified. The output is
checked before any work and written whole or not at all; an existing one is kept unless
``overwrite=true``.
"""

import csv
import io
import logging
import os
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig

from mnistlab.example import digits
from mnistlab.runtime.run import atomic
from mnistlab.runtime.run.failures import InputError
from mnistlab.trained import inference

log = logging.getLogger(__name__)


def predict(cfg: DictConfig) -> list[dict[str, object]]:
    output = _check_output(Path(cfg.output), cfg.overwrite)
    device = _device(cfg.device)
    model = inference.load(cfg.ckpt_path, device.type, cfg.paths.data_dir, cfg.trusted_modules)
    model.expect(digits.SHAPE, "predict.py's digit images")
    files = digits.find(Path(cfg.input))
    rows: list[dict[str, object]] = []
    skipped: list[str] = []
    for start in range(0, len(files), cfg.batch_size):
        batch, images = _read(files[start : start + cfg.batch_size], cfg.max_pixels, skipped)
        if not batch:
            continue
        probabilities = model.probabilities(np.stack(images)[:, None])  # one channel: (N, *digits.SHAPE)
        for path, p in zip(batch, probabilities, strict=True):
            rows.append(
                {"file": str(path), "predicted": int(p.argmax()), **{f"p{c}": float(p[c]) for c in range(len(p))}}
            )
    if not rows:
        raise InputError(f"none of the {len(files)} image(s) in input={cfg.input} could be read: {skipped[0]}")
    _write(output, rows)
    _summarise(rows, skipped, cfg.input, device, output)
    return rows


def _read(files: list[Path], max_pixels: int, skipped: list[str]) -> tuple[list[Path], list[np.ndarray]]:
    """The files of a batch that could be read, and their prepared images; the others into ``skipped``."""
    batch, images = [], []
    for path in files:
        try:
            images.append(digits.load(path, max_pixels))
            batch.append(path)
        except InputError as err:
            log.warning("Skipped: %s", err)
            skipped.append(str(err))
    return batch, images


def _check_output(output: Path, overwrite: bool) -> Path:
    """Refuse, before any work, an output that is a folder, would replace a file, or cannot be written."""
    if output.is_dir():
        raise InputError(f"output={output} is a folder; name a file, e.g. output={output / 'predictions.csv'}")
    if output.exists() and not overwrite:
        raise InputError(f"output={output} exists; pass overwrite=true to replace it, or name another file")
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InputError(f"output={output}: cannot make its folder ({err.strerror})") from None
    if not os.access(output.parent, os.W_OK):
        raise InputError(f"output={output}: its folder {output.parent} cannot be written")
    return output


def _summarise(rows: list[dict], skipped: list[str], input: str, device: torch.device, output: Path) -> None:
    counts = Counter(row["predicted"] for row in rows)
    log.info(
        "Classified %d image(s) from %s on %s: %s. Wrote %s",
        *(len(rows), input, device, ", ".join(f"{c}: {n}" for c, n in sorted(counts.items())), output),
    )
    if skipped:
        log.warning("Skipped %d image(s) that could not be read:\n  %s", len(skipped), "\n  ".join(skipped))


def _device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise InputError("device=cuda needs a CUDA GPU and this machine has none; use device=auto or device=cpu")
    return torch.device(name if name != "auto" else "cuda" if torch.cuda.is_available() else "cpu")


def _write(path: Path, rows: list[dict[str, object]]) -> None:
    text = io.StringIO()
    out = csv.DictWriter(text, fieldnames=list(rows[0]))
    out.writeheader()
    out.writerows({k: f"{v:.6f}" if isinstance(v, float) else v for k, v in row.items()} for row in rows)
    atomic.write_text(path, text.getvalue())
