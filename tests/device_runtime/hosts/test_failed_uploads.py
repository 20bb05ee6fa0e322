"""Failed and refused uploads teach the estimate (issue 43, point 4).

The field trial: the link collapsed to 0.5 Mbit/s under 150 KB frames; the estimate followed it
only while an upload was overdue and stayed at 49 Mbit/s underneath for 10 s, because only replies
were samples. Each time the cap lifted the board sent 150 KB into the collapsed link again.
"""

from __future__ import annotations

import pytest

from calibration import RateEstimator
from device_runtime.hosts._link_meter import LinkMeter
from device_runtime.wire import ErrorCode
from splitedge.errors import HostUnavailableError, RemoteError
from tests.calibration.test_timing import ManualClock

FAST = 49e6
FRAME = 150_000  # the trial's cut: 150 KB
HELD_S = 2.4  # ... out this long when it failed: 0.5 Mbit/s at most
COLLAPSED = 8 * FRAME / HELD_S
LOST = HostUnavailableError("host 10.0.0.2:7000 did not answer infer #7 within 2.4 s")


def _meter() -> tuple[LinkMeter, ManualClock]:
    clock = ManualClock()
    return LinkMeter(RateEstimator(initial_bps=FAST, clock=clock), clock=clock), clock


def _fail(meter: LinkMeter, clock: ManualClock, error: Exception, deadline_ms: float | None = None) -> float | None:
    """A 150 KB upload out for 2.4 s that fails with ``error``, settled as the pipeline settles it."""
    ticket = meter.sending(FRAME)
    clock.now += HELD_S
    bound = meter.failed(ticket, error, deadline_ms)
    meter.settled(ticket)
    return bound


def test_a_failed_upload_takes_the_estimate_itself_down_and_it_stays_there() -> None:
    meter, clock = _meter()
    assert _fail(meter, clock, LOST) == pytest.approx(COLLAPSED)
    assert meter.estimator.rate_bps <= COLLAPSED * 1.001  # the estimate, not only a cap on it
    clock.now += 5.0  # nothing in flight, no reply, no probe: still collapsed
    assert meter.estimator.rate_bps <= COLLAPSED * 1.001 and meter.rate_bps <= COLLAPSED * 1.001


@pytest.mark.parametrize("code, deadline_ms, bound", [
    (ErrorCode.OVERLOADED, None, COLLAPSED),  # refused as it arrived: no host time
    (ErrorCode.DEADLINE_EXCEEDED, 200.0, 8 * FRAME / (HELD_S - 0.2)),  # at most its deadline in the host's queue
])
def test_a_refused_upload_bounds_the_link_by_its_time_less_the_hosts_most(
    code: ErrorCode, deadline_ms: float | None, bound: float,
) -> None:
    meter, clock = _meter()
    assert _fail(meter, clock, RemoteError(code, "refused"), deadline_ms) == pytest.approx(bound)
    assert meter.estimator.rate_bps == pytest.approx(bound) and bound < 0.6e6


@pytest.mark.parametrize("error, deadline_ms", [
    (RemoteError(ErrorCode.HOP_FAILED, "stage 2 at 10.0.0.3:7000 did not answer"), 200.0),  # the hop's own timeout
    (RemoteError(ErrorCode.INTERNAL, "the tail failed"), 200.0),
    (RemoteError(ErrorCode.DEADLINE_EXCEEDED, "refused"), None),  # no deadline sent: no bound on the host's time
])
def test_an_error_after_unknown_host_time_bounds_nothing(error: Exception, deadline_ms: float | None) -> None:
    meter, clock = _meter()
    assert _fail(meter, clock, error, deadline_ms) is None
    assert meter.rate_bps == pytest.approx(FAST) and meter.overdue() is None


def test_an_upload_that_fails_on_time_bounds_nothing() -> None:
    """A host that refuses at once on a fast link (25 ms for 150 KB at 49 Mbit/s) must not take the
    estimate down: that much is the board's delays and the estimate's jitter."""
    meter, clock = _meter()
    ticket = meter.sending(FRAME)
    clock.now += 0.045
    assert meter.failed(ticket, RemoteError(ErrorCode.OVERLOADED, "queue full")) is None
    assert meter.rate_bps == pytest.approx(FAST) and meter.overdue() is None


def test_only_the_upload_the_link_was_carrying_bounds_it() -> None:
    """The second request waited behind the first: its time is not its own."""
    meter, clock = _meter()
    first = meter.sending(FRAME)
    second = meter.sending(FRAME)
    clock.now += HELD_S
    assert meter.failed(second, LOST) is None
    assert meter.failed(first, LOST) == pytest.approx(COLLAPSED)


def test_a_small_payload_that_fails_bounds_nothing() -> None:
    meter, clock = _meter()
    ticket = meter.sending(1_000)
    clock.now += HELD_S
    assert meter.failed(ticket, LOST) is None and meter.rate_bps == pytest.approx(FAST)


def test_after_a_collapse_the_link_is_busy_until_a_probe_measures_it() -> None:
    """Busy to the pipeline (``overdue``: the policy runs batches here at once) and stale (the
    pipeline probes); a bare ping measures no rate, a payload probe does."""
    meter, clock = _meter()
    _fail(meter, clock, LOST)
    clock.now += 10.0
    assert meter.overdue() == pytest.approx(COLLAPSED) and meter.stale(1.0)
    meter.observe_probe(0, 2.0)
    assert meter.overdue() is not None
    # 16 KB (the probe sized for 0.5 Mbit/s) back in 2 ms + 2.7 ms on the wire: 49 Mbit/s.
    assert meter.observe_probe(16_384, 2.0 + 8e3 * 16_384 / FAST) == pytest.approx(FAST)
    assert meter.rate_bps == pytest.approx(FAST) and meter.overdue() is None and not meter.stale(1.0)


def test_a_probe_that_finds_the_link_still_slow_is_the_estimate() -> None:
    meter, clock = _meter()
    _fail(meter, clock, LOST)
    meter.observe_probe(16_384, 8e3 * 16_384 / 0.2e6)  # 0.2 Mbit/s: slower than the bound said
    assert meter.rate_bps == pytest.approx(0.2e6) and meter.overdue() is None


def test_the_upload_behind_a_failed_one_is_timed_from_its_failure() -> None:
    """The link is done with the failed one by then at the latest: the next one is not overdue for
    the time it waited behind it."""
    meter, clock = _meter()
    first = meter.sending(FRAME)
    meter.sending(FRAME)
    clock.now += HELD_S
    meter.failed(first, LOST)
    meter.observe_probe(16_384, 8e3 * 16_384 / FAST)  # the link measured back: only the second is out
    assert meter.overdue() is None
