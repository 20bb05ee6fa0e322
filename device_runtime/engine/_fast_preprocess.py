"""Camera frame → model input with OpenCV, in uint8: the board's cheap preprocessing.

The exact path (:mod:`device_runtime.engine._preprocess`) reproduces PIL's antialiased resize in
float32 numpy; on a quarter of a Raspberry-Pi-class core that cost more than MobileNetV2's whole
head (issue 29). Here OpenCV (already on the board for the camera) resizes the uint8 frame and the
crop is sliced out of it. PIL shrinks by ``s`` with a triangle filter ``s`` input pixels wide on
each side (antialiasing); OpenCV's ``INTER_LINEAR`` samples a triangle one pixel wide, so the frame
is first blurred by a Gaussian whose variance makes up the difference, ``(s² - 1) / 6`` (a
triangle of half-width ``s`` has variance ``s² / 6``). Measured on the scikit-image photos and 100
crops of them against the exact path (mean |difference| in grey levels, a 640×480 frame's cost on
this machine, busy): this way 0.41 and 0.66 ms; ``INTER_AREA`` 0.48 and 1.6 ms; ``INTER_LINEAR``
alone 1.04 and 0.50 ms (then the blur's width cut to ±2 sigma: 0.34 on the photos, 0.58 ms). The build measures what the difference does to the answers, the top-1
agreement of the two paths (``Preprocess.fast_agreement``), before a board relies on it.

The crop stays uint8 (what full offload sends: a quarter of the float32 bytes) until
:func:`~device_runtime.engine._preprocess.model_input` makes it the model's float32 input.
"""

from __future__ import annotations

import math

import numpy as np

from device_runtime.bundle import Preprocess
from device_runtime.engine._preprocess import check_frame, crop_origin, model_input, resized_size
from splitedge.errors import BackendError

__all__ = ["fast_pixels", "fast_preprocess", "opencv_available"]

#: OpenCV's interpolation for a frame enlarged to the model's size (shrinking is always INTER_LINEAR).
_ENLARGE = {"bilinear": "INTER_LINEAR", "bicubic": "INTER_CUBIC", "nearest": "INTER_NEAREST"}
#: Below this a blur changes no grey level; OpenCV takes a sigma of 0 as "from the kernel size".
_NO_BLUR = 0.01
_MIN_SIGMA = 0.1


def _sigma(shrink: float) -> float:
    """The Gaussian's sigma that widens INTER_LINEAR's one-pixel triangle to PIL's ``shrink``-pixel
    one (equal variances); 0 where the axis is not shrunk enough for it to matter."""
    sigma = math.sqrt(max(shrink * shrink - 1.0, 0.0) / 6.0)
    return sigma if sigma >= _MIN_SIGMA else 0.0


def _kernel(sigma: float) -> int:
    """The Gaussian's width: ±2 sigma (OpenCV's own choice for uint8, ±3 sigma, cost a 640×480 frame
    0.39 ms against 0.27 ms here for weights past 2 sigma below 1 %)."""
    return 2 * max(1, round(2 * sigma)) + 1


def opencv_available() -> bool:
    """Whether ``cv2`` imports here: ``--preprocess auto`` falls back to the exact path without it."""
    try:
        import cv2  # noqa: F401
    except ImportError:
        return False
    return True


def fast_pixels(frame: np.ndarray, spec: Preprocess) -> np.ndarray:
    """One RGB uint8 (H, W, 3) frame → its (3, crop, crop) uint8 crop, resized by OpenCV.

    A frame that is an RGB view of BGR memory (the camera sources' frames) is resized as the
    memory lies and its channels reversed on the crop, so the frame is never copied.
    """
    try:
        import cv2
    except ImportError:
        raise BackendError("--preprocess fast needs OpenCV: pip install 'splitedge[camera]', "
                           "or run with --preprocess exact") from None
    check_frame(frame)
    reversed_channels = frame.strides[2] < 0
    memory = np.ascontiguousarray(frame[..., ::-1] if reversed_channels else frame)
    h, w = memory.shape[:2]
    new_h, new_w = resized_size(h, w, spec)
    sigma_y, sigma_x = _sigma(h / new_h), _sigma(w / new_w)
    if sigma_x or sigma_y:
        memory = cv2.GaussianBlur(memory, (_kernel(sigma_x), _kernel(sigma_y)), sigmaX=sigma_x or _NO_BLUR,
                                  sigmaY=sigma_y or _NO_BLUR)
    shrinking = new_h <= h and new_w <= w
    interpolation = cv2.INTER_LINEAR if shrinking else getattr(cv2, _ENLARGE.get(spec.interpolation, "INTER_LINEAR"))
    resized = cv2.resize(memory, (new_w, new_h), interpolation=interpolation)
    top, left = crop_origin(new_h, new_w, spec)
    crop = resized[top : top + spec.crop, left : left + spec.crop].transpose(2, 0, 1)  # (3, crop, crop)
    return crop[::-1] if reversed_channels else crop


def fast_preprocess(frame: np.ndarray, spec: Preprocess) -> np.ndarray:
    """One RGB uint8 (H, W, 3) frame → the (1, 3, crop, crop) float32 model input, resized by OpenCV."""
    return model_input(fast_pixels(frame, spec), spec)
