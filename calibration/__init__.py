"""Latency model, split table and switching of dynamic split computing (DSC Eq. 4-7), chains and
semantic fragments placed on hosts, and SplitPlace's per-frame choice between the two kinds of split.

Standard library and numpy only, and of the project only the stdlib-only bottom package
``splitedge`` (the error family, the field checker, the split words): the board, the host and
the benchmarks all use it, so it sits below the runtimes (DESIGN.md, "Latency model and
switching"). Its one error, :class:`CalibrationError`, is a ``SplitEdgeError`` and a ``ValueError``.
"""

from calibration.bandit import ARMS, BANDIT_FILENAME, LAYER, SEMANTIC, Bandit, reward
from calibration.chains import ChainStage, HostView, Placement, chain_timings, place
from calibration.calibration_file import (
    FILENAME, SCHEMA, Calibration, Calibrations, Preprocessing, load, load_all, save,
)
from calibration.fragments import (
    FragmentPlacement, fragment_names, place_fragments, semantic_cost_ms, semantic_timings, unserved,
)
from calibration.gain import gains_over_static, relative_gain
from calibration.latency import LatencyModel, SplitTimings, drop_share
from calibration.rate import MIN_SAMPLE_BYTES, RateEstimator
from calibration.switching import Decision, SplitSelector, decision_cost_us
from calibration.table import POINTS_PER_DECADE, RATE_MAX_BPS, RATE_MIN_BPS, SplitTable
from calibration.timing import RunningTimes, Spread, measure_ms, measure_round_robin
from splitedge.errors import CalibrationError

from calibration.timing import WIDE_MIN_MS, WIDE_RATIO, widest

__all__ = [
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
