"""Shapes: RGB images in plain DataLoaders (torchvision's FakeData stands in for a real set)."""

import lightning as L
from torch.utils.data import DataLoader
from torchvision import datasets, transforms


class ShapesData(L.LightningDataModule):
    def __init__(self, batch_size: int = 32, image_size: int = 32, classes: int = 5, num_workers: int = 0) -> None:
        super().__init__()
        self.batch_size, self.image_size, self.classes, self.num_workers = batch_size, image_size, classes, num_workers

    def _loader(self, size: int, offset: int, shuffle: bool) -> DataLoader:
        images = datasets.FakeData(
            size, (3, self.image_size, self.image_size), self.classes, transforms.ToTensor(), random_offset=offset
        )
        return DataLoader(images, self.batch_size, shuffle=shuffle, num_workers=self.num_workers)

    def train_dataloader(self) -> DataLoader:
        return self._loader(2000, 0, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(500, 10_000, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(500, 20_000, shuffle=False)
