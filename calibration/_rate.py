"""The device's running estimate of the link rate r of DSC Eq. 4-6, from its own requests.

The device sees each request's round trip and the host's compute time (reported in the
reply); what remains, ``transfer_s``, is the payload's time on the wire plus the fixed
latency of any request. Subtracting that latency (the smallest recent ping) leaves the time
the payload itself took, and payload bits over it is one sample of r.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

from splitedge import Fields
from splitedge.errors import CalibrationError

_fields = Fields(CalibrationError)  # field checks raising this package's error

#: Below this a payload crosses in about the time of a ping: its "rate" is mostly jitter.
MIN_SAMPLE_BYTES = 4096
#: Pings kept for the base round trip: recent enough to follow a route change, enough to find a quiet one.
RTT_WINDOW = 32
#: Each this long a sample's payload held the link counts as one sample of weight ``alpha``.
FULL_WEIGHT_S = 0.005
#: ... up to this many: one short sample never replaces the estimate outright ...
MAX_UNITS = 3.0
#: ... but one that held the link this long or longer does, and a shorter one above MAX_UNITS'
#: weight weighs its share of this: half a second of the link carrying a payload at one rate is
#: the link's rate now, not a wobble. After a 2.4 s upload at 0.5 Mbit/s, an estimate that kept a
#: third of its 1.3 Gbit/s past read 7.3 Mbit/s and sent the next frame into that link (answered
#: 2.5 s late, issue 28).
REPLACING_S = 0.5


class RateEstimator:
    """EWMA of the link rate in the log domain.

    Rates span four decades (0.1 Mbit/s to 1 Gbit/s): a linear average of 1 and 100 Mbit/s
    samples sits at 50, near the high one, while the log average sits at 10, which is what
    the table lookup (itself log-spaced) needs.

    A payload that crosses in less than ``full_weight_s`` measures the fixed costs around it
    (a scheduler's delay, a board throttled after its head) as much as the link, and they
    only ever make the link look slower. Measured on the emulated 1 Gbit/s link from a
    0.25-core board: a 50 KB cut read 200-360 Mbit/s, a 602 KB one ~820, a 1 MB probe ~900;
    taken at face value, the small cut's samples held the estimate below the rate at which
    offloading pays. So a sample weighs by its time on the wire: each ``full_weight_s`` of
    it is one step of ``alpha`` (``1 - (1 - alpha) ** units``, up to :data:`MAX_UNITS`): a
    48 ms transfer after a rate drop moves the estimate 66 % of the way at once, where a
    sample-count EWMA took four frames to leave a split that had become 8x slower. A short
    sample (under one unit) below the estimate is ignored. A stream of short samples leaves
    the estimate stale (:meth:`age_s` counts from the last full-weight sample), and the
    device probes.

    An upload that failed or was refused long after it was due gives no rate, only a ceiling:
    its payload had not crossed in the time it held the link. :meth:`observe_bound` takes the
    estimate down to that ceiling at once (the field trial's collapsed link read 49 Mbit/s for
    10 s under uploads that failed at 0.5 Mbit/s, since only replies were samples); the first
    sample after it then sets the estimate, since a ceiling is no rate to average with.
    """

    def __init__(
        self, alpha: float = 0.3, initial_bps: float | None = None, full_weight_s: float = FULL_WEIGHT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``clock`` (seconds) dates the samples for :meth:`age_s`: a test passes one it drives."""
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 < alpha <= 1.0:
            raise CalibrationError(f"alpha: expected a number in (0, 1], got {alpha!r}")
        self._alpha = float(alpha)
        self._full_weight_s = _fields.number(full_weight_s, "full_weight_s")
        self._log_rate = None
        if initial_bps is not None:
            self._log_rate = math.log(_fields.number(initial_bps, "initial_bps", minimum=1.0))
        self._rtts: deque[float] = deque(maxlen=RTT_WINDOW)
        self._base_rtt_s = 0.0
        self._samples = 0
        self._clock = clock
        self._last_sample_at: float | None = None
        self._bounded = False  # the estimate is a ceiling (observe_bound), not yet a measurement

    @property
    def rate_bps(self) -> float | None:
        """The current estimate in bit/s; None before the first sample (and without ``initial_bps``)."""
        return None if self._log_rate is None else math.exp(self._log_rate)

    @property
    def base_rtt_s(self) -> float:
        """The smallest of the recent pings: the latency every request pays; 0 before any ping."""
        return self._base_rtt_s

    @property
    def samples(self) -> int:
        """Rate samples taken into the estimate (ignored ones not counted)."""
        return self._samples

    @property
    def bounded(self) -> bool:
        """Whether the estimate is a ceiling (:meth:`observe_bound`) no sample has measured since."""
        return self._bounded

    def observe_rtt(self, rtt_s: float) -> None:
        """Record a ping's round trip (no payload). A non-finite or negative time is a clock
        glitch, not a measurement, and is dropped rather than allowed to stop the caller's loop."""
        if not (math.isfinite(rtt_s) and rtt_s >= 0.0):
            return
        self._rtts.append(rtt_s)
        self._base_rtt_s = min(self._rtts)

    def observe_transfer(self, payload_bytes: int, transfer_s: float) -> float | None:
        """Fold one request into the estimate; return the new estimate, or None if ignored.

        ``transfer_s`` is the round trip minus the host's compute time. The sample is
        8 * payload_bytes / (transfer_s - base_rtt_s). Ignored: payloads under
        MIN_SAMPLE_BYTES, and transfers no longer than the base round trip (nothing left to
        divide by: the payload's own time is lost in the jitter), and samples shorter than
        ``full_weight_s`` on the wire that read slower than the estimate. The sample weighs
        ``1 - (1 - alpha) ** units``, units = wire time / ``full_weight_s`` up to
        :data:`MAX_UNITS` (1 when ``full_weight_s`` is 0), or its wire time's share of
        :data:`REPLACING_S` when that is more; the first sample, and the first after a ceiling
        (:meth:`observe_bound`), sets the estimate.
        """
        wire_s = transfer_s - self._base_rtt_s
        if payload_bytes < MIN_SAMPLE_BYTES or not wire_s > 0.0:  # `not >` also drops NaN
            return None
        log_sample = math.log(8.0 * payload_bytes / wire_s)
        units = min(wire_s / self._full_weight_s, MAX_UNITS) if self._full_weight_s > 0 else 1.0
        if self._log_rate is not None and units < 1.0 and log_sample < self._log_rate:
            return None
        if self._log_rate is None or self._bounded:
            self._log_rate = log_sample
            self._bounded = False
        else:
            self._log_rate += self._weight(units, wire_s) * (log_sample - self._log_rate)
        self._samples += 1
        if wire_s >= self._full_weight_s:
            self._last_sample_at = self._clock()
        return math.exp(self._log_rate)

    def observe_rate(self, rate_bps: float, span_s: float) -> float | None:
        """Fold in a rate the kernel measured over ``span_s`` (bytes acknowledged over the time
        they took, on the kernel's side of the socket); return the new estimate, or None if ignored.

        No fixed latency comes off: the kernel timed the bytes themselves. Nor does a short span
        weigh less than one unit: what makes a short transfer timed by the device read slow (a
        scheduler's delay, the head holding the CPU) is not in it. It weighs
        ``1 - (1 - alpha) ** units``, units = ``span_s`` / ``full_weight_s`` from 1 up to
        :data:`MAX_UNITS`, or the span's share of :data:`REPLACING_S` when that is more; the first
        sample, and the first after a ceiling (:meth:`observe_bound`), sets the estimate. Not a
        positive finite rate: ignored.
        """
        if not (math.isfinite(rate_bps) and rate_bps > 0.0 and math.isfinite(span_s)):
            return None
        log_sample = math.log(rate_bps)
        units = min(max(span_s / self._full_weight_s, 1.0), MAX_UNITS) if self._full_weight_s > 0 else 1.0
        if self._log_rate is None or self._bounded:
            self._log_rate = log_sample
            self._bounded = False
        else:
            self._log_rate += self._weight(units, span_s) * (log_sample - self._log_rate)
        self._samples += 1
        self._last_sample_at = self._clock()
        return math.exp(self._log_rate)

    def observe_bound(self, rate_bps: float) -> float | None:
        """The link is no faster than ``rate_bps``: an upload that had not crossed (and come back)
        in the time it held the link, failed or refused; return the new estimate, or None if ignored.

        A ceiling, not a rate: averaged in as a sample it would say the link runs at exactly that
        rate, and kept apart as a cap on the estimate it would lift again with the upload (the
        field trial: 49 Mbit/s underneath a link collapsed to 0.5 while each failed 150 KB upload
        was out, and the next one sent into it as soon as it was gone). So an estimate above it
        drops to it at once and one at or below it stays; with none yet, it is the estimate. The
        estimate is then :attr:`bounded` until the next sample, which sets it outright: a probe
        that finds the link back is believed whole, not averaged against the ceiling. Not a
        sample: :attr:`samples` and :meth:`age_s` ignore it, so the device probes soon to measure
        the link it left. Not a positive finite rate: ignored.
        """
        if not (math.isfinite(rate_bps) and rate_bps > 0.0):
            return None
        log_bound = math.log(rate_bps)
        if self._log_rate is None or log_bound < self._log_rate:
            self._log_rate = log_bound
            self._bounded = True
        return math.exp(self._log_rate)

    def _weight(self, units: float, wire_s: float) -> float:
        """A sample's weight: ``1 - (1 - alpha) ** units``, or its time on the wire's share of
        :data:`REPLACING_S` when that is more (1 from REPLACING_S on); ``alpha`` alone for every
        sample when samples are not weighed by their time (``full_weight_s`` 0)."""
        by_units = 1.0 - (1.0 - self._alpha) ** units
        return max(by_units, min(wire_s / REPLACING_S, 1.0)) if self._full_weight_s > 0 else by_units

    def age_s(self) -> float:
        """Seconds since the last full-weight rate sample (on the estimator's clock); inf if none yet.

        The runtime sends a probe when the estimate is stale: a device running LOCAL sends
        nothing, and one sending small cuts over a fast link measures little, so nothing
        would otherwise tell it the link got faster.
        """
        if self._last_sample_at is None:
            return math.inf
        return self._clock() - self._last_sample_at
