"""A regression: predict the mean brightness of an image."""

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics import MeanSquaredError


class Brightness(L.LightningDataModule):
    def __init__(self, batch_size: int = 32, size: int = 16) -> None:
        super().__init__()
        self.batch_size, self.size = batch_size, size

    def _loader(self, count: int, seed: int, shuffle: bool) -> DataLoader:
        images = torch.rand(count, 3, self.size, self.size, generator=torch.Generator().manual_seed(seed))
        return DataLoader(TensorDataset(images, images.mean(dim=(1, 2, 3))), self.batch_size, shuffle=shuffle)

    def train_dataloader(self) -> DataLoader:
        return self._loader(1024, 0, True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(256, 1, False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(256, 2, False)


class Pooled(nn.Module):
    """Each channel's mean, then a linear layer: enough to tell brightness."""

    def __init__(self, channels: int = 3, outputs: int = 1) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, outputs))

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)


class Regressor(L.LightningModule):
    def __init__(self, net: nn.Module, lr: float = 1e-3) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["net"])
        self.net = net
        self.val_mse, self.test_mse = MeanSquaredError(), MeanSquaredError()

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x).squeeze(1)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self.val_mse.update(self(batch[0]), batch[1])
        self.log("val/loss", self.val_mse)

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        predictions = self(batch[0])
        self.test_mse.update(predictions, batch[1])
        self.log("test/loss", self.test_mse)
        return predictions

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
