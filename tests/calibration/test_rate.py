"""The device's link-rate estimate: log-domain EWMA with the base round trip subtracted."""

from __future__ import annotations

import math
import random

import pytest

from calibration import MIN_SAMPLE_BYTES, CalibrationError, RateEstimator
from tests.calibration.test_timing import ManualClock

TRUE_BPS = 2e7  # 20 Mbit/s
BASE_RTT_S = 0.004


def test_converges_within_5_percent_with_noise_from_a_far_start() -> None:
    rng = random.Random(1234)
    estimator = RateEstimator(initial_bps=1e5)  # 2.3 decades off
    for _ in range(40):
        estimator.observe_rtt(BASE_RTT_S + rng.uniform(0.0, 0.001))
    for _ in range(40):
        payload = rng.randint(50_000, 200_000)
        wire_s = 8 * payload / TRUE_BPS * rng.uniform(0.95, 1.05)  # ±5 % noise on the wire time
        estimator.observe_transfer(payload, BASE_RTT_S + wire_s)
    # The start's error decays as 0.7 ** 40 ≈ 6e-7 of its log: only the noise is left.
    assert estimator.rate_bps == pytest.approx(TRUE_BPS, rel=0.05)
    assert estimator.samples == 40


def test_first_sample_subtracts_the_smallest_ping() -> None:
    estimator = RateEstimator()
    for rtt in (0.010, 0.005, 0.020):
        estimator.observe_rtt(rtt)
    assert estimator.base_rtt_s == 0.005
    # 1 MB in 0.8 s once the 5 ms base is taken off: 8e6 bit / 0.8 s = 1e7 bit/s
    assert estimator.observe_transfer(1_000_000, 0.005 + 0.8) == pytest.approx(1e7)


def test_base_rtt_follows_the_last_32_pings() -> None:
    estimator = RateEstimator()
    estimator.observe_rtt(0.001)
    for _ in range(31):
        estimator.observe_rtt(0.004)
    assert estimator.base_rtt_s == 0.001
    estimator.observe_rtt(0.004)  # the 0.001 ping leaves the window
    assert estimator.base_rtt_s == 0.004


@pytest.mark.parametrize(("payload", "transfer_s"), [(MIN_SAMPLE_BYTES - 1, 0.5), (100_000, 0.004), (100_000, 0.003)])
def test_uninformative_samples_are_ignored(payload: int, transfer_s: float) -> None:
    estimator = RateEstimator()
    estimator.observe_rtt(0.004)
    assert estimator.observe_transfer(payload, transfer_s) is None
    assert (estimator.rate_bps, estimator.samples, estimator.age_s()) == (None, 0, math.inf)


def test_averages_in_the_log_domain() -> None:
    # Alternating 1 and 100 Mbit/s: the log average is 10 Mbit/s; a linear one would sit near 50.
    # Every sample weighs alpha 0.3 (full_weight_s 0), so the estimate swings by a factor
    # 10 ** (0.3 / 1.7) ≈ 1.5 around 10 Mbit/s.
    estimator = RateEstimator(full_weight_s=0.0)
    for i in range(40):
        estimator.observe_transfer(1_000_000, 8.0 if i % 2 else 0.08)
    assert 1e7 / 1.6 < estimator.rate_bps < 1e7 * 1.6


def test_alpha_weighs_the_new_sample() -> None:
    estimator = RateEstimator(alpha=0.5, initial_bps=1e6, full_weight_s=0.08)  # one unit on the wire
    # log average of 1e6 and 1e8 with weight 0.5: 1e7
    assert estimator.observe_transfer(1_000_000, 0.08) == pytest.approx(1e7)


def test_a_short_sample_can_only_raise_the_estimate() -> None:
    """Half of ``full_weight_s`` on the wire: half a unit, weight 1 - 0.5 ** 0.5, and only upwards."""
    estimator = RateEstimator(alpha=0.5, initial_bps=1e7, full_weight_s=0.01, clock=ManualClock())
    up = 7 + 2 * (1 - 0.5**0.5)  # log10: a 1e9 bit/s sample pulls 1e7 this far
    assert estimator.observe_transfer(625_000, 0.005) == pytest.approx(10**up)
    assert estimator.age_s() == math.inf  # not a full-weight sample: the estimate is still stale
    assert estimator.observe_transfer(4_096, 0.005) is None  # 6.6 Mbit/s, short: fixed costs, not the link
    assert estimator.rate_bps == pytest.approx(10**up)
    # 1e7 bit/s for one unit: weight 0.5, taken though it falls
    assert estimator.observe_transfer(12_500, 0.01) == pytest.approx(10 ** (up - 0.5 * (up - 7)))
    assert estimator.age_s() == 0.0


def test_a_stream_of_short_payloads_does_not_hold_back_the_probes() -> None:
    """A fast link read through 0.4 ms payloads that each also carry 1 ms of fixed costs
    (a 0.29x underestimate), with one 10 ms probe a second: the estimate stays within 10 %
    of the link, where taking every sample at face value leaves it near half."""
    link_bps = 1e9
    robust, naive = RateEstimator(), RateEstimator(full_weight_s=0.0)
    for estimator in (robust, naive):
        for _ in range(10):
            estimator.observe_transfer(int(link_bps * 0.010 / 8), 0.010)  # the probe
            for _ in range(5):
                estimator.observe_transfer(50_000, 50_000 * 8 / link_bps + 0.001)
    assert robust.rate_bps == pytest.approx(link_bps, rel=0.1)
    assert naive.rate_bps < 0.6 * link_bps


def test_a_long_sample_weighs_up_to_three_units() -> None:
    """A 48 ms transfer after a fall (1e9 → 1e8 bit/s) with 5 ms units: capped at 3 units, weight
    1 - 0.7 ** 3 = 0.657; a 10 ms one, 2 units, 0.51."""
    for wire_s, weight in ((0.048, 1 - 0.7**3), (0.010, 1 - 0.7**2)):
        estimator = RateEstimator(initial_bps=1e9)
        rate = estimator.observe_transfer(int(1e8 * wire_s / 8), wire_s)
        assert math.log10(rate) == pytest.approx(9 - weight)


@pytest.mark.parametrize(("wire_s", "weight"), [(0.25, 1 - 0.7**3), (0.4, 0.8), (0.5, 1.0), (2.4, 1.0)])
def test_a_sample_that_held_the_link_half_a_second_replaces_the_estimate(wire_s: float, weight: float) -> None:
    """Device-timed or kernel-timed alike: a 2.4 s upload at 0.5 Mbit/s after 1.3 Gbit/s once left
    the estimate at 7.3 Mbit/s (a third of the past kept), above the offload boundary, and the next
    frame went into that link."""
    for observe in ("transfer", "rate"):
        estimator = RateEstimator(initial_bps=1.3e9)
        if observe == "transfer":
            new = estimator.observe_transfer(int(5e5 * wire_s / 8), wire_s)
        else:
            new = estimator.observe_rate(5e5, wire_s)
        assert math.log(new / 1.3e9) == pytest.approx(weight * math.log(5e5 / 1.3e9)), observe


def test_age_counts_from_the_last_full_weight_sample() -> None:
    clock = ManualClock()
    estimator = RateEstimator(clock=clock)
    estimator.observe_transfer(100_000, 0.1)
    clock.now += 5.0
    assert estimator.age_s() == 5.0
    estimator.observe_transfer(100_000, 0.001)  # 1 ms on the wire: too short to date the estimate
    clock.now += 1.0
    assert estimator.age_s() == 6.0


def test_glitched_pings_are_dropped() -> None:
    estimator = RateEstimator()
    estimator.observe_rtt(-1.0)
    estimator.observe_rtt(math.nan)
    assert estimator.base_rtt_s == 0.0


@pytest.mark.parametrize("alpha", [0.0, 1.5, math.nan])
def test_alpha_must_be_a_fraction(alpha: float) -> None:
    with pytest.raises(CalibrationError, match=r"alpha: expected a number in \(0, 1\]"):
        RateEstimator(alpha=alpha)


@pytest.mark.parametrize(("span_s", "units"), [(0.0002, 1.0), (0.005, 1.0), (0.010, 2.0), (0.2, 3.0)])
def test_a_rate_the_kernel_timed_weighs_by_its_span_from_one_unit(span_s: float, units: float) -> None:
    """No round trip comes off, and a short span is not discounted: the board's delays are not in it."""
    estimator = RateEstimator(initial_bps=1e8)
    estimator.observe_rtt(0.050)  # a slow ping changes nothing here
    new = estimator.observe_rate(1e9, span_s)
    assert math.log(new / 1e8) == pytest.approx((1 - 0.7**units) * math.log(10))


def test_a_kernel_rate_sets_the_first_estimate_and_refreshes_its_age() -> None:
    clock = ManualClock()
    estimator = RateEstimator(clock=clock)
    assert estimator.observe_rate(4e8, 0.001) == pytest.approx(4e8)
    clock.now += 0.25
    assert estimator.age_s() == pytest.approx(0.25) and estimator.samples == 1


@pytest.mark.parametrize("rate", [0.0, -1.0, math.inf, math.nan])
def test_a_kernel_rate_that_is_no_rate_is_ignored(rate: float) -> None:
    estimator = RateEstimator(initial_bps=1e8)
    assert estimator.observe_rate(rate, 0.01) is None
    assert estimator.rate_bps == pytest.approx(1e8) and estimator.samples == 0
