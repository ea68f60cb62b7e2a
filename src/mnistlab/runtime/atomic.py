"""Result files that appear whole or not at all: ``metrics.json``, ``summary.csv``, ``failure.txt``,
``predictions.csv``, ``comparison.png``. Written in place, a file cut short (a kill mid-write, a full disk) reads as a
broken result; written beside the target under a name of its own and renamed over it, a reader sees
the old file or the new one."""

import os
import tempfile
from pathlib import Path


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode())


def write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(descriptor, "wb") as file:
            file.write(data)
        os.replace(name, path)
    finally:
        Path(name).unlink(missing_ok=True)
