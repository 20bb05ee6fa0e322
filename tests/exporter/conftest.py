"""Shared, cached models for the exporter tests: building and tracing them once per session.

Exposed as fixtures. The real MobileNetV2 weights and the photos come from ``tests/conftest.py``.
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from exporter._datasets import load_images  # noqa: E402
from exporter._graph import CutPoint, TracedModel, find_cut_points, trace  # noqa: E402
from exporter._models import LoadedModel, load_model  # noqa: E402
from exporter._train import train_classifier  # noqa: E402
from exporter.zoo import fmnist_vgg  # noqa: E402
from tests.exporter.test_preprocessing import FACTORY  # noqa: E402

SEED = 0
#: The board bundle's one split (the Makefile's BOARD_SPLITS).
BOARD_SPLIT = "features_14_conv_2"
#: ``test_preprocessing``'s factory, importable by this name while a module's tests use :func:`factory`.
FACTORY_NAME = "mynet:make"


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

    The Makefile's (``SPLITEDGE_TEST_FMNIST_VGG``: ``python -m exporter.zoo fmnist_vgg --images
    10000 --epochs 1``, the same recipe), or trained once per session and kept as a state dict in
    the session's temporary directory.
    """
    cache = Path(os.environ.get("SPLITEDGE_TEST_FMNIST_VGG") or tmp_path_factory.getbasetemp() / "fmnist_vgg.pt")
    model = fmnist_vgg()
    if cache.is_file():
        model.load_state_dict(torch.load(cache, weights_only=True))
    else:
        train_classifier(model, load_images("fashion-mnist:train", (1, 28, 28)).subset(10_000), epochs=1, progress=False)
        torch.save(model.state_dict(), cache)
    return model.eval(), cache


@pytest.fixture(scope="session")
def board_bundle(mobilenet_weights: Path, photos_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """MobileNetV2 (real weights) cut at :data:`BOARD_SPLIT`, ONNX and TFLite, float32 and int8: the
    Makefile's board bundle (``SPLITEDGE_BOARD_BUNDLE``), or the same build here. Its TFLite
    conversions take minutes, so the TFLite tests check these files rather than convert their own."""
    if env := os.environ.get("SPLITEDGE_BOARD_BUNDLE"):
        return Path(env)
    from exporter.cli import main
    from tests.calib_crops import write_crops

    root = tmp_path_factory.mktemp("board")
    write_crops(photos_dir, root / "calib" / "photos")
    assert main(["build", "torchvision:mobilenet_v2", "--weights", str(mobilenet_weights), "--splits", BOARD_SPLIT,
                 "--formats", "onnx,tflite", "--quantize", "int8", "--calib-data", str(root / "calib"),
                 "--out", str(root / "bundle")]) == 0
    return root / "bundle"


@pytest.fixture(scope="module")
def factory(tmp_path_factory: pytest.TempPathFactory):
    """A model factory outside the package (``mynet:make``), as a user's own module would be."""
    folder = tmp_path_factory.mktemp("factory")
    (folder / "mynet.py").write_text(FACTORY)
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(folder))
        yield FACTORY_NAME
        sys.modules.pop("mynet", None)
