"""A trained network out of a checkpoint, as a plain ``nn.Module`` (no Lightning): what prediction
and export use. The checkpoint carries the run's resolved config, so the network is rebuilt exactly
as it was trained, whatever the overrides of that run were."""

import pickle
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from torch import nn

from mnistlab.checks import InputError


def load_checkpoint(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise InputError(f"ckpt_path={path}: no such file")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as err:
        raise InputError(f"ckpt_path={path} is not a readable checkpoint (truncated or not one): {err}") from err
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise InputError(f"ckpt_path={path} holds no 'state_dict': not a Lightning checkpoint")
    return checkpoint


def network(checkpoint: dict[str, Any]) -> nn.Module:
    """The checkpoint's network (``model.net`` of its run), with its weights, in eval mode."""
    if "config" not in checkpoint:
        raise InputError("the checkpoint holds no 'config' (not written by train.py): cannot tell its network")
    net = instantiate(checkpoint["config"]["model"]["net"])
    weights = {k.removeprefix("net."): v for k, v in checkpoint["state_dict"].items() if k.startswith("net.")}
    net.load_state_dict(weights)
    return net.eval()


def normalization(checkpoint: dict[str, Any]) -> tuple[float, float]:
    """The pixel mean and standard deviation (0..1 scale) the network was trained with."""
    data = checkpoint["config"]["data"]
    return data["mean"], data["std"]
