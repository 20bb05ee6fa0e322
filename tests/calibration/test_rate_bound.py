"""A ceiling on the link rate (an upload that failed long after it was due): the estimate drops to
it at once, and the first sample after it is believed whole (issue 43: the field trial's estimate
stayed at 49 Mbit/s for 10 s on a link collapsed to 0.5 under uploads that failed)."""

from __future__ import annotations

import math

import pytest

from calibration import RateEstimator
from tests.calibration.test_timing import ManualClock

FAST, COLLAPSED = 49e6, 0.5e6


def test_a_ceiling_below_the_estimate_replaces_it_at_once() -> None:
    estimator = RateEstimator(initial_bps=FAST)
    assert estimator.observe_bound(COLLAPSED) == pytest.approx(COLLAPSED)
    assert estimator.rate_bps == pytest.approx(COLLAPSED) and estimator.bounded


def test_a_ceiling_above_the_estimate_leaves_it() -> None:
    estimator = RateEstimator(initial_bps=COLLAPSED)
    assert estimator.observe_bound(FAST) == pytest.approx(COLLAPSED)
    assert not estimator.bounded


def test_a_ceiling_is_the_estimate_while_there_is_none() -> None:
    estimator = RateEstimator()
    estimator.observe_bound(COLLAPSED)
    assert estimator.rate_bps == pytest.approx(COLLAPSED) and estimator.bounded


def test_a_ceiling_is_no_sample_and_does_not_refresh_the_estimate() -> None:
    """Nothing was measured: the estimate stays as stale as it was, so the device probes."""
    clock = ManualClock()
    estimator = RateEstimator(initial_bps=FAST, clock=clock)
    estimator.observe_transfer(150_000, 0.0245)  # 150 KB at 49 Mbit/s: a full-weight sample
    clock.now += 2.4
    estimator.observe_bound(COLLAPSED)
    assert estimator.samples == 1 and estimator.age_s() == pytest.approx(2.4)


@pytest.mark.parametrize("observe", ["transfer", "rate"])
def test_the_first_sample_after_a_ceiling_sets_the_estimate(observe: str) -> None:
    """A 16 KB probe crossing in 2.7 ms at 49 Mbit/s weighs one unit (30 %): averaged against the
    ceiling it would read 2 Mbit/s, and the board would run local on a link that is back."""
    estimator = RateEstimator(initial_bps=FAST)
    estimator.observe_bound(COLLAPSED)
    if observe == "transfer":
        estimator.observe_transfer(16_384, 8 * 16_384 / FAST)
    else:
        estimator.observe_rate(FAST, 8 * 16_384 / FAST)
    assert estimator.rate_bps == pytest.approx(FAST) and not estimator.bounded
    estimator.observe_transfer(16_384, 8 * 16_384 / (FAST / 2))  # the next one is averaged again
    assert COLLAPSED < FAST / 2 < estimator.rate_bps < FAST


def test_a_sample_ignored_leaves_the_ceiling() -> None:
    estimator = RateEstimator(initial_bps=FAST)
    estimator.observe_bound(COLLAPSED)
    assert estimator.observe_transfer(1_000, 0.5) is None  # under MIN_SAMPLE_BYTES: no rate
    assert estimator.bounded and estimator.rate_bps == pytest.approx(COLLAPSED)


@pytest.mark.parametrize("bound", [0.0, -1.0, math.inf, math.nan])
def test_a_ceiling_that_is_no_rate_is_ignored(bound: float) -> None:
    estimator = RateEstimator(initial_bps=FAST)
    assert estimator.observe_bound(bound) is None
    assert estimator.rate_bps == pytest.approx(FAST) and not estimator.bounded
