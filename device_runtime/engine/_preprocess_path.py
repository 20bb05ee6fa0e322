"""Which preprocessing a run uses: the exact path (PIL's resize, numpy) or the fast one (OpenCV).

``--preprocess auto`` (the default) takes the fast path only where the bundle says it answers as
the exact one does: the build measured the top-1 agreement of the two (``Preprocess.fast_agreement``)
and it reached :data:`FAST_AGREEMENT`. A bundle built before that was measured, or a board without
OpenCV, runs the exact path, as every board did before. ``fast`` and ``exact`` are the user's word.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from device_runtime.bundle import Preprocess
from device_runtime.engine._fast_preprocess import fast_preprocess, opencv_available
from device_runtime.engine._preprocess import preprocess

__all__ = ["EXACT", "FAST", "FAST_AGREEMENT", "PREPROCESS_PATHS", "preprocess_path", "preprocessor"]

EXACT, FAST = "exact", "fast"
#: What ``--preprocess`` takes: ``auto`` or a path.
PREPROCESS_PATHS = ("auto", EXACT, FAST)
#: The least top-1 agreement with the exact path at which ``auto`` takes the fast one (issue 29).
FAST_AGREEMENT = 0.995

_PATHS: dict[str, Callable[[np.ndarray, Preprocess], np.ndarray]] = {EXACT: preprocess, FAST: fast_preprocess}


def preprocess_path(spec: Preprocess, asked: str) -> str:
    """The path ``asked`` (``auto``, ``exact`` or ``fast``) comes to for a bundle preprocessing as ``spec``."""
    if asked not in PREPROCESS_PATHS:
        raise ValueError(f"preprocess {asked!r}: expected one of {', '.join(PREPROCESS_PATHS)}")
    if asked != "auto":
        return asked
    agreed = spec.fast_agreement is not None and spec.fast_agreement >= FAST_AGREEMENT
    return FAST if agreed and opencv_available() else EXACT


def preprocessor(path: str) -> Callable[[np.ndarray, Preprocess], np.ndarray]:
    """The function of ``path`` (``exact`` or ``fast``): RGB uint8 frame and spec → model input."""
    return _PATHS[path]
