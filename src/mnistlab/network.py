"""The network: a plain ``nn.Module`` that knows nothing about Lightning."""

from torch import Tensor, nn


class SimpleNN(nn.Module):
    """The seed's two-layer perceptron: 784 -> 256 -> ReLU -> 10."""

    def __init__(self, in_features: int = 784, hidden: int = 256, num_classes: int = 10) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(in_features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        # Images arrive as (batch, 1, 28, 28); the linear layers want (batch, 784).
        return self.layers(x.flatten(1))
