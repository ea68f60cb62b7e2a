"""Result files that appear whole or not at all: ``metrics.json``, ``summary.csv``, ``failure.txt``,
``predictions.csv``, ``comparison.png``, checkpoints. Written in place, a file cut short (a kill mid-write,
a full disk) reads as a broken result; written beside the target under a name of its own and renamed over
it, a reader sees the old file or the new one.

The partial file is created as a plain ``open`` creates one (mode 0666 less the umask), so a result is as
readable as the log beside it: ``tempfile.mkstemp`` makes 0600 files, which a teammate on a shared cluster
cannot read."""

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode())


def write_bytes(path: Path, data: bytes) -> None:
    with replacing(path) as file:
        file.write(data)


@contextmanager
def replacing(path: Path, durable: bool = False) -> Iterator[BinaryIO]:
    """A file to write that takes ``path``'s name once closed whole; ``durable``: on disk first (fsync),
    so that the new name survives a node's crash. Interrupted, it leaves neither the file nor a partial one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.parent / f".{path.name}.{secrets.token_hex(4)}.partial"  # no other writer's name
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as to open()
    try:
        with os.fdopen(descriptor, "wb") as file:
            yield file
            if durable:
                file.flush()
                os.fsync(file.fileno())
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
