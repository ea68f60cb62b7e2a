"""Whether a checkpoint file can be read, without torch: every check of a checkpoint before its contents
are loaded lives here. ``ckpt_path=`` is checked before Hydra makes the run's folder
(``ReadableCheckpoint``, in 0.5 s rather than torch's 6), ``checkpoint_io.read`` checks again before it
loads the file as data, and ``resume=`` tells a damaged ``last.ckpt`` from the whole ones beside it.
What the contents must be (a ``state_dict``, weights that fit the model) is ``checkpoint_io``'s.
"""

import zipfile
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from mnistlab.runtime.run.failures import refused

REMOTE = "checkpoints are read from local files only; download it first (docs/reliability.md, Trust)"


def broken_checkpoint(checkpoint: Path) -> str | None:
    """Why ``checkpoint`` is not a whole torch checkpoint (a zip archive: a truncated one has no
    directory at its end, a damaged one fails its members' CRCs), or None."""
    try:
        with zipfile.ZipFile(checkpoint) as archive:
            damaged = archive.testzip()
            names = archive.namelist()
    except (OSError, zipfile.BadZipFile) as err:
        return f"{err}: cut short, or not a checkpoint"
    if damaged is not None:
        return f"{damaged} in it is damaged"
    if not any(name.endswith("/data.pkl") for name in names):
        return "it is a zip file but not a torch checkpoint"
    return None


def unreadable(path: str | Path, onnx: str | None = None) -> str | None:
    """What is wrong with ``path`` as a checkpoint to read, to follow ``<key>=<path>`` in a one-line error,
    or None. ``onnx``: what to say of an ONNX model; None where an ONNX model is fine (its own reader
    checks it)."""
    if "://" in str(path):
        return f": {REMOTE}"
    if not Path(path).is_file():
        return ": no such file"
    if Path(path).suffix == ".onnx":
        return f" is an ONNX model: {onnx}" if onnx else None
    if broken := broken_checkpoint(Path(path)):
        return f" is not a readable checkpoint (truncated, or not one): {broken}"
    return None


class ReadableCheckpoint(Callback):
    """Before Hydra creates the run's folder: ``ckpt_path=`` missing, remote or cut short, in one line (the
    checks eval.py and train.py make again with torch, which also refuse a file that runs code)."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        if "ckpt_path" not in config or OmegaConf.is_missing(config, "ckpt_path") or not config.ckpt_path:
            return
        if problem := unreadable(config.ckpt_path):
            raise refused(f"ckpt_path={config.ckpt_path}{problem}")
