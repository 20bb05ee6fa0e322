"""calibration's public face is pinned (in tests/test_public_faces.py; what it may import: tests/test_architecture.py)."""

from __future__ import annotations

import calibration


def test_public_names() -> None:
    """Pinned with every other face (and its sub-faces) in tests/test_public_faces.py."""
    from tests.test_public_faces import FACES

    assert sorted(calibration.__all__) == sorted(FACES["calibration"])
    assert all(hasattr(calibration, name) for name in calibration.__all__)


def test_error_is_a_value_error_and_a_splitedge_error() -> None:
    from splitedge.errors import SplitEdgeError

    assert issubclass(calibration.CalibrationError, ValueError)
    assert issubclass(calibration.CalibrationError, SplitEdgeError)
