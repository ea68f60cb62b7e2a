"""A small CNN for RGB images."""

from torch import Tensor, nn


class CNN(nn.Module):
    def __init__(self, channels: int = 3, width: int = 16, classes: int = 5) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv2d(channels, width, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(width, classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.layers(x)
