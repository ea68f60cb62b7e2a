"""Data beyond one disk: Lightning's LitData chunks, in a folder or a bucket, streamed to every rank.

``stream.py`` writes a data module's splits as chunks (``chunks.py``): ``<input_dir>/train``, ``val`` and
``test``, one record a sample with its fields (``id``, ``input``, ``target``), and ``meta.json`` (what the
source data module said of its inputs and classes, for the model card). :class:`StreamingDataModule` reads
them from a folder or from ``s3://`` (LitData downloads chunks ahead of need into a cache on each node).

Where the bucket is and who may read it come from the environment, as the AWS tools read them
(``AWS_ENDPOINT_URL`` for an S3-compatible server, ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``,
``AWS_PROFILE`` and ``~/.aws/``): never from ``conf/``, so they enter no config, log, record or checkpoint.

What the machinery adds to LitData, each measured where LitData alone fell short (docs/streaming.md):

- Resuming mid-epoch (LitData's loader state is in Lightning's checkpoint) continues the epoch; the epoch
  after it is a whole one. LitData 0.2.76 alone replays the resumed epoch's rest a second time there, because
  Lightning stops at an epoch's length without exhausting the loader (:class:`ResumableLoader`).
- Resuming on another number of ranks (a node lost) is exact too: LitData places the rest of the epoch by the
  ranks that began it (its elastic resume; tests/test_streaming.py checks 4 ranks resumed on 2).
- A shuffled epoch decodes each sample once: LitData's default decodes a window of samples around each one
  asked for, which shuffling throws away (an epoch of 28x28 images 13x slower).
- Validation and test never drop a sample (``drop_last=False``): each rank streams its own share, so every
  sample counts once on any number of ranks; training drops the last partial batch of each rank (LitData's
  rule in DDP), so every rank steps as often as the others.
- A bucket that does not answer is one line after ``timeout`` seconds a try, three tries (LitData alone retries
  1,000 times); from an ``http://`` endpoint, LitData's boto3 downloader fetches the chunks (its obstore one
  cannot: ``runtime/run/internals.py``).
- A chunk that cannot be read stops the run in one line that says why: the cache's disk is full, or the chunk
  was deleted or damaged (LitData alone: an error from deep in its download thread or decoder).
"""

import errno
import json
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.trainer.states import TrainerFn
from litdata import StreamingDataLoader, StreamingDataset
from torch import Tensor
from torch.utils.data import default_collate

from mnistlab.runtime.config.checks import indivisible_batch
from mnistlab.runtime.run import internals
from mnistlab.runtime.run.failures import InputError, RunStopped, continue_line

SPLITS = ("train", "val", "test")
META = "meta.json"  # beside the splits: what the source data module said (chunks.py writes it)
FIELDS = ("input", "target")  # what a batch is, in order, unless a data module's config says otherwise


class Fields:
    """LitData's ``collate_fn``: the named fields of a list of samples, as one tuple of batched tensors."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)

    def __call__(self, samples: list[dict[str, Any]]) -> tuple[Tensor, ...]:
        return tuple(default_collate([sample[name] for sample in samples]) for name in self.names)


class ResumableLoader(StreamingDataLoader):
    """LitData's loader, whose epoch after a resumed one starts afresh, and whose chunks that cannot be read
    stop the run in one line.

    ``load_state_dict`` sets LitData's ``restore``, cleared only when an iteration runs to its end; Lightning
    stops at the epoch's length without reaching it, so the next epoch would replay the resumed one's rest
    (measured: 50 batches instead of 100, the same samples again). The first iteration after a load replays
    the rest of the epoch; any later one is a new epoch.

    LitData's state holds where a bucket's chunks were cached, and refuses another place: a node that joins, or
    another ``cache_dir``, could not resume. The bucket (its URL, still checked) is the data; the cache is
    this node's, so the state is given this loader's.

    A chunk deleted or damaged after stream.py wrote it fails deep in LitData, in words of its own (a timeout
    waiting for a file, a ``KeyError`` decoding a dtype): ``unreadable`` turns that into the run's failure.
    A state that does not fit these chunks fails at the first batch of the restored iteration: the user's input.
    """

    _replaying = False
    restore: bool  # LitData's: set by load_state_dict, cleared at an iteration's end

    def __init__(self, *args: Any, unreadable: Callable[[Exception], Exception], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.unreadable = unreadable

    def load_state_dict(self, obj: dict[str, Any]) -> None:
        state = obj.get("dataset", {})
        if state.get("input_dir_url") and state["input_dir_url"] == self.dataset.input_dir.url:
            obj = {**obj, "dataset": {**state, "input_dir_path": None, "cache_dir_path": self.dataset.cache_dir.path}}
        super().load_state_dict(obj)
        self._replaying = True

    def __iter__(self) -> Any:
        if self.restore and not self._replaying:
            self.restore = False
        restored, self._replaying = self._replaying, False
        return self._batches(super().__iter__(), restored)

    def _batches(self, batches: Any, restored: bool) -> Any:
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except ValueError as err:  # the restored state checked against these chunks
                if not restored:
                    raise self.unreadable(err) from err
                raise InputError(f"the checkpoint's position in the stream does not fit these chunks: {err}") from err
            except Exception as err:  # LitData's, reading a chunk: whatever it was, the chunk is unreadable
                raise self.unreadable(err) from err
            restored = False
            yield batch


class StreamingDataModule(L.LightningDataModule):
    """Chunks written by ``stream.py``, streamed: each global batch of ``batch_size`` samples is cut into one
    share per rank, the training order reshuffled each epoch from ``shuffle_seed``."""

    def __init__(
        self,
        input_dir: str,
        batch_size: int = 64,
        shuffle_seed: int = 0,
        num_workers: int = 0,
        fields: Sequence[str] = FIELDS,
        cache_dir: str | None = None,
        max_cache_size: str | None = None,
        transform: Callable[[Tensor], Tensor] | None = None,
        timeout: float = 30.0,
    ) -> None:
        super().__init__()
        self.input_dir = input_dir.rstrip("/")
        self.batch_size, self.shuffle_seed, self.num_workers = batch_size, shuffle_seed, num_workers
        self.fields, self.cache_dir, self.max_cache_size = list(fields), cache_dir, max_cache_size
        self.transform, self.timeout = transform, timeout
        self.datasets: dict[str, StreamingDataset] = {}
        self._meta: dict[str, Any] | None = None  # read once, at the first setup

    @property
    def remote(self) -> bool:
        return is_remote(self.input_dir)

    @property
    def meta(self) -> dict[str, Any]:
        """``meta.json`` of the chunks (empty before ``setup`` and for chunks not written by stream.py)."""
        return self._meta or {}

    def prepare_data(self) -> None:
        """A local folder is checked here, in one line; a bucket when LitData first reads its index."""
        if self.remote:
            return
        missing = [index.parent.name for index in self.data_files() if not index.is_file()]
        if missing:
            raise InputError(
                f"data.input_dir={self.input_dir} holds no chunks for {', '.join(missing)} (no <split>/index.json): "
                f"write them with `python stream.py data=<the data module> output={self.input_dir}`"
            )

    def setup(self, stage: str) -> None:
        if self.input_dir.startswith("s3://"):
            internals.litdata_downloads_over_plain_http()
        splits = ("train", "val") if stage in ("fit", "validate") else ("test",)
        for split in splits:
            if split not in self.datasets:
                self.datasets[split] = self._dataset(split)
        if self._meta is None:
            self._meta = read_meta(self.input_dir)

    def _dataset(self, split: str) -> StreamingDataset:
        try:
            return StreamingDataset(
                f"{self.input_dir}/{split}",
                cache_dir=self.cache_dir and f"{self.cache_dir}/{split}",
                max_cache_size=self.max_cache_size,
                shuffle=split == "train",
                seed=self.shuffle_seed,
                # Training: LitData's rule (in DDP each rank drops its last partial batch, so that all step as
                # often); evaluation never drops one, so every sample counts once.
                drop_last=None if split == "train" else False,
                # Shuffled, each sample is read alone: LitData 0.2.76's "auto" decodes a window of 32 samples
                # of small tensors around each one it is asked for and keeps one (28x28 images: an epoch of the loader
                # 9.5 s, against 0.70 s so); in order, its window is 13% faster.
                batch_decode=1 if split == "train" else "auto",
                storage_options=self._storage_options(),
            )
        except Exception as err:  # a missing file or bucket, refused credentials: botocore's own kinds too
            raise InputError(
                f"cannot read the chunks in {self.input_dir}/{split}: {' '.join(str(err).split())} ({_hint(err)})"
            ) from err

    def _storage_options(self) -> dict[str, Any]:
        """A bucket's client: LitData's retries a request that gets no answer up to 1,000 times (a wrong endpoint
        waits for ever); here each try waits ``timeout`` seconds, three tries in all."""
        if not self.remote:
            return {}
        from botocore.config import Config

        return {"config": Config(connect_timeout=self.timeout, read_timeout=self.timeout, retries={"max_attempts": 3})}

    def _loader(self, split: str) -> ResumableLoader:
        world_size = self.trainer.world_size if self.trainer else 1
        if split == "train" and (self.batch_size < 1 or self.batch_size % world_size):
            raise InputError(indivisible_batch(self.batch_size, world_size))
        per_rank = -(-self.batch_size // world_size)  # evaluation: the batch rounded up, nothing dropped
        return ResumableLoader(
            self.datasets[split],
            batch_size=per_rank,
            num_workers=self.num_workers,
            collate_fn=Fields(self.fields),
            unreadable=self._unreadable,
        )

    def _unreadable(self, err: Exception) -> Exception:
        """A chunk that could not be read, as the run's failure: one line naming why (the cache's disk full, or
        the chunk deleted or damaged), and while fitting how to continue from the last checkpoint once that is
        mended (nothing is saved now)."""
        if _full(err):
            cache = self.cache_dir or next(iter(self.datasets.values())).cache_dir.path  # LitData's, by default
            message = (
                f"the cache folder {cache} is full ({shutil.disk_usage(cache).free / 2**20:.1f} MiB free) while "
                f"fetching the chunks of {self.input_dir}: free space there, or set data.cache_dir to a disk "
                "with room (LitData keeps up to data.max_cache_size there; null: 75% of the disk's free space)"
            )
        else:
            said = " ".join(str(err).split())[:300]
            message = (
                f"a chunk of {self.input_dir} cannot be read ({type(err).__name__}: {said}): deleted or damaged since"
                f" stream.py wrote it; write the chunks again (python stream.py ... output={self.input_dir} "
                "overwrite=true)"
            )
        trainer = self.trainer
        if trainer is None or trainer.state.fn != TrainerFn.FITTING:  # evaluate again, once they are whole
            return InputError(message)
        return RunStopped(
            f"Stopped at step {trainer.global_step}: {message}. {continue_line(trainer.default_root_dir)}",
            exit_code=1,
        )

    def train_dataloader(self) -> ResumableLoader:
        return self._loader("train")

    def val_dataloader(self) -> ResumableLoader:
        return self._loader("val")

    def test_dataloader(self) -> ResumableLoader:
        return self._loader("test")

    def predict_dataloader(self) -> ResumableLoader:
        return self._loader("test")

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if self.transform is None:
            return batch
        return (self.transform(batch[0]), *batch[1:])

    def data_files(self) -> list[Path]:
        """The splits' indexes (each lists its chunks with their sizes): into each run's record."""
        return [] if self.remote else [Path(self.input_dir) / split / "index.json" for split in SPLITS]

    @property
    def input_name(self) -> str:
        return self.meta.get("input_name", "inputs")

    @property
    def classes(self) -> list[str] | None:
        return self.meta.get("classes")


def is_remote(location: str) -> bool:
    """A bucket's URL (``s3://...``), not a folder."""
    return "://" in location


def bucket_and_prefix(url: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` -> ``("bucket", "a/b")``; only S3 (and S3-compatible servers) is written to."""
    if not url.startswith("s3://"):
        raise InputError(f"{url}: stream.py writes to a folder or to s3://<bucket>/<prefix> (S3 or S3-compatible)")
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    return bucket, prefix.strip("/")


def key(prefix: str, name: str) -> str:
    return f"{prefix}/{name}" if prefix else name


def write_meta(output: str, meta: dict[str, Any]) -> None:
    text = json.dumps(meta, indent=2)
    if not is_remote(output):
        Path(output, META).write_text(text)
        return
    import boto3  # LitData's own dependency; the environment's credentials and endpoint (see above)

    bucket, prefix = bucket_and_prefix(output)
    boto3.client("s3").put_object(Bucket=bucket, Key=key(prefix, META), Body=text.encode())


def _full(err: BaseException | None) -> bool:
    """Whether a disk ran full on the way to ``err`` (LitData re-raises its download thread's error as its own)."""
    while err is not None:
        if getattr(err, "errno", None) == errno.ENOSPC:
            return True
        err = err.__cause__ or err.__context__
    return False


def _hint(err: Exception) -> str:
    """What to look at when a bucket's chunks cannot be read."""
    status = getattr(err, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode")
    if status == 403:  # a wrong key or secret, or a user the bucket does not admit (HEAD has no code but 403)
        return (
            "the bucket refused these credentials: check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, "
            "in the environment of every node"
        )
    return "a bucket's endpoint and credentials come from the environment: docs/streaming.md"


def read_meta(input_dir: str) -> dict[str, Any]:
    """``meta.json`` of chunks written by stream.py; empty for chunks written otherwise (or not on S3)."""
    if not is_remote(input_dir):
        path = Path(input_dir, META)
        return json.loads(path.read_text()) if path.is_file() else {}
    if not input_dir.startswith("s3://"):
        return {}
    import boto3
    from botocore.exceptions import ClientError

    bucket, prefix = bucket_and_prefix(input_dir)
    try:
        return json.loads(boto3.client("s3").get_object(Bucket=bucket, Key=key(prefix, META))["Body"].read())
    except ClientError:  # none there (NoSuchKey)
        return {}
