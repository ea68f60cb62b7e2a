"""What a test leaves to look at rather than read: the confusion matrix and a grid of misclassified test
digits labelled with prediction and truth, in every configured logger (TensorBoard's IMAGES, MLflow's
artifacts, W&B's media); in TensorBoard, the run's logged hyperparameters beside its final metrics in
the HPARAMS view (the runs of a sweep side by side); optionally the confusion matrix as a PNG file
(``eval.py`` writes one in its folder).

The confusion matrix is a torchmetrics metric: each rank counts its share, ``compute`` adds them up.
The misclassified digits are global rank 0's first ones: a sample to look at, not a statistic.
"""

import io
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.logger import _convert_params, _flatten_dict, _sanitize_params
from lightning.pytorch.loggers import Logger, MLFlowLogger, TensorBoardLogger, WandbLogger
from lightning.pytorch.utilities import rank_zero_only
from matplotlib.figure import Figure
from PIL import Image
from torchmetrics.classification import MulticlassConfusionMatrix

from mnistlab.runtime.batches import PAD_LABEL

PICTURE_LOGGERS = (TensorBoardLogger, MLFlowLogger, WandbLogger)  # the loggers that keep pictures (_send)


class TestPictures(L.Callback):
    def __init__(self, num_classes: int = 10, misclassified: int = 32, png_dir: str | None = None) -> None:
        self.num_classes = num_classes
        self.misclassified = misclassified  # digits shown in the grid
        self.png_dir = Path(png_dir) if png_dir else None  # where confusion_matrix.png goes; None: nowhere
        self._matrix = MulticlassConfusionMatrix(num_classes, ignore_index=PAD_LABEL, validate_args=False)
        self._wrong: list[tuple[torch.Tensor, int, int]] = []  # (image, predicted, true)
        self._fit_metrics: dict[str, float] = {}

    def on_test_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._matrix = self._matrix.to(pl_module.device)
        self._matrix.reset()
        self._wrong.clear()

    def on_test_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, logits: Any, batch: Any, *args: Any
    ) -> None:
        x, y = batch
        self._matrix.update(logits, y)
        if trainer.is_global_zero and len(self._wrong) < self.misclassified:
            predicted = logits.argmax(dim=1)
            wanted = self.misclassified - len(self._wrong)
            for i in ((predicted != y) & (y != PAD_LABEL)).nonzero().flatten()[:wanted].tolist():
                self._wrong.append((x[i, 0].cpu(), int(predicted[i]), int(y[i])))

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        counts = self._matrix.compute().cpu()  # every rank takes part: it adds up their counts
        self._draw(trainer, counts)

    @rank_zero_only
    def _draw(self, trainer: L.Trainer, counts: torch.Tensor) -> None:
        # Figures of their own, not pyplot's: no backend to choose, nothing global (a notebook keeps its
        # inline display), nothing to close.
        keepers = [logger for logger in trainer.loggers if isinstance(logger, PICTURE_LOGGERS)]
        if not keepers and self.png_dir is None:
            return  # nobody keeps pictures (logger=none or csv, fast_dev_run): 0.7 s of matplotlib saved
        matrix = Figure(figsize=(7, 7))
        self._matrix.plot(val=counts, ax=matrix.subplots(), labels=[str(c) for c in range(self.num_classes)])
        if keepers:
            figures = {"test/confusion_matrix": matrix, "test/misclassified": _grid(self._wrong[: self.misclassified])}
            for logger in keepers:
                for name, figure in figures.items():
                    _send(logger, name, figure, trainer.global_step)
        if self.png_dir is not None:
            matrix.savefig(self.png_dir / "confusion_matrix.png", dpi=100, bbox_inches="tight")

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._fit_metrics = {name: float(value) for name, value in trainer.callback_metrics.items()}

    @rank_zero_only
    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The run's logged hyperparameters beside the names of its final metrics (fit's, which testing
        clears, and the test's), for TensorBoard's HPARAMS view. Only the names: HPARAMS shows each
        metric's last logged value, and logging the values again here (as ``log_hyperparams`` with
        ``metrics`` does) would add a point at the test's step to every validation curve."""
        names = {*self._fit_metrics, *trainer.callback_metrics}
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger) and logger.hparams:
                # Here, not at the top: 0.1 s of start-up (tensorboard's stub of TensorFlow) for every run
                from torch.utils.tensorboard.summary import hparams

                # Flattened and made plain as TensorBoardLogger.log_hyperparams does: model/optimizer/lr
                params = _sanitize_params(_flatten_dict(_convert_params(logger.hparams)))
                experiment, start, end = hparams(params, dict.fromkeys(sorted(names), 0.0))
                writer = logger.experiment._get_file_writer()  # as TensorBoardLogger.log_hyperparams does
                for summary in (experiment, start, end):
                    writer.add_summary(summary)


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


def _grid(wrong: list[tuple[torch.Tensor, int, int]], columns: int = 8) -> Figure:
    rows = max(1, -(-len(wrong) // columns))
    figure = Figure(figsize=(columns * 1.2, rows * 1.4))
    axes = figure.subplots(rows, columns, squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, (image, predicted, true) in zip(axes.flat, wrong, strict=False):
        ax.imshow(image.numpy(), cmap="gray")
        ax.set_title(f"{predicted} (true {true})", fontsize=8, color="crimson")
    figure.suptitle(f"Misclassified test digits: prediction (truth), {len(wrong)} shown")
    figure.tight_layout()
    return figure
