# Part of the MNIST example: a project generated without it has no such file.
"""The MNIST data module (the example's): the official split, the files checked and decoded, the data sets
in MNIST's format, and the settings of its own that the config checks."""

import functools
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra.utils import instantiate

from mnistlab.data import FILES, MNISTDataModule
from mnistlab.runtime.config import schema
from mnistlab.runtime.data.in_memory import PAD_LABEL
from mnistlab.runtime.run.failures import InputError
from mnistlab.tasks import train

import composing
import running
from composing import DATA_DIR, OWN, ROOT, SHORT

pytestmark = pytest.mark.yours  # reads your task: pytest -m yours (docs/make-it-yours.md)

# The example's own tests: they train what conf/ composes by default (the suite's task is the machinery's).
compose_config = functools.partial(composing.compose_config, task=OWN)
run_script = functools.partial(running.run_script, task=OWN)


@pytest.fixture(scope="module")
def datamodule() -> MNISTDataModule:
    dm = MNISTDataModule(DATA_DIR, batch_size=64)
    dm.prepare_data()
    dm.setup("fit")
    dm.setup("test")
    return dm


def test_official_split_sizes_and_no_overlap(datamodule: MNISTDataModule) -> None:
    train, val = datamodule.split_indices()
    assert (len(train), len(val)) == (55_000, 5_000)
    assert len(set(train.tolist()) | set(val.tolist())) == 60_000
    assert datamodule.loaders["test"].sampler.num_samples == 10_000
    # Seeded: every rank and every run draws the same split.
    again = MNISTDataModule(DATA_DIR).split_indices()
    assert torch.equal(train, again[0]) and torch.equal(val, again[1])


def test_the_run_record_names_the_four_files_read(datamodule: MNISTDataModule) -> None:
    files = datamodule.data_files()  # their checksums go into run_info.json (tests/test_run_record.py)
    assert sorted(p.name for p in files) == sorted(FILES) and all(p.parent == datamodule.raw_dir for p in files)
    assert all(p.is_file() for p in files) and len(files) == 4


def test_k_folds_are_disjoint_cover_the_training_set_and_leave_the_test_set_alone() -> None:
    folds = [MNISTDataModule(DATA_DIR, folds=5, fold=i).split_indices() for i in range(5)]
    validation = torch.cat([val for _, val in folds])
    assert sorted(validation.tolist()) == list(range(60_000))  # each training image validates exactly once
    for train_part, val in folds:
        assert len(val) == 12_000 and len(train_part) == 48_000
        assert not set(train_part.tolist()) & set(val.tolist())
    datamodule = MNISTDataModule(DATA_DIR, folds=5, fold=3)
    datamodule.setup("fit")
    datamodule.setup("test")
    assert datamodule.loaders["val"].sampler.num_samples == 12_000
    assert datamodule.loaders["train"].sampler.num_samples == 48_000
    assert datamodule.loaders["test"].sampler.num_samples == 10_000  # the official test set, untouched
    for bad in ({"folds": 5, "fold": 5}, {"folds": 0, "fold": 0}, {"folds": 3, "fold": -1}):
        with pytest.raises(InputError, match="data.fold="):
            MNISTDataModule(DATA_DIR, **bad)


def test_batches_are_normalised_float_images_with_int_labels(datamodule: MNISTDataModule) -> None:
    x, y = next(iter(datamodule.train_dataloader()))
    assert x.dtype == torch.float32 and x.shape == (64, 1, 28, 28)
    assert y.dtype == torch.int64 and y.shape == (64,) and 0 <= y.min() and y.max() <= 9
    lowest, highest = -0.1307 / 0.3081, (1 - 0.1307) / 0.3081
    assert x.min() >= lowest - 1e-5 and x.max() <= highest + 1e-5
    assert len(datamodule.train_dataloader()) == 860  # ceil(55,000 / 64)


def test_every_test_image_is_served_once(datamodule: MNISTDataModule) -> None:
    labels = torch.cat([y for _, y in datamodule.test_dataloader()])
    real = labels[labels != PAD_LABEL]
    assert len(real) == 10_000
    assert torch.equal(real, datamodule.loaders["test"].targets)


def test_missing_files_name_the_folder_and_the_files(tmp_path: Path) -> None:
    dm = MNISTDataModule(str(tmp_path), download=False)
    with pytest.raises(InputError) as err:
        dm.prepare_data()
    message = str(err.value)
    assert str(tmp_path / "MNIST" / "raw") in message and all(name in message for name in FILES)


def test_failed_download_says_how_to_place_the_files(tmp_path: Path, monkeypatch) -> None:
    from torchvision.datasets import MNIST

    def offline(self) -> None:
        raise RuntimeError("Error downloading train-images-idx3-ubyte.gz")

    monkeypatch.setattr(MNIST, "download", offline)
    with pytest.raises(InputError, match="by hand"):
        MNISTDataModule(str(tmp_path)).prepare_data()


def _copy_of_mnist(tmp_path: Path) -> Path:
    raw = tmp_path / "MNIST" / "raw"
    shutil.copytree(Path(DATA_DIR) / "MNIST" / "raw", raw)
    for path in raw.iterdir():
        path.chmod(0o644)
    return raw


def test_truncated_file_is_refused_with_its_size(tmp_path: Path) -> None:
    raw = _copy_of_mnist(tmp_path)
    with open(raw / "t10k-labels-idx1-ubyte", "r+b") as file:
        file.truncate(5_000)
    dm = MNISTDataModule(str(tmp_path))
    with pytest.raises(InputError, match="t10k-labels-idx1-ubyte has 5,000 bytes where its header says 10,008"):
        dm.prepare_data()


def test_malformed_file_is_refused_clearly(tmp_path: Path) -> None:
    raw = _copy_of_mnist(tmp_path)
    with open(raw / "t10k-images-idx3-ubyte", "r+b") as file:
        file.write(b"\xff" * 16)  # a broken header, at the right size
    with pytest.raises(InputError, match=r"t10k-images-idx3-ubyte is not an IDX file of bytes \(its first 4 bytes"):
        MNISTDataModule(str(tmp_path)).prepare_data()


def test_lightning_sets_the_epoch_so_each_epoch_reshuffles(tmp_path: Path) -> None:
    import functools

    import lightning as L

    from mnistlab.module import Classifier
    from mnistlab.network import SimpleNN

    first_batches = []

    class FirstBatch(L.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
            if batch_idx == 0:
                first_batches.append(batch[1].clone())

    dm = MNISTDataModule(DATA_DIR, batch_size=64)
    model = Classifier(SimpleNN(), functools.partial(torch.optim.Adam, lr=1e-3))
    trainer = L.Trainer(
        max_epochs=2,
        limit_train_batches=2,
        limit_val_batches=0,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        callbacks=[FirstBatch()],
        default_root_dir=tmp_path,
    )
    trainer.fit(model, datamodule=dm)
    assert dm.loaders["train"].sampler.epoch == 1
    assert len(first_batches) == 2 and not torch.equal(first_batches[0], first_batches[1])


def _write_idx(path: Path, array: np.ndarray) -> None:
    """An IDX file as MNIST's: magic number 0x0000080<dimensions>, the dimensions, the bytes."""
    header = bytes([0, 0, 8, array.ndim]) + b"".join(size.to_bytes(4, "big") for size in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def _small_data_set(raw: Path, train: int = 300, test: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """Random images and labels in the real format; returns the test images and labels."""
    rng = np.random.default_rng(0)
    raw.mkdir(parents=True)
    for split, count in (("train", train), ("t10k", test)):
        images, labels = rng.integers(0, 256, (count, 28, 28)), rng.integers(0, 10, count)
        _write_idx(raw / f"{split}-images-idx3-ubyte", images)
        _write_idx(raw / f"{split}-labels-idx1-ubyte", labels)
    return images, labels


@pytest.mark.parametrize(
    "option,folder,mean,std", [("fashion_mnist", "FashionMNIST", 0.2860, 0.3530), ("kmnist", "KMNIST", 0.1918, 0.3483)]
)
def test_other_data_sets_in_mnists_format_are_one_option_away(option, folder, mean, std, tmp_path: Path) -> None:
    images, labels = _small_data_set(tmp_path / "data" / folder / "raw")
    overrides = [f"data={option}", f"paths.data_dir={tmp_path / 'data'}", "data.val_size=60", "data.download=false"]
    cfg = compose_config("train", tmp_path / "run", [*overrides, *SHORT, "logger=none"])
    datamodule = instantiate(cfg.data)
    datamodule.prepare_data()
    datamodule.setup("test")
    x, y = next(iter(datamodule.test_dataloader()))  # the same in-memory loader, the data set's own mean and std
    assert torch.allclose(x[:, 0], (torch.from_numpy(images[:64]).float() / 255 - mean) / std, atol=1e-5)
    assert torch.equal(y, torch.from_numpy(labels[:64]))
    metrics = train(cfg)
    assert metrics["val/samples"] == 60 and metrics["test/samples"] == 100


def test_another_data_set_downloads_its_own_files(tmp_path: Path, monkeypatch) -> None:
    from torchvision.datasets import KMNIST

    fetched = []
    monkeypatch.setattr(KMNIST, "download", lambda self: fetched.append(self.raw_folder) or None)
    with pytest.raises(InputError, match=r"KMNIST is missing from .*/KMNIST/raw"):  # the stub fetched nothing
        MNISTDataModule(str(tmp_path), dataset="KMNIST").prepare_data()
    assert fetched and fetched[0] == str(tmp_path / "KMNIST" / "raw")


def test_a_validation_split_as_large_as_the_training_files_is_refused(tmp_path: Path) -> None:
    schema.check(compose_config("train", tmp_path, ["data.val_size=70000"]), schema.TrainConfig)  # a number:
    with pytest.raises(InputError, match=r"^data.val_size=70000 must be between 1 and 59,999 \(of 60,000 training"):
        MNISTDataModule(DATA_DIR, val_size=70_000)  # the data module itself judges it


@pytest.mark.slow
def test_a_data_folder_that_cannot_be_read_is_one_line_and_leaves_no_run_folder(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    result = run_script("train.py", f"paths.data_dir={tmp_path / 'file'}", f"paths.log_dir={tmp_path / 'out'}")
    assert result.returncode == 1
    assert result.stderr.strip().startswith(f"Error: MNIST is missing from {tmp_path / 'file' / 'MNIST' / 'raw'}")
    assert "Traceback" not in result.stderr
    assert not list((tmp_path / "out" / "train" / "runs").iterdir())


def test_paths_follow_the_environment(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("DATA_DIR", "/somewhere/mnist")
    cfg = compose_config("train", tmp_path)
    assert cfg.paths.data_dir == cfg.data.data_dir == "/somewhere/mnist"
    monkeypatch.delenv("DATA_DIR")
    assert compose_config("train", tmp_path).paths.data_dir == f"{ROOT}/data"


@pytest.mark.slow
def test_defaults_reach_98_percent(tmp_path: Path) -> None:
    """The default config, unchanged (10 epochs, cosine schedule): the best checkpoint must reach 98%
    test accuracy; the seed's recipe (a constant lr) reached 97.5%."""
    metrics = train(compose_config("train", tmp_path, ["logger=none"]))
    assert metrics["test/acc"] >= 0.98


def test_a_label_outside_the_classes_is_refused_when_read(tmp_path: Path) -> None:
    raw = tmp_path / "MNIST" / "raw"
    _small_data_set(raw)
    labels = np.frombuffer((raw / "train-labels-idx1-ubyte").read_bytes()[8:], np.uint8).copy()
    labels[[17, 40]] = [12, 200]
    _write_idx(raw / "train-labels-idx1-ubyte", labels)
    dm = MNISTDataModule(str(tmp_path), val_size=60, download=False)
    dm.prepare_data()
    with pytest.raises(InputError) as refused:
        dm.setup("fit")  # read at setup, before any batch: not an IndexError hours in
    assert str(refused.value).startswith(
        f"{raw / 'train-labels-idx1-ubyte'}: label 12 at index 17 is not a class of 0..9 (2 such labels)"
    )


def test_a_mirror_that_never_answers_fails_within_the_timeout_in_one_line(tmp_path: Path, monkeypatch) -> None:
    """A server that accepts the connection and then says nothing: without a timeout, torchvision waits
    for minutes per mirror, silently."""
    import socket

    from torchvision.datasets import MNIST

    with socket.create_server(("127.0.0.1", 0)) as silent:  # listens; never accepts, never answers
        monkeypatch.setattr(MNIST, "mirrors", [f"http://127.0.0.1:{silent.getsockname()[1]}/"])
        started = time.monotonic()
        with pytest.raises(InputError) as refused:
            MNISTDataModule(str(tmp_path), download_timeout=0.5).prepare_data()
    assert time.monotonic() - started < 30  # 4 files x 1 mirror x (redirect check + download) x 0.5 s, and start-up
    message = str(refused.value)
    assert "the download failed" in message and "timed out" in message and "\n" not in message
    assert socket.getdefaulttimeout() is None  # the process's default is given back


def test_a_data_set_name_from_a_checkpoint_looks_up_only_mnists_kin(tmp_path: Path) -> None:
    """data.dataset names a torchvision class: from a checkpoint's config (export.py) it is data."""
    for name in ("os", "ImageFolder", "utils"):
        with pytest.raises(InputError, match=f"data.dataset={name}: not a torchvision data set in MNIST's format"):
            MNISTDataModule(str(tmp_path), dataset=name)
    assert MNISTDataModule(str(tmp_path), dataset="FashionMNIST").dataset == "FashionMNIST"
