"""What a test leaves to look at rather than read: the confusion matrix and a grid of misclassified test
images (grey or RGB, any size) labelled with prediction and truth, in every configured logger (TensorBoard's
IMAGES, MLflow's artifacts, W&B's media); optionally the confusion matrix as a PNG file (``eval.py`` writes
one in its folder).

The confusion matrix is a torchmetrics metric: each rank counts its share, ``compute`` adds them up.
The misclassified images are global rank 0's first ones: a sample to look at, not a statistic. What the
callback needs of the module is that ``test_step`` returns the batch's logits, (batch, classes); the
number of classes is read from them. A module whose ``test_step`` returns something else (a regression's
predictions) gets a one-line notice and no pictures; inputs that are not images, no grid.
"""

import io
import logging
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import Logger, MLFlowLogger, TensorBoardLogger, WandbLogger
from lightning.pytorch.utilities import rank_zero_only
from matplotlib.figure import Figure
from PIL import Image
from torchmetrics.classification import MulticlassConfusionMatrix

from mnistlab.runtime.data.in_memory import PAD_LABEL

PICTURE_LOGGERS = (TensorBoardLogger, MLFlowLogger, WandbLogger)  # the loggers that keep pictures (_send)
log = logging.getLogger(__name__)


class TestPictures(L.Callback):
    def __init__(self, misclassified: int = 32, png_dir: str | None = None) -> None:
        self.misclassified = misclassified  # images shown in the grid
        self.png_dir = Path(png_dir) if png_dir else None  # where confusion_matrix.png goes; None: nowhere
        self._matrix: MulticlassConfusionMatrix | None = None  # made at the first batch: its logits say the classes
        self._skipped = False  # the module's test_step gives no logits: nothing to draw, said once
        self._wrong: list[tuple[torch.Tensor, int, int]] = []  # (image, predicted, true)

    def on_test_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._matrix is not None:
            self._matrix.reset()
        self._wrong.clear()

    def on_test_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, logits: Any, batch: Any, *args: Any
    ) -> None:
        if self._skipped or not self._classifies(logits, batch, trainer):
            return
        assert self._matrix is not None
        x, y = batch
        self._matrix.update(logits, y)
        if trainer.is_global_zero and len(self._wrong) < self.misclassified and _is_image_batch(x):
            predicted = logits.argmax(dim=1)
            wanted = self.misclassified - len(self._wrong)
            for i in ((predicted != y) & (y != PAD_LABEL)).nonzero().flatten()[:wanted].tolist():
                self._wrong.append((x[i].float().cpu(), int(predicted[i]), int(y[i])))

    def _classifies(self, logits: Any, batch: Any, trainer: L.Trainer) -> bool:
        """Whether the test gives (batch, classes) logits for (inputs, labels) batches; said once where not."""
        if self._matrix is not None:
            return True
        labels = batch[1] if isinstance(batch, list | tuple) and len(batch) == 2 else None
        if not (
            isinstance(logits, torch.Tensor)
            and logits.ndim == 2
            and logits.is_floating_point()
            and isinstance(labels, torch.Tensor)
            and labels.ndim == 1
            and not labels.is_floating_point()
        ):
            self._skipped = True
            if trainer.is_global_zero:
                log.info(
                    "Test pictures: test_step gives no (batch, classes) logits for (inputs, labels) batches, so no "
                    "confusion matrix is drawn (callbacks.test_pictures=null leaves this notice out)"
                )
            return False
        self._matrix = MulticlassConfusionMatrix(logits.shape[1], ignore_index=PAD_LABEL, validate_args=False)
        self._matrix = self._matrix.to(logits.device)
        if trainer.is_global_zero and not _is_image_batch(batch[0]):
            log.info(
                "Test pictures: inputs of shape %s are no images: a confusion matrix, no grid", tuple(batch[0].shape)
            )
        return True

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._matrix is None:
            return
        counts = self._matrix.compute().cpu()  # every rank takes part: it adds up their counts
        self._draw(trainer, counts)

    @rank_zero_only
    def _draw(self, trainer: L.Trainer, counts: torch.Tensor) -> None:
        # Figures of their own, not pyplot's: no backend to choose, nothing global (a notebook keeps its
        # inline display), nothing to close.
        keepers = [logger for logger in trainer.loggers if isinstance(logger, PICTURE_LOGGERS)]
        if not keepers and self.png_dir is None:
            return  # nobody keeps pictures (logger=none or csv, fast_dev_run): 0.7 s of matplotlib saved
        assert self._matrix is not None
        matrix = Figure(figsize=(7, 7))
        self._matrix.plot(val=counts, ax=matrix.subplots(), labels=[str(c) for c in range(len(counts))])
        if keepers:
            figures = {"test/confusion_matrix": matrix, "test/misclassified": _grid(self._wrong[: self.misclassified])}
            for logger in keepers:
                for name, figure in figures.items():
                    _send(logger, name, figure, trainer.global_step)
        if self.png_dir is not None:
            matrix.savefig(self.png_dir / "confusion_matrix.png", dpi=100, bbox_inches="tight")


def _send(logger: Logger, name: str, figure: Figure, step: int) -> None:
    """A figure into a logger, as that logger keeps pictures."""
    if isinstance(logger, TensorBoardLogger):
        logger.experiment.add_figure(name, figure, step, close=False)
    elif isinstance(logger, MLFlowLogger) and logger.run_id:
        logger.experiment.log_figure(logger.run_id, figure, f"{name}.png")
    elif isinstance(logger, WandbLogger):
        logger.log_image(key=name, images=[_png(figure)], step=step)


def _png(figure: Figure) -> Image.Image:
    file = io.BytesIO()
    figure.savefig(file, format="png", dpi=100, bbox_inches="tight")
    return Image.open(io.BytesIO(file.getvalue()))


def _is_image_batch(x: Any) -> bool:
    """(batch, channels, height, width) with grey (1) or RGB (3) channels."""
    return isinstance(x, torch.Tensor) and x.ndim == 4 and x.shape[1] in (1, 3)


def _shown(image: torch.Tensor) -> torch.Tensor:
    """A (channels, height, width) input as matplotlib shows it: (height, width) grey or (height, width, 3)
    RGB, scaled into 0..1 (inputs arrive standardised)."""
    low, high = image.min(), image.max()
    scaled = (image - low) / (high - low) if high > low else torch.zeros_like(image)
    return scaled[0] if scaled.shape[0] == 1 else scaled.permute(1, 2, 0)


def _grid(wrong: list[tuple[torch.Tensor, int, int]], columns: int = 8) -> Figure:
    # One image of tiles on one axes, each labelled above: a subplot per image with tight_layout took 0.5 s
    # of each test's end for 32 images, this 0.06 s (2026-12-08).
    rows = max(1, -(-len(wrong) // columns))
    shown = [_shown(image) for image, _, _ in wrong]
    height, width = shown[0].shape[:2] if shown else (28, 28)
    cell_h, cell_w = height + max(2, height // 3), width + max(1, width // 7)  # room for a label, a gap
    tiles = torch.ones(rows * cell_h, columns * cell_w, *shown[0].shape[2:] if shown else ())  # white between
    figure = Figure(figsize=(columns * 1.2, rows * 1.4))
    ax = figure.add_axes((0, 0, 1, 0.9))
    ax.axis("off")
    for i, (image, (_, predicted, true)) in enumerate(zip(shown, wrong, strict=True)):
        top, left = (i // columns) * cell_h + cell_h - height, (i % columns) * cell_w
        tiles[top : top + height, left : left + width] = image
        label = f"{predicted} (true {true})"  # above the tile: pixel i spans i - 0.5 .. i + 0.5
        ax.text(left + (width - 1) / 2, top - 0.5, label, ha="center", va="bottom", fontsize=8, color="crimson")
    ax.imshow(tiles.numpy(), cmap="gray", vmin=0, vmax=1, interpolation="nearest")
    figure.suptitle(f"Misclassified test images: prediction (truth), {len(wrong)} shown")
    return figure
