"""MNIST (and the data sets in its file format: Fashion-MNIST, KMNIST) as a ``LightningDataModule``:
the official 60k/10k split, decoded once, served from memory."""

import logging
import math
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mnistlab.runtime.data.in_memory import InMemoryDataModule
from mnistlab.runtime.run.failures import InputError

# The four files of torchvision's layout (<data_dir>/<data set>/raw/), the same for every data set in
# MNIST's format. Each is an IDX file: a magic number (0x0000080<dimensions>: unsigned bytes), the size of
# each dimension (4 bytes each, big-endian), then one byte per pixel or label.
log = logging.getLogger(__name__)
FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def normalize(images: Tensor, mean: float, std: float) -> Tensor:
    """uint8 images (N, 28, 28) -> float (N, 1, 28, 28), standardised."""
    return images.unsqueeze(1).float().sub_(mean * 255).div_(std * 255)


class MNISTDataModule(InMemoryDataModule):
    """Train/val split out of the 60,000 training images (seeded, the same on every rank and run);
    the official 10,000 test images as the test set."""

    input_name = "images"  # what an exported model calls its input (ONNX's input name; the model card's)

    def __init__(
        self,
        data_dir: str,
        dataset: str = "MNIST",
        batch_size: int = 64,
        val_size: int = 5_000,
        folds: int = 1,
        fold: int = 0,
        split_seed: int = 12345,
        shuffle_seed: int = 0,
        mean: float = 0.1307,
        std: float = 0.3081,
        download: bool = True,
        download_timeout: float = 30.0,
        num_classes: int = 10,
        prepare_data_per_node: bool = True,
    ) -> None:
        super().__init__()
        self.prepare_data_per_node = prepare_data_per_node  # Lightning's switch: see conf/data/mnist.yaml
        if not 0 < val_size < 60_000:
            raise InputError(f"data.val_size={val_size} must be between 1 and 59,999 (of 60,000 training images)")
        if folds < 1 or not 0 <= fold < folds:
            raise InputError(f"data.fold={fold} must be one of 0..{folds - 1} (data.folds={folds}, at least 1)")
        self.folds, self.fold = folds, fold
        self.dataset = dataset  # torchvision.datasets' class: MNIST, FashionMNIST, KMNIST
        self.raw_dir = Path(data_dir) / dataset / "raw"
        self.batch_size, self.val_size, self.split_seed = batch_size, val_size, split_seed
        self.shuffle_seed, self.download, self.download_timeout = shuffle_seed, download, download_timeout
        self.mean, self.std, self.num_classes = mean, std, num_classes
        self._dataset_class()  # a name from a checkpoint's config is data: only MNIST's kin are looked up

    @property
    def classes(self) -> list[str]:
        """The name of each label, as torchvision gives them ("7 - seven", "Sneaker"): exported models and
        the server carry them."""
        return list(self._dataset_class().classes)

    @property
    def input_format(self) -> str:
        """What one input of the network is, before ``normalize``: what an exported model's user must feed."""
        return (
            "a 28 x 28 grey image, 0 (background) to 255 (ink): white on black (a digit drawn dark on light "
            "paper is inverted first), scaled into a 20 x 20 box and centred by its centre of mass (MNIST's preparation)"
        )

    def data_files(self) -> list[Path]:
        """The files this data module reads (their checksums go into each run's record: runtime/reporting/run_record.py)."""
        return [self.raw_dir / name for name in FILES]

    def prepare_data(self) -> None:
        """Runs on one process per node, or one in all (prepare_data_per_node): download, then check."""
        missing = [name for name in FILES if not (self.raw_dir / name).is_file()]
        if missing and self.download:
            log.info(
                "Downloading %s into %s (each try gives up after %g s without an answer: data.download_timeout)",
                *(self.dataset, self.raw_dir, self.download_timeout),
            )
            try:
                with _socket_timeout(self.download_timeout):
                    for train in (True, False):
                        self._torchvision(train=train, download=True)
            except (OSError, RuntimeError) as err:
                failure = " ".join(str(err).split())  # torchvision's lists every mirror, a line each
                raise InputError(self._missing_message(missing, f"the download failed: {failure}")) from err
        elif missing:
            raise InputError(self._missing_message(missing, "data.download is false"))
        self._check_sizes()

    def setup(self, stage: str) -> None:
        """Runs on every rank: decode the needed splits into memory and shard them for this rank."""
        if stage in ("fit", "validate") and "val" not in self.loaders:
            images, labels = self.read(train=True)
            if self.folds == 1 and self.val_size >= len(labels):
                raise InputError(f"data.val_size={self.val_size} leaves no training images of {len(labels):,}")
            train, val = self.split_indices(len(labels))
            self.loaders["train"] = self._loader(images[train], labels[train], shuffle=True)
            self.loaders["val"] = self._loader(images[val], labels[val], shuffle=False)
        if stage in ("test", "predict") and "test" not in self.loaders:
            self.loaders["test"] = self._loader(*self.read(train=False), shuffle=False)

    def split_indices(self, count: int = 60_000) -> tuple[Tensor, Tensor]:
        """Indices of the ``count`` training images used for training and for validation: the last
        ``val_size`` of a seeded permutation validate; with ``folds`` K > 1, its K near-equal parts are the
        folds, part ``fold`` validates and the others train (K-fold cross-validation, disjoint folds)."""
        generator = torch.Generator().manual_seed(self.split_seed)
        split = torch.randperm(count, generator=generator)
        if self.folds == 1:
            return split[: -self.val_size], split[-self.val_size :]
        parts = split.tensor_split(self.folds)
        return torch.cat([p for i, p in enumerate(parts) if i != self.fold]), parts[self.fold]

    def on_device(self, inputs: Tensor) -> Tensor:
        # Normalised once, as float32 (4 bytes a pixel: 172 MB for the 55,000 training images) rather than per
        # batch from uint8: 26 us less per step, 3% of a step of this model on a CPU (benchmarks/).
        return normalize(inputs, self.mean, self.std)

    def read(self, train: bool) -> tuple[Tensor, Tensor]:
        """The images (uint8, N x 28 x 28) and labels of the training (60,000) or test (10,000) files."""
        split = "train" if train else "t10k"
        self._check_sizes([name for name in FILES if name.startswith(split)])  # this split's two files
        try:
            dataset = self._torchvision(train=train, download=False)
        except (AssertionError, RuntimeError, TypeError, ValueError) as err:
            raise InputError(
                f"cannot decode the {self.dataset} {split} files in {self.raw_dir} ({err!r}); "
                "delete them to download them again, or replace them by hand"
            ) from err
        self._check_labels(dataset.targets, self.raw_dir / f"{split}-labels-idx1-ubyte")
        return dataset.data, dataset.targets

    def _check_labels(self, labels: Tensor, path: Path) -> None:
        """Refused when read, not when their batch is reached (an IndexError hours in; on a GPU a
        device-side assert that names nothing)."""
        bad = ((labels < 0) | (labels >= self.num_classes)).nonzero()
        if len(bad):
            index = int(bad[0])
            raise InputError(
                f"{path}: label {int(labels[index])} at index {index} is not a class of 0..{self.num_classes - 1} "
                f"({len(bad):,} such labels); fix the file, or set model.net.num_classes to the number of classes"
            )

    def _dataset_class(self) -> Any:  # a torchvision.datasets.MNIST class
        import torchvision.datasets

        found = getattr(torchvision.datasets, self.dataset, None)
        if not (isinstance(found, type) and issubclass(found, torchvision.datasets.MNIST)):
            raise InputError(
                f"data.dataset={self.dataset}: not a torchvision data set in MNIST's format "
                "(MNIST, FashionMNIST, KMNIST, QMNIST, EMNIST)"
            )
        return found

    def _torchvision(self, train: bool, download: bool) -> Any:
        return self._dataset_class()(self.raw_dir.parent.parent, train=train, download=download)

    def _check_sizes(self, names: tuple[str, ...] | list[str] = FILES) -> None:
        """Each file holds what its header says: a copy cut short (a download, a disk) is caught here."""
        for name in names:
            path = self.raw_dir / name
            if not path.is_file():
                raise InputError(self._missing_message([name], "it is not there"))
            with path.open("rb") as file:
                header = file.read(4)
                dimensions = header[3] if len(header) == 4 and header[:3] == b"\0\0\x08" else 0
                sizes = [int.from_bytes(file.read(4), "big") for _ in range(dimensions)]
            if not dimensions:
                raise InputError(f"{path} is not an IDX file of bytes (its first 4 bytes are {header!r})")
            if (found := path.stat().st_size) != (size := 4 + 4 * dimensions + math.prod(sizes)):
                raise InputError(
                    f"{path} has {found:,} bytes where its header says {size:,}: the file is truncated; "
                    "delete it to download it again, or replace it by hand"
                )

    def _missing_message(self, missing: list[str], why: str) -> str:
        return (
            f"{self.dataset} is missing from {self.raw_dir} ({why}): {', '.join(missing)}. Place the four files "
            f"{', '.join(FILES)} there by hand (the uncompressed IDX files, as torchvision.datasets.{self.dataset} "
            "downloads them), or point paths.data_dir (or the DATA_DIR environment variable) at a folder holding "
            f"{self.dataset}/raw/ with them"
        )


@contextmanager
def _socket_timeout(seconds: float) -> Iterator[None]:
    """A timeout for every connection and read this process opens meanwhile: torchvision's downloads
    take none, and a mirror that never answers would hold the run for minutes, silently."""
    before = socket.getdefaulttimeout()
    socket.setdefaulttimeout(seconds)
    try:
        yield
    finally:
        socket.setdefaulttimeout(before)
