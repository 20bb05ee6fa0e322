"""Camera frame → model input, as the manifest says, with numpy alone.

The board must reproduce torchvision's ``ImageClassification`` transform (resize the shorter
side with antialiasing, centre-crop, scale to [0, 1], normalise, HWC → CHW) without torch or
PIL. Resizing is separable: each axis is filtered with coefficients built the way PIL builds
them (the filter support widens by the downscale factor, which is what antialiasing means).
The filter is banded — an output pixel reads a handful of input pixels — so each axis is a
weighted sum of a few gathered rows (or columns), never a dense matrix product: a dense
product does ~100x the arithmetic and goes to BLAS, whose spinning worker threads burn a
board's CPU share (a 640x480 frame under a 0.25-core cgroup cap on this machine: 174 ms as
two dense products, 13 ms banded; 3.4 ms uncapped, one thread). The taps are cached per
(input size, output size), so a camera stream pays for them once, and the centre crop is
applied to the taps, so pixels the crop throws away are never computed.

A frame may be a view: OpenCV's BGR image read with its channel axis reversed is the RGB
frame the camera sources hand over (no copy). Gathering pixels through that negative stride
is slow in numpy (a 640x480 frame: 14 ms against 4 ms), so the filters run over the memory
as it lies and the channels of the small (3, crop, crop) result are reversed instead: each
channel is filtered on its own, so the order they are filtered in changes nothing.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from device_runtime.bundle import Preprocess


def _triangle(x: np.ndarray) -> np.ndarray:
    return np.clip(1.0 - np.abs(x), 0.0, None)


def _cubic(x: np.ndarray, a: float = -0.5) -> np.ndarray:
    # PIL's bicubic uses a = -0.5 (Keys); torchvision's antialiased bicubic follows PIL.
    x = np.abs(x)
    return np.where(
        x < 1,
        ((a + 2) * x - (a + 3)) * x * x + 1,
        np.where(x < 2, ((a * x - 5 * a) * x + 8 * a) * x - 4 * a, 0.0),
    )


_FILTERS = {"bilinear": (_triangle, 1.0), "bicubic": (_cubic, 2.0)}


@lru_cache(maxsize=32)
def resize_matrix(n_in: int, n_out: int, interpolation: str = "bilinear") -> np.ndarray:
    """(n_out, n_in) weights mapping one image axis to its resized length."""
    kernel, support = _FILTERS[interpolation]
    scale = n_in / n_out
    stretch = max(scale, 1.0)  # widen the filter when shrinking: antialiasing
    centres = (np.arange(n_out) + 0.5) * scale  # (n_out,)
    taps = np.arange(n_in) + 0.5  # (n_in,)
    weights = kernel((taps[None, :] - centres[:, None]) / stretch)  # (n_out, n_in)
    weights[np.abs(taps[None, :] - centres[:, None]) >= support * stretch] = 0.0
    return (weights / weights.sum(axis=1, keepdims=True)).astype(np.float32)


@lru_cache(maxsize=32)
def resize_taps(n_in: int, n_out: int, interpolation: str, first: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Outputs ``first .. first + count`` of :func:`resize_matrix` as a band: (count, K) input
    indices and (count, K) weights, K the widest row's support. Each row's window starts at
    its first non-zero weight (moved left at the image's edge), so it holds every non-zero
    weight of that row and the rest are zeros."""
    matrix = resize_matrix(n_in, n_out, interpolation)[first : first + count]
    nonzero = matrix != 0
    lo = nonzero.argmax(axis=1)
    hi = n_in - 1 - nonzero[:, ::-1].argmax(axis=1)
    width = int((hi - lo).max()) + 1
    index = np.minimum(lo, n_in - width)[:, None] + np.arange(width)
    return index, np.take_along_axis(matrix, index, axis=1)


def _filter(image: np.ndarray, axis: int, taps: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Resample one axis: for each output position, the weighted sum of its K input taps."""
    index, weights = taps
    shape = [1] * image.ndim
    shape[axis] = len(index)
    out = np.zeros(image.shape[:axis] + (len(index),) + image.shape[axis + 1 :], np.float32)
    for k in range(index.shape[1]):
        out += np.take(image, index[:, k], axis=axis) * weights[:, k].reshape(shape)
    return out


def resized_size(h: int, w: int, spec: Preprocess) -> tuple[int, int]:
    """(rows, columns) of the frame resized as torchvision does: the shorter side becomes
    ``spec.resize``, the other keeps the aspect (truncated)."""
    return (spec.resize, int(spec.resize * w / h)) if h <= w else (int(spec.resize * h / w), spec.resize)


def crop_origin(new_h: int, new_w: int, spec: Preprocess) -> tuple[int, int]:
    """(top, left) of torchvision's centre crop in the resized image."""
    return int(round((new_h - spec.crop) / 2.0)), int(round((new_w - spec.crop) / 2.0))


def check_frame(frame: np.ndarray) -> None:
    """Refuse anything but an (H, W, 3) frame, in one line naming its shape."""
    if frame.ndim != 3 or frame.shape[2] != 3:
        raise ValueError(f"frame must be (H, W, 3) RGB, got shape {frame.shape}")


def exact_pixels(frame: np.ndarray, spec: Preprocess) -> np.ndarray:
    """One RGB uint8 (H, W, 3) frame → its (3, crop, crop) float32 crop in pixel values (0-255,
    whole numbers), resized exactly as PIL (torchvision) resizes.

    Only the rows and columns of the resized image that survive the centre crop are
    computed: the crop is applied to the filter taps, not to a resized image.
    """
    check_frame(frame)
    reversed_channels = frame.strides[2] < 0  # an RGB view of BGR memory
    if reversed_channels:
        frame = frame[..., ::-1]  # the memory as it lies: BGR
    h, w = frame.shape[:2]
    new_h, new_w = resized_size(h, w, spec)
    top, left = crop_origin(new_h, new_w, spec)
    rows = resize_taps(h, new_h, spec.interpolation, top, spec.crop)
    cols = resize_taps(w, new_w, spec.interpolation, left, spec.crop)
    crop = _filter(_filter(frame, 0, rows), 1, cols).transpose(2, 0, 1)  # (3, crop, crop)
    if reversed_channels:
        crop = crop[::-1]  # BGR -> RGB, on the crop rather than the frame
    # torchvision resizes the uint8 image and rounds before converting to float.
    return np.clip(np.rint(crop), 0, 255)


def model_input(pixels: np.ndarray, spec: Preprocess) -> np.ndarray:
    """A (3, crop, crop) crop in pixel values → the (1, 3, crop, crop) float32 model input: the pixels
    themselves where the bundle folded the normalisation into its models, else scaled to [0, 1] and
    normalised with the manifest's mean and std, as torchvision does."""
    pixels = np.ascontiguousarray(pixels)  # the fast path's uint8 view of HWC memory: a 150 KB copy, then one pass
    if spec.folded:
        return pixels[None].astype(np.float32)
    mean = np.asarray(spec.mean, dtype=np.float32)[:, None, None]
    std = np.asarray(spec.std, dtype=np.float32)[:, None, None]
    return ((pixels * np.float32(1.0 / 255.0) - mean) / std)[None].astype(np.float32)


def preprocess(frame: np.ndarray, spec: Preprocess) -> np.ndarray:
    """One RGB uint8 (H, W, 3) frame → the (1, 3, crop, crop) float32 model input, exactly as
    torchvision makes it (:func:`exact_pixels`, then :func:`model_input`)."""
    return model_input(exact_pixels(frame, spec), spec)
