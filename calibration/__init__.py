"""Latency model, split table and switching of dynamic split computing (DSC Eq. 4-7).

Standard library and numpy only, and of the project only the stdlib-only bottom package
``splitedge`` (the error family, the field checker, the split words): the board, the host and
the benchmarks all use it, so it sits below the runtimes (DESIGN.md, "Latency model and
switching"). Its one error, :class:`CalibrationError`, is a ``SplitEdgeError`` and a ``ValueError``.
"""

from calibration.chains import ChainStage, HostView, Placement, chain_timings, place
from calibration.calibration_file import FILENAME, SCHEMA, Calibration, Calibrations, load, load_all, save
from calibration.gain import gains_over_static, relative_gain
from calibration.latency import LatencyModel, SplitTimings
from calibration.rate import MIN_SAMPLE_BYTES, RateEstimator
from calibration.switching import SplitSelector, decision_cost_us
from calibration.table import POINTS_PER_DECADE, RATE_MAX_BPS, RATE_MIN_BPS, SplitTable
from calibration.timing import RunningTimes, Spread, measure_ms, measure_round_robin
from splitedge.errors import CalibrationError

__all__ = [
    "FILENAME",
    "MIN_SAMPLE_BYTES",
    "POINTS_PER_DECADE",
    "RATE_MAX_BPS",
    "RATE_MIN_BPS",
    "SCHEMA",
    "Calibration",
    "CalibrationError",
    "Calibrations",
    "ChainStage",
    "HostView",
    "LatencyModel",
    "Placement",
    "RateEstimator",
    "RunningTimes",
    "SplitSelector",
    "SplitTable",
    "SplitTimings",
    "Spread",
    "chain_timings",
    "decision_cost_us",
    "gains_over_static",
    "load",
    "load_all",
    "measure_ms",
    "measure_round_robin",
    "place",
    "relative_gain",
    "save",
]
