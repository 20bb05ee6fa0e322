"""What a run reports as its frames come, instead of a line per frame: the split changes and summaries.

:class:`RunEvents` turns the stream's results into events, each a JSON-ready dict with an
``event`` key: ``split_change`` when the split answering frames changes (its first one
included: from None), with the reason; ``summary`` every ``every_s`` seconds on an injected
clock (frames answered and dropped in the period, fps, p50/p95 of capture-to-answer ms, each
split's share, the hosts); ``final``, the same over the whole run, with the switches.
``split-device run`` prints them as lines or JSON lines; a test drives the clock itself.

Summaries come with results: a stream that answers nothing (a stalled camera) prints none until
it does. The period's latencies are kept whole (a period holds at most a few hundred frames);
the run's are binned (:class:`LatencyHistogram`), so a run of days keeps a few kB.
"""

from __future__ import annotations

import bisect
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from device_runtime.stream.results import FrameResult

__all__ = ["LatencyHistogram", "RunEvents"]

#: Histogram bins per decade of milliseconds: a percentile read from one is within 3 % of the true one.
BINS_PER_DECADE = 40


class LatencyHistogram:
    """Latencies (ms) in log-spaced bins from 0.1 ms to 100 s: percentiles of a long run in fixed memory."""

    _EDGES = tuple(10 ** (k / BINS_PER_DECADE) for k in range(-BINS_PER_DECADE, 5 * BINS_PER_DECADE + 1))

    def __init__(self) -> None:
        self._counts = [0] * (len(self._EDGES) + 1)
        self.count = 0

    def add(self, ms: float) -> None:
        self._counts[bisect.bisect_right(self._EDGES, ms)] += 1
        self.count += 1

    def percentile(self, q: float) -> float | None:
        """The ``q``-th percentile (0-100): the geometric middle of the bin it falls in; None when empty."""
        if not self.count:
            return None
        rank, seen = math.ceil(q / 100.0 * self.count), 0
        for i, n in enumerate(self._counts):
            seen += n
            if seen >= max(rank, 1):
                low = self._EDGES[i - 1] if i > 0 else self._EDGES[0]
                high = self._EDGES[i] if i < len(self._EDGES) else self._EDGES[-1]
                return math.sqrt(low * high)
        return self._EDGES[-1]


def _percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(math.ceil(q / 100.0 * len(ordered)), 1) - 1]


@dataclass
class _Tally:
    """Frames of a period (or of the run): answered, dropped, fallbacks, by split, by host."""

    answered: int = 0
    dropped: int = 0
    fallbacks: int = 0
    splits: Counter[str] = field(default_factory=Counter)
    hosts: Counter[str] = field(default_factory=Counter)

    def add(self, result: FrameResult) -> None:
        if result.dropped:
            self.dropped += 1
            return
        self.answered += 1
        self.fallbacks += bool(result.error)
        self.splits[result.split] += 1
        self.hosts[result.host or "local"] += 1

    def fields(self, seconds: float, p50: float | None, p95: float | None) -> dict[str, Any]:
        return {
            "seconds": round(seconds, 3), "answered": self.answered, "dropped": self.dropped,
            "fallbacks": self.fallbacks, "fps": round(self.answered / seconds, 3) if seconds > 0 else None,
            "p50_ms": None if p50 is None else round(p50, 3), "p95_ms": None if p95 is None else round(p95, 3),
            "splits": {s: round(n / self.answered, 4) for s, n in self.splits.most_common()},
            "hosts": [h for h, _ in self.hosts.most_common()],
        }


class RunEvents:
    """A run's events from its results (module docstring); ``clock`` is read once per result."""

    def __init__(self, every_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        if not every_s > 0:
            raise ValueError(f"summaries every {every_s!r} s: expected a number of seconds > 0")
        self.every_s, self._clock = every_s, clock
        self._started = self._period_start = clock()
        self._period, self._period_ms = _Tally(), []
        self._run, self._run_ms = _Tally(), LatencyHistogram()
        self._split: str | None = None
        self.changes = 0  # of the split answering frames (a fallback to local counts), not of the policy's

    def frame(self, result: FrameResult) -> list[dict[str, Any]]:
        """The events ``result`` makes: a split change where its split is not the last answered
        frame's, a summary where one is due."""
        events = []
        for tally in (self._period, self._run):
            tally.add(result)
        if not result.dropped:
            self._period_ms.append(result.total_ms)
            self._run_ms.add(result.total_ms)
            if result.split != self._split:
                events.append({
                    "event": "split_change", "index": result.index, "from": self._split, "to": result.split,
                    "reason": result.reason_dict(), "rate_bps": result.rate_bps, "host": result.host,
                })
                self.changes += self._split is not None
                self._split = result.split
        now = self._clock()
        if now - self._period_start >= self.every_s:
            events.append({"event": "summary", **self._period.fields(
                now - self._period_start, _percentile(self._period_ms, 50), _percentile(self._period_ms, 95))})
            self._period, self._period_ms, self._period_start = _Tally(), [], now
        return events

    def final(self) -> dict[str, Any]:
        """The whole run's summary (its percentiles from :class:`LatencyHistogram`)."""
        seconds = self._clock() - self._started
        return {"event": "final", **self._run.fields(seconds, self._run_ms.percentile(50), self._run_ms.percentile(95)),
                "frames": self._run.answered + self._run.dropped, "split_changes": self.changes,
                "by_split": dict(self._run.splits.most_common())}
