"""What each answered frame could have taken at best: its own compute (the floor) and the fastest
option the run's calibration knew at the link's rate (the oracle).

A latency means little alone: 80 ms is good where the frame's own compute took 75 and poor where
it took 10. The **floor** of a frame is the work it could not skip, as the run measured it: its
preprocessing, its batch's head, its batch's bytes at the link's rate and its batch's tail
(``preprocess_ms + head_ms + 8 · bytes · batch / rate + tail_ms``; ``bytes`` is the frame's share
of what its batch sent, and the tail could start only once the whole batch had crossed). The
round trip, the waits and the hand-offs are what a run adds on top: latency ÷ floor is the share of
a frame's time that was not its own work. A frame answered here after a failed offload has its
failed head in ``head_ms``: that work was done, so its floor holds it.

The **oracle** of a frame is the time of the option the calibrated model predicts fastest
(:meth:`calibration.LatencyModel.best`, DSC Eq. 6) at the frame's batch and the link's rate at
its capture, over every option of the calibration: what a policy that knew the link could at
best have chosen, by the run's own timings. latency ÷ oracle is how far the run was from that.

The link's rate is its real one where a testbed recorded it (``link_rate`` records, in force at
the frame's capture), else the board's estimate when it chose the frame's split; each figure
says how many frames took which (``rate``). A frame with no rate where one is needed, or whose
figure is under :data:`MIN_MS`, is left out and counted: nothing divides by it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from calibration import LatencyModel
from fieldtrial import _timeline as timeline

__all__ = ["ESTIMATE", "MIN_MS", "REAL", "Bound", "frame_bounds", "summarize_bounds"]

#: Where a frame's rate came from: the link's real rate (a testbed's record), or the board's estimate.
REAL, ESTIMATE = "real", "estimate"
#: The least time a ratio divides by: under a microsecond is no time a board measures, and a ratio
#: over it would mean nothing (or overflow).
MIN_MS = 1e-3
_MS_PER_S = 1000.0
_BITS_PER_BYTE = 8
_BITS_PER_MBIT = 1e6


@dataclass(frozen=True)
class Bound:
    """One answered frame against its bounds (ms): ``floor_ms`` and ``oracle_ms`` None where the
    frame has none (module docstring); ``floor_rate`` and ``oracle_rate`` say which rate each took
    (:data:`REAL` or :data:`ESTIMATE`; None where it took none: nothing crossed, or no figure)."""

    t: float
    total_ms: float
    floor_ms: float | None
    floor_rate: str | None
    oracle_ms: float | None
    oracle_split: str | None
    oracle_rate: str | None


def _rate(
    frame: dict[str, Any], times: Sequence[float], steps: Sequence[dict[str, Any]],
) -> tuple[float | None, str | None]:
    """The link's rate at ``frame``'s capture (bit/s) and where it came from; (None, None) for none."""
    real = timeline.real_rate_at(times, steps, frame["t"])
    if real is not None:
        return real * _BITS_PER_MBIT, REAL
    if frame.get("rate_bps"):
        return frame["rate_bps"], ESTIMATE
    return None, None


def _floor(frame: dict[str, Any], rate: float | None, source: str | None) -> tuple[float | None, str | None]:
    """The frame's own compute and the rate its bytes took (module docstring); (None, None) where
    bytes crossed and no rate is known, or the compute recorded is under :data:`MIN_MS`."""
    crossed = frame.get("bytes", 0) * frame["batch"]
    transfer = 0.0
    if crossed:
        if rate is None:
            return None, None
        transfer = _BITS_PER_BYTE * crossed * _MS_PER_S / rate
    floor = frame["preprocess_ms"] + frame["head_ms"] + transfer + frame["tail_ms"]
    if floor < MIN_MS:
        return None, None
    return floor, source if crossed else None


def frame_bounds(
    answered: Sequence[dict[str, Any]], steps: Sequence[dict[str, Any]], model: LatencyModel | None,
) -> list[Bound]:
    """The bounds of each answered frame, in the order given. ``steps``: the link's real rate
    (:func:`fieldtrial._timeline.real_rate_steps`); ``model``: the run's calibrated model, None for
    no oracle."""
    times = [s["t"] for s in steps]
    out = []
    for frame in answered:
        rate, source = _rate(frame, times, steps)
        floor, floor_rate = _floor(frame, rate, source)
        oracle_ms: float | None = None
        oracle_split: str | None = None
        if model is not None and rate is not None:
            oracle_split = model.best(frame["batch"], rate)
            oracle_ms = model.predict_ms(oracle_split, frame["batch"], rate)
            if oracle_ms < MIN_MS:
                oracle_ms = oracle_split = None
        out.append(Bound(frame["t"], frame["total_ms"], floor, floor_rate, oracle_ms, oracle_split,
                         source if oracle_ms is not None else None))
    return out


def _rates(sources: Sequence[str | None]) -> dict[str, int]:
    """How many frames took the real rate and how many the board's estimate."""
    return {REAL: sum(s == REAL for s in sources), ESTIMATE: sum(s == ESTIMATE for s in sources)}


def summarize_bounds(bounds: Sequence[Bound]) -> dict[str, Any]:
    """``floor`` and ``oracle`` of the summary (JSON-ready), each None where no frame has one.

    ``floor``: ``frames`` with one and ``left_out``, ``rate`` (frames whose bytes crossed at the
    real rate and at the estimate), its median ``p50_ms``, and ``latency_over_floor``, the
    benchmark's "p50 ÷ the frame's own compute floor" both ways: ``median_of_ratios`` (the median
    over frames of latency ÷ floor) and ``ratio_of_medians`` (the frames' median latency ÷ their
    median floor). ``oracle`` (None without a calibration): ``frames``, ``left_out`` (no rate
    at all), ``rate``, ``p50_ms``, ``splits`` (frames per option the oracle
    took) and ``latency_over_oracle``: ``mean_of_ratios``, the mean over frames of latency ÷ the
    oracle's time (the benchmark's "auto ÷ per-frame oracle (mean)").
    """
    floored = [(b.total_ms, b.floor_ms, b.floor_rate) for b in bounds if b.floor_ms is not None]
    floor = None
    if floored:
        latency, floors = np.array([f[0] for f in floored]), np.array([f[1] for f in floored])
        floor = {
            "frames": len(floored),
            "left_out": len(bounds) - len(floored),
            "rate": _rates([f[2] for f in floored]),
            "p50_ms": float(np.median(floors)),
            "latency_over_floor": {"median_of_ratios": float(np.median(latency / floors)),
                                   "ratio_of_medians": float(np.median(latency) / np.median(floors))},
        }
    oracled = [(b.total_ms, b.oracle_ms, b.oracle_rate, b.oracle_split) for b in bounds if b.oracle_ms is not None]
    oracle = None
    if oracled:
        times = np.array([o[1] for o in oracled])
        oracle = {
            "frames": len(oracled),
            "left_out": len(bounds) - len(oracled),
            "rate": _rates([o[2] for o in oracled]),
            "p50_ms": float(np.median(times)),
            "splits": dict(Counter(o[3] for o in oracled).most_common()),
            "latency_over_oracle": {"mean_of_ratios": float((np.array([o[0] for o in oracled]) / times).mean())},
        }
    return {"floor": floor, "oracle": oracle}
