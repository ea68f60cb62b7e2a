"""Any data module's splits written as LitData chunks (``python stream.py``), for ``streaming.py`` to read.

Each sample is what the data module's loaders serve, one row of a batch: ``input`` and ``target`` as the
network and the loss take them, and ``id``, its place in the split as written (what a test records to see
each sample once). A folder or a bucket (``s3://...``: the chunks are staged in a temporary folder, then uploaded with
the credentials and endpoint the environment gives, as streaming.py says).
"""

import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

import lightning as L
import torch
from litdata.streaming.writer import BinaryWriter
from torch import Tensor

from mnistlab.runtime.data import streaming
from mnistlab.runtime.data.in_memory import InMemoryLoader
from mnistlab.runtime.data.streaming import SPLITS
from mnistlab.runtime.run.failures import InputError

log = logging.getLogger(__name__)


def write(datamodule: L.LightningDataModule, output: str, chunk_bytes: str, overwrite: bool) -> dict[str, int]:
    """Write ``datamodule``'s train, val and test splits under ``output``; return how many samples each has."""
    remote = streaming.is_remote(output)
    if remote:
        streaming.bucket_and_prefix(output)  # refused now unless S3, before anything is read or written
    if not remote and not overwrite and (held := [s for s in SPLITS if any(Path(output, s).glob("*"))]):
        raise InputError(f"{output} already holds chunks ({', '.join(held)}): pass overwrite=true to replace them")
    datamodule.prepare_data()
    datamodule.setup("fit")
    datamodule.setup("test")
    written = {}
    with tempfile.TemporaryDirectory() as staging:  # a bucket's chunks are written here first, then uploaded
        for split in SPLITS:
            inputs, targets = _split(getattr(datamodule, f"{split}_dataloader")())
            folder = Path(staging if remote else output, split)
            log.info("Writing the %s split (%d samples) into %s/%s", split, len(targets), output, split)
            shutil.rmtree(folder, ignore_errors=True)
            writer = BinaryWriter(str(folder), chunk_bytes=chunk_bytes)
            for index in range(len(targets)):
                writer.add_item(index, {"id": index, "input": inputs[index], "target": targets[index]})
            writer.done()
            writer.merge()
            written[split] = len(targets)
        if remote:
            _upload(Path(staging), output)
    streaming.write_meta(output, _meta(datamodule, written))
    return written


def _upload(folder: Path, output: str) -> None:
    """The staged chunks into the bucket, with the environment's credentials and endpoint (streaming.py)."""
    import boto3  # LitData's dependency
    from boto3.exceptions import Boto3Error
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, prefix = streaming.bucket_and_prefix(output)
    client = boto3.client("s3")
    try:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                client.upload_file(str(path), bucket, streaming.key(prefix, path.relative_to(folder).as_posix()))
    except (Boto3Error, BotoCoreError, ClientError) as err:  # S3UploadFailedError: boto3's, a missing bucket
        raise InputError(
            f"cannot write to {output}: {err} (the endpoint and credentials come from the environment: "
            "docs/streaming.md)"
        ) from err


def _split(loader: Any) -> tuple[Tensor, Tensor]:
    """Every sample of a split, on the CPU: an in-memory loader's whole tensors (in their order, without the
    rows that pad its last batch), or every batch another loader serves."""
    if isinstance(loader, InMemoryLoader):
        return loader.inputs.cpu(), loader.targets.cpu()
    inputs, targets = [], []
    for batch in loader:
        if not (isinstance(batch, list | tuple) and len(batch) >= 2):
            raise InputError(
                f"the data module's loaders serve {type(batch).__name__} batches: stream.py writes (inputs, targets)"
            )
        inputs.append(batch[0].cpu())
        targets.append(batch[1].cpu())
    return torch.cat(inputs), torch.cat(targets)


def _meta(datamodule: Any, written: dict[str, int]) -> dict[str, Any]:
    """What the source said of its data, for the model card of a model trained on the chunks. The chunks hold
    its inputs as its loaders serve them: after any normalisation of its own, which the format then says."""
    said = {
        name: getattr(datamodule, name)
        for name in ("input_name", "input_format", "classes")
        if hasattr(datamodule, name)
    }
    if "input_format" in said and hasattr(datamodule, "mean") and hasattr(datamodule, "std"):
        said["input_format"] += f"; normalised as the chunks hold it: (x / 255 - {datamodule.mean}) / {datamodule.std}"
    return {"source": f"{type(datamodule).__module__}.{type(datamodule).__qualname__}", "samples": written, **said}
