"""Latency model, split table and switching of dynamic split computing (DSC Eq. 4-7), chains and
semantic fragments placed on hosts, and SplitPlace's per-frame choice between the two kinds of split.

Standard library and numpy only, and of the project only the stdlib-only bottom package
``splitedge`` (the error family, the field checker, the split words): the board, the host and
the benchmarks all use it, so it sits below the runtimes (DESIGN.md, "Latency model and
switching"). Its one error, :class:`CalibrationError`, is a ``SplitEdgeError`` and a ``ValueError``.

The face holds the model and the maths (latency, the rate × batch table, the rate estimator,
switching, gains, timing); four public sub-faces hold groups of their own: ``calibration.json``
(:mod:`calibration.calibration_file`), a chain's placement (:mod:`calibration.chains`), a semantic
split's (:mod:`calibration.fragments`) and SplitPlace's bandit (:mod:`calibration.bandit`).
"""

from calibration._gain import gains_over_static, relative_gain
from calibration._latency import LatencyModel, SplitTimings, drop_share
from calibration._rate import MIN_SAMPLE_BYTES, RateEstimator
from calibration._switching import Decision, SplitSelector, decision_cost_us
from calibration._table import POINTS_PER_DECADE, RATE_MAX_BPS, RATE_MIN_BPS, SplitTable
from calibration._timing import WIDE_MIN_MS, WIDE_RATIO, RunningTimes, Spread, measure_ms, measure_round_robin, widest
from splitedge.errors import CalibrationError

__all__ = [
    "CalibrationError", "Decision", "LatencyModel", "MIN_SAMPLE_BYTES", "POINTS_PER_DECADE", "RATE_MAX_BPS",
    "RATE_MIN_BPS", "RateEstimator", "RunningTimes", "SplitSelector", "SplitTable", "SplitTimings", "Spread",
    "WIDE_MIN_MS", "WIDE_RATIO", "decision_cost_us", "drop_share", "gains_over_static", "measure_ms",
    "measure_round_robin", "relative_gain", "widest",
]
