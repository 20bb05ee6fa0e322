"""What a run reports as its frames come, instead of a line per frame: the split changes and summaries.

:class:`RunEvents` turns the stream's results into events, each a JSON-ready dict with an
``event`` key: ``split_change`` when the split answering frames changes (its first one
included: from None), with the reason; ``summary`` every ``every_s`` seconds on an injected
clock (frames answered and dropped in the period, fps, p50/p95 of capture-to-answer ms, each
split's share, the hosts); ``final``, the same over the whole run, with the switches.
``split-device run`` prints them as lines or JSON lines; a test drives the clock itself.

A live camera faster than the stream loses frames (each reads ``queue_full``), and the share it
loses is decided by the stream's slowest stage, which the calibration can misjudge (a board on a
shared core ran its head 5-10 times slower than calibrated). So every summary carries the real
drop share against a :class:`DropForecast` made from the stage times the stream measured over its
last :data:`FORECAST_FRAMES` answered frames (:class:`DropWatch`), naming that stage: the same
forecast the run makes at start from the calibration's stage times.

Summaries come with results: a stream that answers nothing (a stalled camera) prints none until
it does. The period's latencies are kept whole (a period holds at most a few hundred frames);
the run's are binned (:class:`LatencyHistogram`), so a run of days keeps a few kB.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from calibration import drop_share
from device_runtime.stream._results import FrameResult

__all__ = ["DropForecast", "DropWatch", "FORECAST_FRAMES", "LatencyHistogram", "RunEvents"]

#: Histogram bins per decade of milliseconds: a percentile read from one is within 3 % of the true one.
BINS_PER_DECADE = 40
#: Answered frames whose stage times the running drop forecast averages: few enough that it follows
#: a stage that slows within seconds, enough to smooth one frame's jitter; memory stays this bounded.
FORECAST_FRAMES = 32
#: How a forecast names each stage of the stream (calibration.LatencyModel.stages_ms's keys).
_STAGE_WORDS = {"board": "board compute", "link": "the link", "host": "the host's tail"}
_MS_PER_S = 1000.0


@dataclass(frozen=True)
class DropForecast:
    """What a live camera's stream answers and drops, from what each of its stages costs a frame.

    The stages overlap, so a stream answers at most one frame per its slowest stage's time
    (:meth:`calibration.LatencyModel.frames_per_s`): ``board`` (preprocessing and the head, one
    after the other on the board's one compute thread), ``link`` (the frame's bytes crossing:
    the link carries one payload at a time) and ``host`` (the tail). The round trip is left out:
    requests overlap in flight, so it delays frames without slowing the stream. Every frame the
    camera gives beyond that rate is dropped (:func:`calibration.drop_share`). Times are ms a
    frame (a batch's stage time over its frames), so batches of any size compare with the
    camera's frame interval. The one model for the start-up forecast from the calibration
    (``split-device run``) and for the running one from measured times (:class:`DropWatch`).
    """

    preprocess_ms: float
    head_ms: float  # the full model for local
    link_ms: float
    tail_ms: float
    interval_ms: float  # the camera's frame interval

    @property
    def stages_ms(self) -> dict[str, float]:
        """Each stage's time a frame: board, link, host."""
        return {"board": self.preprocess_ms + self.head_ms, "link": self.link_ms, "host": self.tail_ms}

    @property
    def bottleneck(self) -> str:
        """The slowest stage (the board on a tie: it is the one the run can change, by its split)."""
        stages = self.stages_ms
        return max(stages, key=lambda stage: stages[stage])

    @property
    def answered_fps(self) -> float:
        """The most frames a second the stream answers; infinite when every stage is free."""
        slowest = self.stages_ms[self.bottleneck]
        return _MS_PER_S / slowest if slowest > 0 else math.inf

    @property
    def share(self) -> float:
        """The part of the camera's frames the stream drops: 0 when it keeps up."""
        return drop_share(_MS_PER_S / self.interval_ms, self.answered_fps)

    def cause(self) -> str:
        """The slowest stage against the frame interval, in words: what stands behind each
        ``queue_full`` drop (e.g. ``board compute 212 ms a frame (preprocess 12 + head 200)
        against a 100 ms frame interval``)."""
        stage = self.bottleneck
        parts = f" (preprocess {_ms(self.preprocess_ms)} + head {_ms(self.head_ms)})" if stage == "board" else ""
        return (f"{_STAGE_WORDS[stage]} {_ms(self.stages_ms[stage])} ms a frame{parts} against a "
                f"{_ms(self.interval_ms)} ms frame interval")

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: the shares, the rates, each stage's part (ms a frame) and the cause."""
        answered = self.answered_fps
        return {
            "drop_share": round(self.share, 4), "answered_fps": round(answered, 3) if math.isfinite(answered) else None,
            "camera_fps": round(_MS_PER_S / self.interval_ms, 3), "bottleneck": self.bottleneck,
            "stages_ms": {"preprocess": round(self.preprocess_ms, 3), "head": round(self.head_ms, 3),
                          "link": round(self.link_ms, 3), "tail": round(self.tail_ms, 3)},
            "interval_ms": round(self.interval_ms, 3), "cause": self.cause(),
        }


def _ms(value: float) -> str:
    """A time in ms as a person reads it: whole ms from 10 up, two significant digits below."""
    return f"{value:.0f}" if value >= 10 else f"{value:.2g}"


def _per_frame(result: FrameResult) -> tuple[float, float, float, float]:
    """An answered frame's (preprocess, head, link, tail) ms, each its share of its batch's stage.

    Its link stage is its bytes at the rate estimate its split was chosen with (the stream's own
    measure of the link, its round trips and the host's time taken off), as the model counts it:
    the frame's whole transfer holds a round trip that overlaps the next request's. A remote frame
    without an estimate counts its whole transfer instead, an upper bound."""
    batch = result.batch
    link = (result.bytes * 8.0 * _MS_PER_S / result.rate_bps if result.rate_bps
            else result.transfer_ms / batch)
    return result.preprocess_ms, result.head_ms / batch, link, result.tail_ms / batch


class DropWatch:
    """A live stream's drops so far, and the drop share its recent stage times forecast.

    The forecast is a :class:`DropForecast` of the mean stage times of the last :data:`FORECAST_FRAMES`
    answered frames, whichever splits answered them, so it follows a stage that slows and a split
    that changes. ``frame_interval_s`` is the camera's (None: a source without one, which drops
    nothing for want of speed, so nothing is forecast). :meth:`add` runs on the stream's loop and
    :meth:`state` on a live page's threads too: a lock keeps them apart, and memory is the window's.
    """

    def __init__(self, frame_interval_s: float | None, frames: int = FORECAST_FRAMES) -> None:
        self.frame_interval_s = frame_interval_s
        self._recent: deque[tuple[float, float, float, float]] = deque(maxlen=frames)
        self._frames = self._dropped = 0
        self._lock = threading.Lock()

    def add(self, result: FrameResult) -> None:
        """One result of the stream, dropped or answered: O(1)."""
        with self._lock:
            self._frames += 1
            if result.dropped:
                self._dropped += 1
            else:
                self._recent.append(_per_frame(result))

    def _measured(self) -> tuple[DropForecast | None, int]:
        """The forecast from the window's mean stage times, and the frames it averages; None
        without a frame interval or before a frame is answered."""
        with self._lock:
            recent = list(self._recent)
        if not self.frame_interval_s or not recent:
            return None, len(recent)
        means = [sum(column) / len(recent) for column in zip(*recent)]
        return DropForecast(*means, interval_ms=self.frame_interval_s * _MS_PER_S), len(recent)

    def fields(self) -> dict[str, Any] | None:
        """The forecast as JSON (:meth:`DropForecast.as_dict`) with the frames it was measured on
        (``measured_frames``); None without a frame interval or before a frame is answered."""
        forecast, measured = self._measured()
        return None if forecast is None else {**forecast.as_dict(), "measured_frames": measured}

    def state(self) -> dict[str, Any]:
        """For a live page: frames and drops of the run so far, the real drop share and the forecast."""
        with self._lock:
            frames, dropped = self._frames, self._dropped
        return {"frames": frames, "dropped": dropped, "drop_share": round(dropped / frames, 4) if frames else None,
                "forecast": self.fields()}


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
        frames = self.answered + self.dropped
        return {
            "seconds": round(seconds, 3), "answered": self.answered, "dropped": self.dropped,
            "drop_share": round(self.dropped / frames, 4) if frames else None,
            "fallbacks": self.fallbacks, "fps": round(self.answered / seconds, 3) if seconds > 0 else None,
            "p50_ms": None if p50 is None else round(p50, 3), "p95_ms": None if p95 is None else round(p95, 3),
            "splits": {s: round(n / self.answered, 4) for s, n in self.splits.most_common()},
            "hosts": [h for h, _ in self.hosts.most_common()],
        }


class RunEvents:
    """A run's events from its results (module docstring); ``clock`` is read once per result.

    ``frame_interval_s``: a live camera's frame interval, for the drop forecast its summaries
    carry (``forecast``, :meth:`DropWatch.fields`; None for a source without one); ``drops``
    keeps it, and a live page reads it from there."""

    def __init__(
        self, every_s: float = 10.0, clock: Callable[[], float] = time.monotonic,
        frame_interval_s: float | None = None,
    ) -> None:
        if not every_s > 0:
            raise ValueError(f"summaries every {every_s!r} s: expected a number of seconds > 0")
        self.every_s, self._clock = every_s, clock
        self.drops = DropWatch(frame_interval_s)
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
        self.drops.add(result)
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
                now - self._period_start, _percentile(self._period_ms, 50), _percentile(self._period_ms, 95)),
                "forecast": self.drops.fields()})
            self._period, self._period_ms, self._period_start = _Tally(), [], now
        return events

    def final(self) -> dict[str, Any]:
        """The whole run's summary (its percentiles from :class:`LatencyHistogram`), its drop share
        against the forecast of its last frames' stage times."""
        seconds = self._clock() - self._started
        return {"event": "final", **self._run.fields(seconds, self._run_ms.percentile(50), self._run_ms.percentile(95)),
                "frames": self._run.answered + self._run.dropped, "split_changes": self.changes,
                "by_split": dict(self._run.splits.most_common()), "forecast": self.drops.fields()}
