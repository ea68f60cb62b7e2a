"""Classify digit images with a trained checkpoint: ``predict(cfg)`` behind ``predict.py``.

Each image is prepared as MNIST's were (``digits.py``), normalised as the network was trained
(its checkpoint's ``data.mean``/``data.std``), and classified in batches, on the GPU when there is
one. The result is a CSV (file, predicted class, the probability of each class) and a summary line.
"""

import csv
import logging
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig

from mnistlab import digits, trained
from mnistlab.checks import InputError

log = logging.getLogger(__name__)


def predict(cfg: DictConfig) -> list[dict[str, object]]:
    checkpoint = trained.load_checkpoint(Path(cfg.ckpt_path))
    files = digits.find(Path(cfg.input))
    device = _device(cfg.device)
    net = trained.network(checkpoint).to(device)
    mean, std = trained.normalization(checkpoint)
    rows = []
    for start in range(0, len(files), cfg.batch_size):
        batch = files[start : start + cfg.batch_size]
        images = torch.from_numpy(np.stack([digits.load(path) for path in batch])).unsqueeze(1)
        with torch.inference_mode():
            probabilities = net(images.to(device).sub_(mean * 255).div_(std * 255)).softmax(dim=1).cpu()
        for path, p in zip(batch, probabilities, strict=True):
            rows.append(
                {"file": str(path), "predicted": int(p.argmax()), **{f"p{c}": float(p[c]) for c in range(len(p))}}
            )
    _write(Path(cfg.output), rows)
    counts = Counter(row["predicted"] for row in rows)
    log.info(
        "Classified %d image(s) from %s on %s: %s. Wrote %s",
        len(rows),
        cfg.input,
        device,
        ", ".join(f"{c}: {n}" for c, n in sorted(counts.items())),
        cfg.output,
    )
    return rows


def _device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise InputError("device=cuda needs a CUDA GPU and this machine has none; use device=auto or device=cpu")
    return torch.device(name if name != "auto" else "cuda" if torch.cuda.is_available() else "cpu")


def _write(path: Path, rows: list[dict[str, object]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as file:
        out = csv.DictWriter(file, fieldnames=list(rows[0]))
        out.writeheader()
        out.writerows({k: f"{v:.6f}" if isinstance(v, float) else v for k, v in row.items()} for row in rows)
