"""The numpy preprocessing matches torchvision's ImageClassification transform."""

from __future__ import annotations

import numpy as np
import pytest

from device_runtime.bundle import Preprocess
from device_runtime.engine._preprocess import preprocess, resize_matrix, resize_taps

IMAGENET = dict(resize=256, crop=224, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
# torchvision rounds its resized uint8 image; ours rounds a float image computed in another
# order, so a pixel can land one grey level away: 1/255/0.225 = 0.0174 after normalising.
ONE_LEVEL = 1 / 255 / min(IMAGENET["std"]) + 1e-6


@pytest.mark.parametrize(("model", "interpolation"), [("mobilenet_v2", "bilinear"), ("efficientnet_b0", "bicubic")])
@pytest.mark.parametrize("name", ["coffee", "chelsea", "astronaut", "rocket"])
def test_matches_torchvision(name: str, model: str, interpolation: str) -> None:
    """Against the transform torchvision ships with the weights, which the exporter records."""
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    data = pytest.importorskip("skimage.data")
    transform = torchvision.models.get_model_weights(model).IMAGENET1K_V1.transforms()
    image = getattr(data, name)()
    reference = transform(torch.from_numpy(image).permute(2, 0, 1)).numpy()[None]
    ours = preprocess(image, Preprocess(**IMAGENET, interpolation=interpolation))
    assert ours.shape == (1, 3, 224, 224) and ours.dtype == np.float32
    diff = np.abs(ours - reference)
    assert diff.max() <= ONE_LEVEL
    assert (diff > 1e-4).mean() < 0.001  # and only on a handful of pixels


def test_resize_matrix_rows_are_normalised_and_antialiased() -> None:
    down = resize_matrix(600, 256)
    np.testing.assert_allclose(down.sum(axis=1), 1.0, atol=1e-6)
    # Shrinking by 2.34x must average over more than the 2 taps plain bilinear would use.
    assert (down > 0).sum(axis=1).min() >= 4


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
@pytest.mark.parametrize(("n_in", "n_out", "first", "count"), [(480, 256, 16, 224), (640, 341, 58, 224), (100, 256, 16, 224), (7, 3, 0, 3)])
def test_banded_taps_equal_the_dense_filter(n_in: int, n_out: int, first: int, count: int, interpolation: str) -> None:
    """The band holds every non-zero weight, at the image's edges and when enlarging too."""
    dense = resize_matrix(n_in, n_out, interpolation)[first : first + count]
    index, weights = resize_taps(n_in, n_out, interpolation, first, count)
    rebuilt = np.zeros_like(dense)
    np.put_along_axis(rebuilt, index, weights, axis=1)
    np.testing.assert_array_equal(rebuilt, dense)
    signal = np.random.default_rng(0).random(n_in).astype(np.float32)
    np.testing.assert_allclose((signal[index] * weights).sum(axis=1), dense @ signal, rtol=1e-5, atol=1e-6)


def test_frame_must_be_rgb() -> None:
    with pytest.raises(ValueError, match=r"must be \(H, W, 3\) RGB, got shape \(10, 10\)"):
        preprocess(np.zeros((10, 10), np.uint8), Preprocess(**IMAGENET))


def test_views_of_camera_memory_give_the_same_input() -> None:
    """The sources hand over views, not copies: OpenCV's BGR read with its channels reversed,
    and a Pi camera's rows stepping over their padding. Both preprocess to exactly what a
    contiguous RGB copy does."""
    spec = Preprocess(**IMAGENET)
    bgr = np.random.default_rng(0).integers(0, 256, (480, 640, 3), dtype=np.uint8)
    rgb_view = bgr[..., ::-1]
    padded = np.random.default_rng(1).integers(0, 256, (480, 1984), dtype=np.uint8)[:, :1920].reshape(480, 640, 3)
    for view in (rgb_view, padded):
        assert not view.flags.c_contiguous
        expected = preprocess(np.ascontiguousarray(view), spec)
        np.testing.assert_array_equal(preprocess(view, spec), expected)
    assert not np.array_equal(preprocess(bgr, spec), preprocess(rgb_view, spec))  # the channel order counts
