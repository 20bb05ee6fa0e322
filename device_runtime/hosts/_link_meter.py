"""The device's view of the link rate, from its own transfers and, when idle, from probes.

Every remote batch is a rate sample: its bytes over the time the link spent carrying them.
The host reports its queueing and compute time in the reply, so those come off the round
trip (DESIGN.md: the latency model's ``r``). With two batches in flight, the second one's
upload can only start when the first one's is done: its transfer is counted from
``max(sent, previous upload done)``, or a pipelined stream would read as a slow link.

A reply that is late says something before it arrives. When the link drops from 100 to
5 Mbit/s under a 602 KB upload, the reply (the first slow sample) comes a second later;
meanwhile every request sent after it waits behind it in the same socket, whatever its
size. So an upload in flight well past what the estimate predicts (:meth:`LinkMeter.overdue`)
bounds the rate: its bytes have not crossed in the time gone by, so the link is slower than
bytes / time (less the host's usual time and a round trip). :attr:`LinkMeter.rate_bps` is
the estimate capped by that bound, and the pipeline does not queue another batch behind an
overdue one.

An upload that never gets its answer says the same, for good. In the field trial the link
collapsed to 0.5 Mbit/s under 150 KB frames that then failed or were refused: the estimate
followed the link only while one was overdue, stayed at 49 Mbit/s underneath for 10 s, and
each time the cap lifted the board sent another frame into the collapsed link (3.3 s, 2.9 s)
and took the host for lost. So a request that fails after it was overdue (:meth:`LinkMeter.failed`)
takes the estimate itself down to its bound (:meth:`calibration.RateEstimator.observe_bound`),
and the link stays busy to the pipeline (:meth:`LinkMeter.overdue`) until a probe, or a reply
still on its way, measures it again.

The estimate itself (an EWMA in the log domain, the base round trip) is
:class:`calibration.RateEstimator`; this module only turns what the device sees into its
samples.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable

from calibration import MIN_SAMPLE_BYTES, RateEstimator
from device_runtime.link import InferResult, UploadTiming
from device_runtime.wire import ErrorCode
from splitedge.errors import HostUnavailableError, RemoteError

__all__ = ["LinkMeter", "probe_bytes"]

PROBE_SECONDS = 0.05  # a probe sized to take about this long at the current estimate
PROBE_MIN_BYTES, PROBE_MAX_BYTES = 16 * 1024, 1024 * 1024
#: An upload is overdue once in flight this many times its predicted time on the wire ...
OVERDUE_FACTOR = 2.0
#: ... plus a ping, the host's usual time and this much: a board's scheduler and the host's
#: batching delay replies by a few ms.
OVERDUE_SLACK_S = 0.02
#: Weight of each reply's host time (queue + compute) in the running host time.
#: An upload's rate as the kernel sees it crossing caps the estimate once watched this long:
#: the link is carrying queued bytes at that rate now, whatever the estimate says.
CROSSING_MIN_S = 0.02
HOST_ALPHA = 0.3


def probe_bytes(rate_bps: float | None) -> int:
    """Payload of a rate probe: long enough to measure, short enough not to steal the link."""
    if rate_bps is None:
        return 64 * 1024
    return int(min(max(rate_bps * PROBE_SECONDS / 8, PROBE_MIN_BYTES), PROBE_MAX_BYTES))


class LinkMeter:
    """Rate samples from replies and probes, fed to one :class:`RateEstimator`."""

    def __init__(self, estimator: RateEstimator | None = None, clock: Callable[[], float] = time.perf_counter) -> None:
        """``clock`` times the uploads, on the clock of the replies' ``sent`` and ``received``
        (perf_counter); a test passes one it drives, and the estimator made here shares it."""
        self.estimator = estimator or RateEstimator(clock=clock)
        self._clock = clock
        self._upload_done = 0.0  # clock time when the link last finished carrying a request
        self._host_s = 0.0  # running host time per request (queue + compute), from the replies
        self._in_flight: dict[int, tuple[float, int]] = {}  # ticket → (clock time sent, payload bytes)
        self._tickets = itertools.count()
        # The kernel's view of the upload crossing now: ``(bit/s, span_s)`` or None
        # (HostClient.crossing; the pipeline sets it for the host it sends to).
        self.crossing: Callable[[], tuple[float, float] | None] | None = None

    @property
    def rate_bps(self) -> float | None:
        """The estimate, capped by what an overdue upload shows (:meth:`overdue`) and by the
        rate the kernel sees an upload crossing at now (:attr:`crossing`)."""
        rate = self.estimator.rate_bps
        bound = self.overdue()
        if rate is not None and bound is not None:
            rate = min(rate, bound)
        now = self.crossing() if self.crossing is not None and rate is not None else None
        if now is not None and now[1] >= CROSSING_MIN_S:
            rate = min(rate, now[0])
        return rate

    def sending(self, payload_bytes: int) -> int:
        """A request is going up now; returns its ticket for :meth:`settled`."""
        ticket = next(self._tickets)
        self._in_flight[ticket] = (self._clock(), payload_bytes)
        return ticket

    def settled(self, ticket: int) -> None:
        """The request's reply came (its sample follows), or it failed (after :meth:`failed`): it no
        longer holds the link."""
        self._in_flight.pop(ticket, None)

    def failed(self, ticket: int, error: Exception, deadline_ms: float | None = None) -> float | None:
        """Request ``ticket`` settled with ``error`` instead of its reply; ``deadline_ms`` the budget
        it carried. Returns the rate bound (bit/s) it set, or None.

        A failed upload gives no rate, but it can bound one: had its payload crossed, the answer
        would have come by the time it held the link plus a round trip and the host's time. So
        where the host's time is known not to exceed something, an upload that was overdue
        (:meth:`overdue`'s test) when it failed caps the estimate itself at its payload over the
        rest of that time (:meth:`calibration.RateEstimator.observe_bound`): the field trial's
        150 KB frames held the link 2.4 s and more and then failed, and the estimate, fed only by
        replies, stayed at 49 Mbit/s on a 0.5 Mbit/s link. The host's time:

        * no answer at all (:class:`HostUnavailableError`: timed out, connection lost): its usual
          time, as for an overdue upload;
        * ``overloaded``: none, the host refuses such a request as it arrives;
        * ``deadline_exceeded``: at most the request's deadline, counted from its arrival;
        * any other error (a chain's hop that failed after its own timeout, the tail's own
          failure): unknown, so no bound.

        Only the oldest request in flight bounds: one behind it shared the link's time with it.
        Nor does one under :data:`~calibration.MIN_SAMPLE_BYTES` (its time is the path's latency
        more than its rate), or one that failed on time: the board's delays and the estimate's
        jitter account for that much, and a host that refuses at once on a fast link must not
        take the estimate down.
        """
        if ticket not in self._in_flight:
            return None
        oldest = ticket == min(self._in_flight)
        sent, payload = self._in_flight.pop(ticket)
        if not oldest:
            return None
        host_s = _host_bound_s(error, deadline_ms, self._host_s)
        bound = None if host_s is None or payload < MIN_SAMPLE_BYTES else self._overdue_bound(sent, payload, host_s)
        # The link is done with it, at the latest now: the request behind it is timed from here.
        self._upload_done = max(self._upload_done, self._clock() - self.estimator.base_rtt_s / 2)
        if bound is not None:
            self.estimator.observe_bound(bound)
        return bound

    def overdue(self) -> float | None:
        """The rate bound (bit/s) an overdue upload sets, or None when none is overdue.

        Requests share one connection in order, so the oldest one in flight is the one the
        link is carrying. It is overdue when it has been out longer than ``OVERDUE_FACTOR``
        times its payload's time at the estimate plus a ping, the host's running time (both
        measured, so not scaled: ResNet-18's 40 ms tail doubled let a second 602 KB frame
        follow one the link had slowed under) and ``OVERDUE_SLACK_S``; its payload has then
        not crossed in the time since it was sent less the ping and the host's time, and that
        rate bounds the link's.

        An upload that failed overdue (:meth:`failed`) leaves the estimate at its bound, and the
        link counts as busy at that bound until a sample measures it (the estimate is
        :attr:`~calibration.RateEstimator.bounded` till then): the policy runs batches here at
        once, without its hysteresis holding the split that was offloading, and the pipeline
        probes (:meth:`stale`). Nothing is sent into a link a failed upload saw collapse before
        a probe shows it back.
        """
        rate = self.estimator.rate_bps
        if rate is None:
            return None
        bound = None
        if self._in_flight:
            sent, payload = self._in_flight[min(self._in_flight)]
            bound = self._overdue_bound(sent, payload, self._host_s)
        if self.estimator.bounded:
            bound = rate if bound is None else min(bound, rate)
        return bound

    def _overdue_bound(self, sent: float, payload: int, host_s: float) -> float | None:
        """The rate bound (bit/s) of an upload of ``payload`` bytes sent at ``sent`` and not answered
        yet, the host taking ``host_s``; None while it is not overdue (:meth:`overdue`)."""
        rate = self.estimator.rate_bps
        if rate is None:
            return None
        elapsed = self._clock() - max(sent, self._upload_done)
        fixed = self.estimator.base_rtt_s + host_s
        if elapsed <= fixed + OVERDUE_FACTOR * 8.0 * payload / rate + OVERDUE_SLACK_S:
            return None
        return 8.0 * payload / (elapsed - fixed)

    def observe_reply(self, payload_bytes: int, result: InferResult) -> None:
        """One remote batch: ``payload_bytes`` went up, ``result`` came back."""
        host_s = (result.queue_ms + result.compute_ms + result.downstream_ms) / 1000.0  # a chain's later hops too
        start = max(result.sent, self._upload_done)
        self._sample(payload_bytes, start, result.received - host_s - start, result.sent, result.upload)
        upload = result.upload
        if upload is not None and upload.done_s is not None:
            self._upload_done = result.sent + upload.done_s  # the kernel saw it acknowledged by then
        else:
            self._upload_done = result.received - host_s - self.estimator.base_rtt_s / 2
        self._host_s += HOST_ALPHA * (host_s - self._host_s)

    def observe_probe(
        self, payload_bytes: int, round_trip_ms: float, upload: UploadTiming | None = None
    ) -> float | None:
        """A ``ping`` with a payload: no host compute, nothing else in flight; ``upload`` what
        ``TCP_INFO`` showed of it (:class:`~device_runtime.link.Probe`).

        Returns the probe's own rate in bit/s (its payload over its time on the wire; ``inf``
        when it came back no later than a bare ping: the link is faster than it can show),
        None for a bare ping.
        """
        round_trip_s = round_trip_ms / 1000.0
        if not payload_bytes:
            self.estimator.observe_rtt(round_trip_s)
            return None
        return self._sample(payload_bytes, 0.0, round_trip_s, 0.0, upload)

    def _sample(
        self, payload_bytes: int, start: float, transfer_s: float, sent: float, upload: UploadTiming | None
    ) -> float:
        """One payload into the estimate; returns its rate in bit/s (``inf``: faster than any of
        its timings can show).

        ``transfer_s`` is the device's own timing: from ``start`` (its send, or the end of the
        upload before it) to its reply's arrival, less the host's time; a ping's round trip
        (the base round trip) comes off it. ``upload`` is what the kernel showed meanwhile
        (:class:`UploadTiming`). Each reading is a lower bound on the rate, since whatever
        delays the device's clock or its looks at the kernel only makes the payload seem
        slower, so the fastest is taken:

        * the rate the kernel acknowledged bytes at while the payload crossed, timed between two
          looks that both found the link busy: the board's delays are not in it, and it weighs
          by how long it was watched (:meth:`RateEstimator.observe_rate`), both ways;
        * the payload's time to its last byte's acknowledgement, less the path's round trip
          (``tcpi_min_rtt``, not a ping's, which has the host's handling in it), stamped by the
          kernel or found by a look;
        * the device's own timing, weighed by its time on the wire (:meth:`RateEstimator.observe_transfer`).

        A reading faster than the estimate proves it low however short it was (the board's delays
        only ever slow a reading down), so it weighs at least one unit (:meth:`RateEstimator.observe_rate`).
        Weighed by its time on the wire alone, a stall of the board's (a 31 KB upload read as 12 ms
        on loopback, three units, 66 % of the way down) was undone by the fast readings after it at
        ~1 % each: the estimate stayed below the table's boundary frame after frame (issue 28).
        """
        base_s = self.estimator.base_rtt_s
        if upload is not None and upload.receiver_limited:
            return math.inf  # the host held it back: its time is the host's as much as the link's
        device_wire_s = transfer_s - base_s
        device_bps = 8.0 * payload_bytes / device_wire_s if device_wire_s > 0 else None
        done_bps, across_s = None, 0.0
        if upload is not None and upload.done_s is not None:
            across_s = sent + upload.done_s - start
            if across_s > 0:  # the path's round trip off, but never all of it (clocks a µs apart)
                across_s = max(across_s - upload.min_rtt_s, across_s / 2)
                done_bps = 8.0 * payload_bytes / across_s
        acked_bps = upload.acked_bps if upload is not None else None
        best = max((r for r in (device_bps, done_bps, acked_bps) if r is not None), default=None)
        if best is None:
            return math.inf
        if best == acked_bps:
            self.estimator.observe_rate(best, upload.span_s)
            return best
        estimate = self.estimator.rate_bps
        stamped = best == done_bps and upload is not None and upload.stamped
        faster = estimate is not None and best > estimate
        if payload_bytes >= MIN_SAMPLE_BYTES and (faster or (stamped and estimate is None)):
            self.estimator.observe_rate(best, across_s if best == done_bps else device_wire_s)
            return best
        self.estimator.observe_transfer(payload_bytes, 8.0 * payload_bytes / best + base_s)
        return best

    def stale(self, max_age_s: float) -> bool:
        """True when the estimate is older than ``max_age_s``, or is a failed upload's bound that no
        sample has measured since (:meth:`failed`): time to probe."""
        return self.estimator.bounded or self.estimator.age_s() > max_age_s


def _host_bound_s(error: Exception, deadline_ms: float | None, usual_s: float) -> float | None:
    """The most the host can have held a request that failed with ``error`` (:meth:`LinkMeter.failed`):
    ``usual_s`` when no answer came, none for ``overloaded``, the deadline for ``deadline_exceeded``;
    None where it is unknown."""
    if isinstance(error, HostUnavailableError):
        return usual_s
    if isinstance(error, RemoteError) and error.code == ErrorCode.OVERLOADED:
        return 0.0
    if isinstance(error, RemoteError) and error.code == ErrorCode.DEADLINE_EXCEEDED and deadline_ms is not None:
        return deadline_ms / 1000.0
    return None
