"""Small Fashion-MNIST classifiers, for the analysis tests, the CUI validation experiment and
as ``package.module:factory`` examples: ``split-export analyze exporter.zoo:fmnist_vgg ...``.

Two families, because I-SPLIT's claim should hold on more than one shape of graph: a plain
VGG-style stack (every layer is a cut point) and a residual network (cuts only between blocks).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["fmnist_vgg", "fmnist_resnet"]


def _conv(cin: int, cout: int, stride: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]


def fmnist_vgg() -> nn.Module:
    """(1, 28, 28) → 10 classes: three VGG stages (16, 32, 64 channels) and a two-layer classifier."""
    return nn.Sequential(
        *_conv(1, 16), *_conv(16, 16), nn.MaxPool2d(2),  # 16x14x14
        *_conv(16, 32), *_conv(32, 32), nn.MaxPool2d(2),  # 32x7x7
        *_conv(32, 64), nn.MaxPool2d(2),  # 64x3x3
        nn.Flatten(), nn.Linear(64 * 3 * 3, 128), nn.ReLU(), nn.Linear(128, 10),
    )  # fmt: skip


class _Block(nn.Module):
    """A basic residual block; a 1x1 projection when the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(*_conv(cin, cout, stride), nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout))
        self.skip = (
            nn.Identity() if stride == 1 and cin == cout
            else nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))
        )  # fmt: skip
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.body(x) + self.skip(x))


def fmnist_resnet() -> nn.Module:
    """(1, 28, 28) → 10 classes: a stem and five residual blocks (16 → 32 → 64 channels)."""
    return nn.Sequential(
        *_conv(1, 16),
        _Block(16, 16, 1), _Block(16, 32, 2), _Block(32, 32, 1), _Block(32, 64, 2), _Block(64, 64, 1),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
    )  # fmt: skip
