"""Small latency models whose answers are worked out by hand in the comments.

Units: times in ms, sizes in bytes, rates in bit/s. A split's transfer takes
8 * bytes_per_sample * B * 1000 / r ms (DSC Eq. 4 with D * c_l = bytes_per_sample * B).
"""

from __future__ import annotations

from calibration import LatencyModel, SplitTimings
from splitedge._words import LOCAL, OFFLOAD

#: Where TWO_CUTS' two splits take equal time at B = 1 (and at every B while times are linear in B).
#: T_early - T_late = (2 + 10) - (20 + 1) + 8 * (100_000 - 10_000) * 1 * 1000 / r = -9 + 7.2e8 / r,
#: zero at r* = 8 * Δbytes * B * 1000 / Δcompute = 7.2e8 / 9 = 8e7 bit/s (80 Mbit/s).
#: Below r* the late split (fewer bytes) wins, above it the early split (less board compute).
CROSSOVER_BPS = 8e7


def two_cuts(late_head_at_4: float = 80.0) -> LatencyModel:
    """An early cut (big tensor, light head) and a late cut (small tensor, heavy head), no round trip.

    At B = 4 every time is 4x its B = 1 value except the late head, ``late_head_at_4``:
    80 keeps it linear; 40 models batching amortising the heavy head (2x the time for 4x
    the samples). Then, at B = 4: early computes 8 + 40 = 48 ms, late 40 + 4 = 44 ms, so
    late computes faster *and* sends less, and wins at every rate: no crossover left.
    E.g. at r = 2e8: B = 1: early 12 + 4 = 16 < late 21 + 0.4 = 21.4;
    B = 4: early 48 + 16 = 64 > late 44 + 1.6 = 45.6 (linear: late 84 + 1.6 = 85.6 > 64).
    """
    return LatencyModel(
        splits=(
            SplitTimings("early", 100_000, {1: 2.0, 4: 8.0}, {1: 10.0, 4: 40.0}),
            SplitTimings("late", 10_000, {1: 20.0, 4: late_head_at_4}, {1: 1.0, 4: 4.0}),
        ),
        rtt_ms=0.0,
    )


#: CORNERS' input: one 224 x 224 x 3 uint8 image.
IMAGE_BYTES = 224 * 224 * 3  # 150_528


def corners() -> LatencyModel:
    """LOCAL (50 ms on the board), a middle cut, and OFFLOAD to a fast host; 5 ms round trip; B = 1.

    LOCAL:   50
    mid:     10 + 3 + 5 + 8 * 20_000 * 1000 / r    = 18 + 1.6e8 / r
    OFFLOAD:      2 + 5 + 8 * 150_528 * 1000 / r   =  7 + 1.204224e9 / r
    LOCAL = mid at r = 1.6e8 / 32 = 5e6; mid = OFFLOAD at r = (1.204224e9 - 1.6e8) / 11 = 9.4929e7.
    At 1e5: LOCAL 50 < mid 1618 < OFFLOAD 12049.24.   At 2e7: mid 26 < LOCAL 50 < OFFLOAD 67.2112.
    At 1e9: OFFLOAD 8.204224 < mid 18.16 < LOCAL 50.
    """
    return LatencyModel(
        splits=(
            SplitTimings(LOCAL, 0, {1: 50.0}, {}),
            SplitTimings("mid", 20_000, {1: 10.0}, {1: 3.0}),
            SplitTimings(OFFLOAD, IMAGE_BYTES, {}, {1: 2.0}),
        ),
        rtt_ms=5.0,
    )


LOCAL_MID_BPS = 5e6
MID_OFFLOAD_BPS = (1.204224e9 - 1.6e8) / 11


def preprocessed(model: LatencyModel, preprocess_ms: float = 4.0) -> LatencyModel:
    """``model`` with the board's preprocessing timed at ``preprocess_ms`` a frame."""
    return LatencyModel(model.splits, model.rtt_ms, preprocess_ms)
