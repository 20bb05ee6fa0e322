"""calibration/ is numpy and the standard library only, and its public face is pinned."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import calibration

PACKAGE = Path(calibration.__file__).parent


def imported_modules(path: Path) -> set[str]:
    """Top-level names of every module ``path`` imports (relative imports count as calibration)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add("calibration" if node.level else (node.module or "").split(".")[0])
    return names


def test_imports_only_numpy_the_stdlib_and_itself() -> None:
    allowed = set(sys.stdlib_module_names) | {"__future__", "numpy", "calibration"}
    offenders = {path.name: sorted(imported_modules(path) - allowed) for path in sorted(PACKAGE.rglob("*.py"))}
    assert {name: bad for name, bad in offenders.items() if bad} == {}
    assert len(offenders) >= 9  # the walk did find the package's modules


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
