"""Shared, cached models for the exporter tests: building and tracing them once per session.

Exposed as fixtures. The real MobileNetV2 weights and the photos come from ``tests/conftest.py``.
"""

from __future__ import annotations

import functools

import pytest

torch = pytest.importorskip("torch")

from exporter.datasets import load_images  # noqa: E402
from exporter.graph import CutPoint, TracedModel, find_cut_points, trace  # noqa: E402
from exporter.models import LoadedModel, load_model  # noqa: E402
from exporter.train import train_classifier  # noqa: E402
from exporter.zoo import fmnist_vgg  # noqa: E402

SEED = 0


@functools.cache
def _random_model(name: str) -> tuple[LoadedModel, TracedModel, tuple[CutPoint, ...]]:
    """A torchvision model with seeded random weights, traced, with its cut points."""
    torch.manual_seed(SEED)
    loaded = load_model(f"torchvision:{name}")
    traced = trace(loaded.module, loaded.input_shape)
    return loaded, traced, tuple(find_cut_points(traced))


@pytest.fixture(scope="session")
def random_model():
    """``random_model(name) -> (LoadedModel, TracedModel, cut points)``, cached per name."""
    return _random_model


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory):
    """fmnist_vgg trained one epoch on 10k Fashion-MNIST images: (model, state dict path).

    Trained once per session and kept as a state dict in the session's temporary directory.
    """
    cache = tmp_path_factory.getbasetemp() / "fmnist_vgg.pt"
    model = fmnist_vgg()
    if cache.is_file():
        model.load_state_dict(torch.load(cache, weights_only=True))
    else:
        train_classifier(model, load_images("fashion-mnist:train", (1, 28, 28)).subset(10_000), epochs=1, progress=False)
        torch.save(model.state_dict(), cache)
    return model.eval(), cache
