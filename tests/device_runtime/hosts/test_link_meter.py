"""The link meter: an upload that is late bounds the rate before its reply says so."""

from __future__ import annotations

import math

import numpy as np
import pytest

from calibration import RateEstimator
from device_runtime.link import InferResult
from device_runtime.link import UploadTiming
from device_runtime.hosts._link_meter import OVERDUE_FACTOR, OVERDUE_SLACK_S, PROBE_MAX_BYTES, LinkMeter, probe_bytes
from tests.calibration.test_timing import ManualClock

PAYLOAD = 602_112  # a 224x224 float32 image: a full offload


def _meter(rate_bps: float) -> tuple[LinkMeter, ManualClock]:
    clock = ManualClock()
    return LinkMeter(RateEstimator(initial_bps=rate_bps, clock=clock), clock=clock), clock


def test_an_upload_on_time_sets_no_bound() -> None:
    meter, clock = _meter(100e6)
    meter.sending(PAYLOAD)
    # 602 KB at 100 Mbit/s: 48 ms; overdue only after 2 x 48 + 20 = 116 ms.
    clock.now += 0.115
    assert meter.overdue() is None
    assert meter.rate_bps == pytest.approx(100e6)
    clock.now += 0.002
    assert meter.overdue() is not None


def test_an_overdue_upload_bounds_the_rate_by_its_bytes_over_its_time() -> None:
    meter, clock = _meter(100e6)
    ticket = meter.sending(PAYLOAD)
    clock.now += 0.2
    # Not across in 0.2 s: slower than 24.1 Mbit/s, and that is what the pipeline decides with.
    assert meter.overdue() == pytest.approx(8 * PAYLOAD / 0.2)
    assert meter.rate_bps == pytest.approx(8 * PAYLOAD / 0.2)
    meter.settled(ticket)
    assert meter.overdue() is None and meter.rate_bps == pytest.approx(100e6)


def test_the_hosts_usual_time_is_not_taken_for_the_links() -> None:
    """A host whose replies take 100 ms (queue + tail) makes a reply 150 ms after the send on
    time on a fast link; only what is left after the host's time counts against the link, and
    the host's measured time is not scaled with the link's: a frame 200 ms after a 602 KB one
    on a 100 Mbit/s link with a 40 ms host finds it overdue (40 + 2 x 48 + 20 = 156 ms)."""
    meter, clock = _meter(1e9)
    now = clock()
    meter.observe_reply(PAYLOAD, _reply(sent=now - 0.2, received=now - 0.05, host_ms=100.0))
    meter.observe_reply(PAYLOAD, _reply(sent=now - 0.16, received=now - 0.01, host_ms=100.0))
    host_s = 0.051  # 0.3 and then 0.3 more of the way to 100 ms: 51 ms
    meter.sending(PAYLOAD)
    limit = host_s + OVERDUE_FACTOR * 8 * PAYLOAD / meter.estimator.rate_bps + OVERDUE_SLACK_S
    clock.now += limit - 0.005
    assert meter.overdue() is None
    clock.now += 0.010
    assert meter.overdue() == pytest.approx(8 * PAYLOAD / (limit + 0.005 - host_s))


def test_a_frame_interval_later_a_slow_full_offload_is_overdue() -> None:
    meter, clock = _meter(100e6)
    now = clock()
    for _ in range(20):  # ResNet-18's full model on the host: 40 ms
        meter.observe_reply(PAYLOAD, _reply(sent=now - 0.1, received=now - 0.012, host_ms=40.0))
    assert meter.estimator.rate_bps == pytest.approx(100e6, rel=0.01)
    meter.sending(PAYLOAD)
    clock.now += 0.15
    assert meter.overdue() is None
    clock.now += 0.05
    assert meter.overdue() == pytest.approx(8 * PAYLOAD / (0.2 - 0.04), rel=0.01)


def test_a_queued_upload_is_timed_from_the_end_of_the_one_before() -> None:
    """Requests share one connection in order: the second one's clock starts when the link is
    done with the first, not when it was queued behind it."""
    meter, clock = _meter(100e6)
    start = clock()
    first = meter.sending(PAYLOAD)
    meter.sending(PAYLOAD)
    clock.now = start + 0.2
    assert meter.overdue() == pytest.approx(8 * PAYLOAD / 0.2)  # the first is late
    meter.observe_reply(PAYLOAD, _reply(sent=start, received=start + 0.3, host_ms=0.0))
    meter.settled(first)
    # Timed from its send, the second would be 0.4 s old at +0.4 and overdue at the new estimate
    # (~30 Mbit/s: 2 x 160 ms + 20 ms); timed from the first's end, it is 0.1 s old.
    clock.now = start + 0.4
    assert meter.overdue() is None
    clock.now = start + 1.3
    assert meter.overdue() == pytest.approx(8 * PAYLOAD / 1.0)


def test_nothing_is_overdue_before_the_first_estimate() -> None:
    clock = ManualClock()
    meter = LinkMeter(clock=clock)
    meter.sending(PAYLOAD)
    clock.now += 10.0
    assert meter.overdue() is None and meter.rate_bps is None


def test_the_estimate_goes_stale_on_the_meters_clock() -> None:
    """What makes an idle pipeline probe: a second without a full-weight sample."""
    meter, clock = _meter(100e6)
    assert meter.stale(1.0)  # no sample yet
    meter.observe_probe(65_536, 50.0)
    clock.now += 1.0
    assert not meter.stale(1.0)
    clock.now += 0.001
    assert meter.stale(1.0)


def test_a_probe_reports_its_own_rate_and_a_link_too_fast_for_it() -> None:
    """What sizes the next probe (Pipeline.probe): a 16 KB probe back as soon as a bare ping
    says nothing of the rate but that it is faster than 16 KB can show."""
    meter, _ = _meter(0.5e6)
    assert meter.observe_probe(0, 1.0) is None  # a bare ping: the base round trip, 1 ms
    assert meter.observe_probe(16_384, 1.0) == math.inf
    assert meter.rate_bps == pytest.approx(0.5e6) and probe_bytes(math.inf) == PROBE_MAX_BYTES
    assert meter.observe_probe(1_000_000, 81.0) == pytest.approx(1e8)  # 8 Mbit in 80 ms on the wire


def _reply(sent: float, received: float, host_ms: float, upload: UploadTiming | None = None) -> InferResult:
    return InferResult(np.zeros(1), compute_ms=host_ms, round_trip_ms=(received - sent) * 1000.0, sent=sent,
                       received=received, upload=upload)


def test_a_board_busy_when_the_reply_came_takes_the_kernels_rate() -> None:
    """The reply says 602 KB took 200 ms less the host's 10: 25 Mbit/s; the kernel saw the link
    acknowledge 500 Mbit/s between two looks 8 ms apart while it crossed. The kernel's is taken,
    weighing 8 / 5 = 1.6 units."""
    meter, clock = _meter(400e6)
    now = clock()
    kernel = UploadTiming(acked_bps=500e6, span_s=0.008)
    meter.observe_reply(PAYLOAD, _reply(sent=now - 0.2, received=now, host_ms=10.0, upload=kernel))
    assert math.log(meter.estimator.rate_bps / 400e6) == pytest.approx((1 - 0.7**1.6) * math.log(500 / 400))


def test_the_device_timing_stands_where_it_reads_faster_than_the_kernel() -> None:
    """Both are lower bounds: the kernel's looks found 60 Mbit/s, the reply 100 (8 Mbit in 80 ms)."""
    meter, clock = _meter(50e6)
    now = clock()
    kernel = UploadTiming(acked_bps=60e6, span_s=0.02)
    meter.observe_reply(1_000_000, _reply(sent=now - 0.1, received=now, host_ms=20.0, upload=kernel))
    assert math.log(meter.estimator.rate_bps / 50e6) == pytest.approx((1 - 0.7**3) * math.log(2))


def test_a_look_that_found_the_upload_acknowledged_bounds_its_time() -> None:
    """The reply came 300 ms after the send, 200 of them the host's; a look 20 ms after the send
    found the upload acknowledged: it took at most 20 ms less the path's 0.5 ms round trip. And
    the next request's upload is timed from then, not from the reply."""
    meter, clock = _meter(50e6)
    meter.observe_probe(0, 5.0)  # a ping with the host's handling in it: not the path's round trip
    now = clock()
    kernel = UploadTiming(done_s=0.020, min_rtt_s=0.0005)
    meter.observe_reply(PAYLOAD, _reply(sent=now - 0.3, received=now, host_ms=200.0, upload=kernel))
    # First weighted sample after the initial estimate: 3 units towards 8 * PAYLOAD / 19.5 ms.
    expected = math.exp(math.log(50e6) + (1 - 0.7**3) * (math.log(8 * PAYLOAD / 0.0195) - math.log(50e6)))
    assert meter.estimator.rate_bps == pytest.approx(expected)
    assert meter._upload_done == pytest.approx(now - 0.3 + 0.020)


def test_an_upload_the_hosts_window_held_back_says_nothing_of_the_link() -> None:
    meter, clock = _meter(400e6)
    now = clock()
    held = UploadTiming(done_s=0.3, receiver_limited=True)
    meter.observe_reply(PAYLOAD, _reply(sent=now - 0.4, received=now, host_ms=10.0, upload=held))
    assert meter.estimator.rate_bps == pytest.approx(400e6) and meter.estimator.samples == 0


def test_a_probe_takes_the_kernels_rate_and_reports_it() -> None:
    meter, _ = _meter(10e6)
    assert meter.observe_probe(0, 2.0) is None
    kernel = UploadTiming(acked_bps=80e6, span_s=0.05)
    assert meter.observe_probe(1_000_000, 400.0, kernel) == pytest.approx(80e6)  # the board's 400 ms: 20 Mbit/s
    assert math.log(meter.estimator.rate_bps / 10e6) == pytest.approx((1 - 0.7**3) * math.log(8))
