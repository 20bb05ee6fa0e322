"""calibration/ is numpy and the standard library only, and its public face is pinned."""

from __future__ import annotations

import sys
from pathlib import Path

import calibration
from tests.imports import foreign_imports

PACKAGE = Path(calibration.__file__).parent


def test_imports_only_numpy_the_stdlib_and_itself() -> None:
    allowed = set(sys.stdlib_module_names) | {"__future__", "numpy", "calibration"}
    assert foreign_imports(PACKAGE, "calibration", allowed) == {}
    assert len(list(PACKAGE.rglob("*.py"))) >= 9  # the walk did find the package's modules


def test_public_names() -> None:
    assert sorted(calibration.__all__) == [
        "Calibration",
        "CalibrationError",
        "FILENAME",
        "LOCAL",
        "LatencyModel",
        "MIN_SAMPLE_BYTES",
        "OFFLOAD",
        "POINTS_PER_DECADE",
        "RATE_MAX_BPS",
        "RATE_MIN_BPS",
        "RateEstimator",
        "RunningTimes",
        "SCHEMA",
        "SplitSelector",
        "SplitTable",
        "SplitTimings",
        "decision_cost_us",
        "gains_over_static",
        "load",
        "measure_ms",
        "relative_gain",
        "save",
    ]
    assert all(hasattr(calibration, name) for name in calibration.__all__)


def test_error_is_a_value_error() -> None:
    assert issubclass(calibration.CalibrationError, ValueError)
