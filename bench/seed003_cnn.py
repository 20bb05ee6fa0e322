"""The DNN-slicing simulator's 14-layer CNN (seed-003 paper, Table 1), as ``bench.seed003_cnn:make``.

Table 1 gives the layers in tf.Keras terms with their output shapes (NHWC) and parameter
counts; here they are in torch (NCHW), one module per Keras layer, named ``l<#>_<type>`` after
the table's row, so that a cut "after layer 3" is the cut point ``l3_maxpool``. Where the table
is ambiguous or Keras and torch differ, what was chosen:

* **Input.** Layer 1's 320 parameters (3·3·1·32 + 32) and its 26x26 output mean a 28x28x1 input
  (Fashion-MNIST's, so no resizing is needed). A board's camera frames are RGB and its
  preprocessing always gives 3 channels, so the model takes (3, 28, 28) and converts it to grey
  first (``l0_grey``: ITU-R BT.601 luma, no parameters). Fashion-MNIST's grey images fed as
  three equal channels pass through it unchanged (the weights sum to 1).
* **Layer 4's output shape.** The table says (12, 12, 128), but a batch norm keeps its input's
  64 channels, and its 256 parameters are 4·64 (layer 5's 73,856 = 3·3·64·128 + 128 agrees):
  (64, 12, 12) here.
* **Activations.** The table lists none (Keras puts them inside Conv2D and Dense). ReLU after
  every Conv2D and after the first Dense, as is usual for this stack; the last Dense gives
  logits rather than Keras's softmax, since the board takes the softmax itself. A cut after a
  Conv2D is after its ReLU, as a cut after a Keras Conv2D(activation="relu") would be.
* **Padding and pooling.** Keras's defaults: valid 3x3 convolutions, 2x2 pooling of stride 2
  (the table's shapes follow from exactly these).
* **Batch norm.** Keras counts four numbers per channel (gamma, beta, moving mean and
  variance), torch two parameters and two buffers: :func:`keras_params` counts them as Keras
  does. Keras's epsilon (1e-3) and momentum (0.99, torch's 0.01).

:func:`train` fits it on Fashion-MNIST (``exporter._datasets.load_images``) and saves a state
dict for ``split-export build bench.seed003_cnn:make --weights FILE``.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import torch
from torch import nn

from exporter._datasets import FASHION_MNIST_CLASSES, load_images
from exporter._train import accuracy, train_classifier
from exporter.zoo import Grey

__all__ = ["CUT_AFTER", "INPUT_SHAPE", "TABLE_1", "keras_params", "make", "train"]

INPUT_SHAPE = (3, 28, 28)
_BN_EPS, _BN_MOMENTUM = 1e-3, 0.01

#: Table 1, row by row: (layer type, output shape in torch's (C, H, W) order, Keras parameter count).
TABLE_1: tuple[tuple[str, tuple[int, ...], int], ...] = (
    ("Conv2D", (32, 26, 26), 320),
    ("Conv2D", (64, 24, 24), 18_496),
    ("MaxPooling2D", (64, 12, 12), 0),
    ("BatchNormalization", (64, 12, 12), 256),  # the table's 128 channels cannot be: see the module docstring
    ("Conv2D", (128, 10, 10), 73_856),
    ("Conv2D", (128, 8, 8), 147_584),
    ("MaxPooling2D", (128, 4, 4), 0),
    ("BatchNormalization", (128, 4, 4), 512),
    ("Conv2D", (256, 2, 2), 295_168),
    ("MaxPooling2D", (256, 1, 1), 0),
    ("Flatten", (256,), 0),
    ("BatchNormalization", (256,), 1_024),
    ("Dense", (512,), 131_584),
    ("Dense", (10,), 5_130),
)


class ReluAfter(nn.Module):
    """A Keras layer with ``activation="relu"``: the layer, then its ReLU (the cut point ``<name>_relu``)."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.layer(x))


def _conv(cin: int, cout: int) -> nn.Module:
    return ReluAfter(nn.Conv2d(cin, cout, 3))


def _bn2d(c: int) -> nn.Module:
    return nn.BatchNorm2d(c, eps=_BN_EPS, momentum=_BN_MOMENTUM)


def make() -> nn.Sequential:
    """(3, 28, 28) RGB in [0, 1] → 10 Fashion-MNIST logits: ``l0_grey``, then Table 1's 14 layers."""
    return nn.Sequential(OrderedDict([
        ("l0_grey", Grey()),
        ("l1_conv2d", _conv(1, 32)),  # (32, 26, 26)
        ("l2_conv2d", _conv(32, 64)),  # (64, 24, 24)
        ("l3_maxpool", nn.MaxPool2d(2)),  # (64, 12, 12)
        ("l4_batchnorm", _bn2d(64)),
        ("l5_conv2d", _conv(64, 128)),  # (128, 10, 10)
        ("l6_conv2d", _conv(128, 128)),  # (128, 8, 8)
        ("l7_maxpool", nn.MaxPool2d(2)),  # (128, 4, 4)
        ("l8_batchnorm", _bn2d(128)),
        ("l9_conv2d", _conv(128, 256)),  # (256, 2, 2)
        ("l10_maxpool", nn.MaxPool2d(2)),  # (256, 1, 1)
        ("l11_flatten", nn.Flatten()),  # (256,)
        ("l12_batchnorm", nn.BatchNorm1d(256, eps=_BN_EPS, momentum=_BN_MOMENTUM)),
        ("l13_dense", ReluAfter(nn.Linear(256, 512))),
        ("l14_dense", nn.Linear(512, 10)),
    ]))  # fmt: skip


# What split-export reads off the factory: the board feeds 28x28 frames in [0, 1], as Fashion-MNIST is read.
make.splitedge_preprocessing = {"resize": 28, "crop": 28, "mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0]}  # type: ignore[attr-defined]
make.splitedge_labels = list(FASHION_MNIST_CLASSES)  # type: ignore[attr-defined]

#: The cut point after each Table 1 row (1-14): the module's name, after its ReLU where it has one.
CUT_AFTER = {k: f"{name}_relu" if isinstance(layer, ReluAfter) else name
             for k, (name, layer) in enumerate(make().named_children()) if k}


def keras_params(layer: nn.Module) -> int:
    """A layer's parameter count as Keras reports it: a batch norm's moving mean and variance count."""
    stats = sum(m.running_mean.numel() + m.running_var.numel() for m in layer.modules()
                if isinstance(m, nn.modules.batchnorm._BatchNorm))
    return sum(p.numel() for p in layer.parameters()) + stats


def train(out: Path, epochs: int = 2, seed: int = 0) -> float:
    """Fit the model on Fashion-MNIST's training set, save its state dict to ``out``; its test accuracy.

    The training images are grey (1, 28, 28): the layers after ``l0_grey`` learn on them directly
    (the grey conversion of three equal channels is the identity), which keeps a 3x copy of the
    training set out of memory.
    """
    model = make()
    layers = nn.Sequential(*list(model.children())[1:])  # shares its modules with ``model``
    grey = load_images("fashion-mnist:train", (1, 28, 28))
    train_classifier(layers, grey, epochs=epochs, seed=seed, progress=False)
    test = load_images("fashion-mnist:test", (1, 28, 28))
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), out)
    return accuracy(layers, test)
