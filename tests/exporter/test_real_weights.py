"""MobileNetV2 with its real ImageNet weights on real photos: every auto split keeps the answer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")
skimage_data = pytest.importorskip("skimage.data")

from exporter._build import BuildSpec, build_bundle  # noqa: E402
from exporter._fold import pixels  # noqa: E402
from exporter._validate import Chain, OnnxRunner  # noqa: E402
from tests.conftest import PHOTOS  # noqa: E402


def _photos() -> np.ndarray:
    """The photos as the camera pipeline will see them, preprocessed by torchvision itself."""
    transforms = torchvision.models.MobileNet_V2_Weights.IMAGENET1K_V1.transforms()
    batch = [transforms(torch.from_numpy(getattr(skimage_data, name)()).permute(2, 0, 1)) for name in PHOTOS]
    return torch.stack(batch).numpy()


def test_auto_splits_keep_top1_on_photos(tmp_path: Path, mobilenet_weights: Path) -> None:
    manifest = build_bundle(BuildSpec("torchvision:mobilenet_v2", weights=mobilenet_weights, splits="auto"), tmp_path, progress=False)
    assert manifest.model.preprocess.resize == 256  # the V1 weights' own transforms, found by file name
    labels = manifest.model.labels
    photos = pixels(_photos(), manifest.model.preprocess)  # the artifacts take pixels: the normalisation is folded in

    full = OnnxRunner(tmp_path / manifest.full[0].path)({"input": photos})["logits"]
    top1 = [labels[i] for i in full.argmax(axis=1)]
    assert top1[0] == "espresso"
    assert len(manifest.splits) == 5
    for split in manifest.splits:
        head, tail = (OnnxRunner(tmp_path / a.path) for a in split.artifacts)
        logits = Chain(head, tail)({"input": photos})["logits"]
        assert [labels[i] for i in logits.argmax(axis=1)] == top1, split.id
        np.testing.assert_allclose(logits, full, atol=1e-4)
