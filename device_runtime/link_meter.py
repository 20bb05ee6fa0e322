"""The device's view of the link rate, from its own transfers and, when idle, from probes.

Every remote batch is a rate sample: its bytes over the time the link spent carrying them.
The host reports its queueing and compute time in the reply, so those come off the round
trip (DESIGN.md: the latency model's ``r``). With two batches in flight, the second one's
upload can only start when the first one's is done: its transfer is counted from
``max(sent, previous upload done)``, or a pipelined stream would read as a slow link.

The estimate itself (an EWMA in the log domain, the base round trip) is
:class:`calibration.RateEstimator`; this module only turns what the device sees into its
samples.
"""

from __future__ import annotations

import time

from calibration import RateEstimator
from device_runtime.client import InferResult

__all__ = ["LinkMeter", "probe_bytes"]

PROBE_SECONDS = 0.05  # a probe sized to take about this long at the current estimate
PROBE_MIN_BYTES, PROBE_MAX_BYTES = 16 * 1024, 1024 * 1024


def probe_bytes(rate_bps: float | None) -> int:
    """Payload of a rate probe: long enough to measure, short enough not to steal the link."""
    if rate_bps is None:
        return 64 * 1024
    return int(min(max(rate_bps * PROBE_SECONDS / 8, PROBE_MIN_BYTES), PROBE_MAX_BYTES))


class LinkMeter:
    """Rate samples from replies and probes, fed to one :class:`RateEstimator`."""

    def __init__(self, estimator: RateEstimator | None = None) -> None:
        self.estimator = estimator or RateEstimator()
        self._upload_done = 0.0  # perf_counter when the link last finished carrying a request

    @property
    def rate_bps(self) -> float | None:
        return self.estimator.rate_bps

    def observe_reply(self, payload_bytes: int, result: InferResult) -> None:
        """One remote batch: ``payload_bytes`` went up, ``result`` came back."""
        host_s = (result.queue_ms + result.compute_ms) / 1000.0
        start = max(result.sent, self._upload_done)
        self.estimator.observe_transfer(payload_bytes, result.received - host_s - start)
        self._upload_done = result.received - host_s - self.estimator.base_rtt_s / 2

    def observe_probe(self, payload_bytes: int, round_trip_ms: float) -> None:
        """A ``ping`` with a payload: no host compute, nothing else in flight."""
        if payload_bytes:
            self.estimator.observe_transfer(payload_bytes, round_trip_ms / 1000.0)
        else:
            self.estimator.observe_rtt(round_trip_ms / 1000.0)

    def stale(self, max_age_s: float) -> bool:
        """True when the estimate is older than ``max_age_s``: time to probe."""
        return self.estimator.age_s(time.monotonic()) > max_age_s
