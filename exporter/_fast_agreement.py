"""How often the board's fast preprocessing (OpenCV, uint8) answers as the exact one (PIL's) does.

The fast path differs from the exact one by a few grey levels (:mod:`device_runtime.engine._fast_preprocess`);
what matters is whether the model's answer changes. The build runs the bundle's own float32 full
model on each photo both ways and records the fraction of equal top-1 answers in the manifest
(``Preprocess.fast_agreement``), so a board's ``--preprocess auto`` can rely on it. The photos are
the build's own calibration or test images where they are photos; else the scikit-image photos,
each as it is and at a camera's 640×480.

Agreement is only as meaningful as the photos are clear: on random crops of the scikit-image photos
(median top-1 probability 0.5) a ±1 grey-level noise alone changes MobileNetV2's top-1 on 9.5 % of
them, so a fast path is judged on photos a camera would give it, not on ambiguous fragments.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from device_runtime import Preprocess
from device_runtime.engine import fast_preprocess, preprocess
from exporter._validate import Runner

__all__ = ["BUILT_IN_PHOTOS", "CAMERA_SIZE", "MAX_PHOTOS", "built_in_photos", "top1_agreement", "with_agreement"]

#: scikit-image's colour photos (``skimage.data``), the only real photos offline.
BUILT_IN_PHOTOS = ("astronaut", "coffee", "chelsea", "rocket", "cat", "immunohistochemistry", "retina",
                   "colorwheel", "hubble_deep_field", "logo")
CAMERA_SIZE = (640, 480)  # (width, height): each built-in photo is also measured at a camera's size
MAX_PHOTOS = 200
_BATCH = 16


def built_in_photos() -> list[np.ndarray]:
    """The scikit-image photos, RGB uint8, each as it is and resized (exactly) to :data:`CAMERA_SIZE`."""
    import skimage.data
    from skimage.transform import resize

    originals = [np.ascontiguousarray(getattr(skimage.data, name)()[..., :3]) for name in BUILT_IN_PHOTOS]
    w, h = CAMERA_SIZE
    cameras = [(resize(p, (h, w), anti_aliasing=True, preserve_range=True) + 0.5).astype(np.uint8) for p in originals]
    return originals + cameras


def top1_agreement(full: Runner, photos: Sequence[np.ndarray], spec: Preprocess) -> float:
    """The fraction of ``photos`` on which ``full`` (the bundle's float32 full model, taking what
    ``spec`` makes) gives the same top-1 class from the fast path's input as from the exact path's."""
    (name,), (output,) = full.input_names, full.output_names
    same = 0
    for start in range(0, len(photos), _BATCH):
        chunk = photos[start : start + _BATCH]
        exact = full({name: np.concatenate([preprocess(p, spec) for p in chunk])})[output].argmax(1)
        fast = full({name: np.concatenate([fast_preprocess(p, spec) for p in chunk])})[output].argmax(1)
        same += int((exact == fast).sum())
    return same / len(photos)


def with_agreement(spec: Preprocess, full: Runner, photos: Sequence[np.ndarray], source: str | None) -> Preprocess:
    """``spec`` with the fast path's agreement measured on ``photos`` (from ``source``, in words) or,
    where there are none, on :func:`built_in_photos`."""
    on = f"{len(photos)} photos of {source}"
    if not photos:
        photos = built_in_photos()
        on = f"scikit-image's {len(BUILT_IN_PHOTOS)} photos, each as it is and at 640x480 ({len(photos)} frames)"
    return replace(spec, fast_agreement=top1_agreement(full, photos, spec), fast_agreement_on=on)
