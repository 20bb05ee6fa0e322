"""calibration's public face is pinned (what it may import: tests/test_architecture.py)."""

from __future__ import annotations

import calibration


def test_public_names() -> None:
    assert sorted(calibration.__all__) == [
        "ARMS",
        "BANDIT_FILENAME",
        "Bandit",
        "Calibration",
        "CalibrationError",
        "Calibrations",
        "ChainStage",
        "Decision",
        "FILENAME",
        "FragmentPlacement",
        "HostView",
        "LAYER",
        "LatencyModel",
        "MIN_SAMPLE_BYTES",
        "POINTS_PER_DECADE",
        "Placement",
        "Preprocessing",
        "RATE_MAX_BPS",
        "RATE_MIN_BPS",
        "RateEstimator",
        "RunningTimes",
        "SCHEMA",
        "SEMANTIC",
        "SplitSelector",
        "SplitTable",
        "SplitTimings",
        "Spread",
        "WIDE_MIN_MS",
        "WIDE_RATIO",
        "chain_timings",
        "decision_cost_us",
        "drop_share",
        "fragment_names",
        "gains_over_static",
        "load",
        "load_all",
        "measure_ms",
        "measure_round_robin",
        "place",
        "place_fragments",
        "relative_gain",
        "reward",
        "save",
        "semantic_cost_ms",
        "semantic_timings",
        "unserved",
        "widest",
    ]
    assert all(hasattr(calibration, name) for name in calibration.__all__)


def test_error_is_a_value_error_and_a_splitedge_error() -> None:
    from splitedge.errors import SplitEdgeError

    assert issubclass(calibration.CalibrationError, ValueError)
    assert issubclass(calibration.CalibrationError, SplitEdgeError)
