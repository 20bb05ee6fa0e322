"""Small Fashion-MNIST classifiers, for the analysis tests, the CUI validation experiment and
as ``package.module:factory`` examples: ``split-export analyze exporter.zoo:fmnist_vgg ...``.

Two families, because I-SPLIT's claim should hold on more than one shape of graph: a plain
VGG-style stack (every layer is a cut point) and a residual network (cuts only between blocks).
"""

from __future__ import annotations

import torch
from torch import nn

from exporter._datasets import FASHION_MNIST_CLASSES

__all__ = ["Grey", "fmnist_camera", "fmnist_resnet", "fmnist_vgg"]


class Grey(nn.Module):
    """RGB (B, 3, H, W) → luma (B, 1, H, W) (ITU-R BT.601): a grey model's input from a camera,
    whose frames the board always makes RGB. Three equal channels pass through unchanged."""

    def __init__(self) -> None:
        super().__init__()
        # Not persistent: a constant of the conversion, not a weight.
        self.register_buffer("luma", torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * self.luma).sum(1, keepdim=True)


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


def fmnist_camera() -> nn.Module:
    """:func:`fmnist_vgg` behind :class:`Grey`: (3, 28, 28) RGB in [0, 1] → 10 classes, so that
    ``split-device run`` can feed it camera frames (scaled to 28x28, no normalisation)."""
    return nn.Sequential(Grey(), *fmnist_vgg())


# What split-export reads off the factory: the board scales frames to 28x28 in [0, 1], as Fashion-MNIST is read.
fmnist_camera.splitedge_preprocessing = {"resize": 28, "crop": 28, "mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0]}  # type: ignore[attr-defined]
fmnist_camera.splitedge_labels = list(FASHION_MNIST_CLASSES)  # type: ignore[attr-defined]


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


def main(argv: list[str] | None = None) -> None:
    """``python -m exporter.zoo fmnist_vgg --out weights.pt``: train a zoo model on Fashion-MNIST and
    save its state dict, for ``split-export build exporter.zoo:fmnist_vgg --weights weights.pt``."""
    import argparse

    from exporter._datasets import load_images
    from exporter._train import accuracy, train_classifier

    factories = {f.__name__: f for f in (fmnist_vgg, fmnist_resnet, fmnist_camera)}
    parser = argparse.ArgumentParser(
        prog="python -m exporter.zoo", description=main.__doc__,
        epilog="example: python -m exporter.zoo fmnist_vgg --images 10000 --epochs 1 --out build/fmnist-vgg.pt")
    parser.add_argument("model", choices=sorted(factories))
    parser.add_argument("--out", required=True, help="where to save the state dict")
    parser.add_argument("--images", type=int, default=None, help="train on this many images, stratified (default: all 60,000)")
    parser.add_argument("--epochs", type=int, default=1, help="default 1")
    args = parser.parse_args(argv)
    # Its first weights from a fixed seed, as its training's order is: unseeded, one epoch of
    # fmnist_resnet reached 0.52 top-1 in one fresh clone and 0.76 in another.
    torch.manual_seed(0)
    model = factories[args.model]()
    shape = (3, 28, 28) if isinstance(model[0], Grey) else (1, 28, 28)
    train = load_images("fashion-mnist:train", shape).subset(args.images)
    train_classifier(model, train, epochs=args.epochs)
    torch.save(model.state_dict(), args.out)
    print(f"wrote {args.out}: {args.model} trained {args.epochs} epoch(s) on {train.source}; top-1 on the 10,000 "
          f"test images {accuracy(model, load_images('fashion-mnist:test', shape)):.4f}")


if __name__ == "__main__":
    main()
