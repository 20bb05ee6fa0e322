"""A trace's frames counted as they stream by, in bounded memory, with a bounded sample kept (issue 45).

A trace has no length limit: a day at 30 fps is 2.6 M frames, and a hostile one may hold 10 M.
Held whole, 1 M frames cost a report 2.85 GB; 10 M ran out of 8 GB. So a report holds two things
of fixed size, whatever the trace's length:

* a :class:`Tally`: the exact counts (frames, answered, dropped and why, per split its frames and
  its seconds, the local causes, the split reasons, the split changes, the deadline misses, the
  first and last capture), each a handful of numbers, with at most :data:`MAX_COUNTED` distinct
  values counted per field (the rest are counted as :data:`OTHER`);
* a sample of at most :data:`MAX_KEPT` frames (:class:`Sample`), from which the figures that need
  every value are taken: percentiles and CDFs, the bounds, the gains, the model comparison and the
  pictures. Up to :data:`MAX_KEPT` frames, every frame is kept and every figure is exact; past it,
  the sample keeps the frames whose index hashes lowest (a bottom-k sample: uniform over the
  frames, and the same indices in two runs of the same source, so a comparison still matches
  frames by index), and the summary says which figures were estimated from how many frames.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from typing import Any

from device_runtime import LOCAL, OFFLOAD
from fieldtrial import _timeline as timeline

__all__ = ["MAX_COUNTED", "MAX_KEPT", "MAX_SHOWN", "OTHER", "REORDER_WINDOW", "Counted", "Sample", "Tally"]

#: The most frames a report keeps to draw and take percentiles from (about 1 KB each): past it, a
#: sample of this many (module docstring). 10 M frames cost no more memory than 100,000.
MAX_KEPT = 100_000
#: The most distinct values of a field (splits, drop reasons, kinds of split reason) counted apart;
#: the frames of any value first seen past it are counted as :data:`OTHER` at once (a trace of
#: 10 M distinct split names would otherwise hold 10 M names).
MAX_COUNTED = 10_000
#: The most distinct splits (and drop reasons, and kinds of split reason) a report shows apart:
#: the rest are :data:`OTHER`. A summary, a legend and a colour per value are worth reading up to
#: a few dozen; 100,000 distinct names cost a report over 900 s of CPU and drew nothing.
MAX_SHOWN = 24
#: What the values past :data:`MAX_SHOWN` are grouped as (a space: no split id has one).
OTHER = "other (grouped)"
#: How far out of capture order a frame may be written and still have its seconds counted (a
#: split's seconds run from one answered capture to the next): the frames in flight at once, a few
#: dozen in a real run. A frame captured before one this many frames earlier is left out of the
#: seconds and counted (``out_of_order``).
REORDER_WINDOW = 65_536
#: The most split-change times kept to mark on the plots (:data:`fieldtrial._plots.MAX_CHANGES_MARKED`,
#: and one more, to know there were more); every change is counted.
MAX_CHANGE_TIMES = 1_001
#: The values always counted and shown apart: the two ends of the network, and the split reasons that tell a
#: frame run on the board after a refusal or a failure from one run there by choice (:func:`timeline.local_cause`).
ALWAYS_SHOWN = {"split": (LOCAL, OFFLOAD),
                "reason": (timeline.AFTER_DEADLINE, timeline.AFTER_FAILURE)}


class Counted:
    """Frames per value of one field, at most :data:`MAX_COUNTED` values apart (``always`` counted
    whatever their number); the frames of a value first seen past it in ``uncounted``."""

    def __init__(self, always: Iterable[Any] = (), cap: int = MAX_COUNTED) -> None:
        self.counts: dict[Any, int] = {}
        self.uncounted = 0
        self._always, self._cap = frozenset(always), cap

    def add(self, value: Any) -> bool:
        """Count one frame of ``value``; whether its value is counted apart."""
        n = self.counts.get(value)
        if n is not None:
            self.counts[value] = n + 1
        elif len(self.counts) < self._cap or value in self._always:
            self.counts[value] = 1
        else:
            self.uncounted += 1
            return False
        return True

    def all(self) -> dict[Any, int]:
        """Frames per value, those past :data:`MAX_COUNTED` as :data:`OTHER`."""
        if not self.uncounted:
            return self.counts
        return {**self.counts, OTHER: self.counts.get(OTHER, 0) + self.uncounted}

    def shown(self) -> set[Any] | None:
        """The values shown apart: None for all of them (at most :data:`MAX_SHOWN`, none uncounted);
        else those of ``always`` seen and the most frequent (the first seen among equals), and
        :data:`OTHER` for the rest."""
        if len(self.counts) <= MAX_SHOWN and not self.uncounted:
            return None
        kept = {v for v in self._always if v in self.counts}
        for value in sorted(self.counts, key=self.counts.__getitem__, reverse=True):  # stable: first seen first
            if len(kept) >= MAX_SHOWN - 1:  # and OTHER
                break
            kept.add(value)
        return kept

    def group(self, kept: set[Any]) -> dict[str, int]:
        """Fold the values not in ``kept`` into :data:`OTHER`; what was folded (``values`` counted
        apart, ``frames``, and ``values_past_count`` where values came past :data:`MAX_COUNTED`)."""
        moved = {v: n for v, n in self.counts.items() if v not in kept}
        folded = sum(moved.values()) + self.uncounted
        self.counts = {v: n for v, n in self.counts.items() if v in kept}
        if folded:
            self.counts[OTHER] = self.counts.get(OTHER, 0) + folded
        grouped = {"values": len(moved), "frames": folded}
        if self.uncounted:
            grouped["values_past_count"] = 1  # at least one more value, not counted apart
            grouped["values"] += 1
        self.uncounted = 0
        return grouped


def _kind(frame: dict[str, Any]) -> str | None:
    reason = frame.get("reason")
    return reason.get("kind") if isinstance(reason, dict) else None


class Tally:
    """The exact counts of a trace's frames (module docstring), fed one frame at a time in the order
    the trace wrote them (:meth:`add`), then :meth:`finish`-ed."""

    def __init__(self) -> None:
        self.frames = self.answered = 0
        self.first_t, self.last_t = float("inf"), float("-inf")
        self.splits = Counted(ALWAYS_SHOWN["split"])  # answered frames per split
        self.drop_reasons = Counted()  # dropped frames per drop_reason (a word: None counted apart)
        self.drops_unrecorded = 0
        self.kinds = Counted(ALWAYS_SHOWN["reason"])  # answered frames per kind of split reason (``reason`` a dict)
        self.causes: dict[str, int] = {}  # answered on the board, per timeline.local_cause
        self.changes = 0
        self.change_times: list[float] = []
        self.with_deadline = self.missed = 0
        self.seconds: dict[str, float] = {}
        self.out_of_order = 0
        self._last_split: str | None = None
        self._window: list[tuple[float, int, int, str]] = []  # (t, index, seq, split) of answered frames
        self._previous: tuple[float, str] | None = None

    @classmethod
    def of(cls, frames: Iterable[dict[str, Any]]) -> Tally:
        tally = cls()
        for frame in frames:
            tally.add(frame)
        tally.finish()
        return tally

    def add(self, frame: dict[str, Any]) -> None:
        """Count one checked frame (:func:`fieldtrial._trace.load_trace` checked its fields)."""
        self.frames += 1
        t = frame["t"]
        self.first_t, self.last_t = min(self.first_t, t), max(self.last_t, t)
        if frame.get("dropped"):
            reason = frame.get("drop_reason")
            if isinstance(reason, str):
                self.drop_reasons.add(reason)
            else:
                self.drops_unrecorded += 1
            return
        self.answered += 1
        split = frame["split"]
        counted = self.splits.add(split)
        kind = _kind(frame)
        if kind is not None:
            self.kinds.add(kind)
        cause = timeline.local_cause(frame)
        if cause is not None:
            self.causes[cause] = self.causes.get(cause, 0) + 1
        if self._last_split is not None and split != self._last_split:
            self.changes += 1
            if len(self.change_times) < MAX_CHANGE_TIMES:
                self.change_times.append(t)
        self._last_split = split
        if frame.get("deadline_ms"):
            self.with_deadline += 1
            self.missed += frame["total_ms"] > frame["deadline_ms"]
        heapq.heappush(self._window, (t, frame["index"], self.answered, split if counted else OTHER))
        if len(self._window) > REORDER_WINDOW:
            self._advance(*heapq.heappop(self._window))

    def _advance(self, t: float, _index: int, _seq: int, split: str) -> None:
        """The next answered frame in capture order: the split before it held from the capture
        before to this one (``fieldtrial._report._per_split``)."""
        previous = self._previous
        if previous is not None:
            if t < previous[0]:  # further out of order than the window: its span is unknown
                self.out_of_order += 1
                return
            self.seconds[previous[1]] += t - previous[0]
        self.seconds.setdefault(split, 0.0)
        self._previous = (t, split)

    def finish(self) -> None:
        """The frames still in the reorder window, in capture order."""
        while self._window:
            self._advance(*heapq.heappop(self._window))

    def group(self, sample: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
        """Past :data:`MAX_SHOWN` distinct splits, drop reasons or kinds of split reason (those of
        :data:`ALWAYS_SHOWN` always shown), the least frequent counted and rewritten in ``sample``
        (in place) as :data:`OTHER`; what was grouped, per field."""
        fields: tuple[tuple[str, Counted, Callable[[dict[str, Any]], Any], Callable[[dict[str, Any]], None]], ...] = (
            ("split", self.splits, lambda f: None if f.get("dropped") else f["split"],
             lambda f: f.__setitem__("split", OTHER)),
            ("drop_reason", self.drop_reasons, lambda f: f.get("drop_reason") if f.get("dropped") else None,
             lambda f: f.__setitem__("drop_reason", OTHER)),
            ("reason", self.kinds, lambda f: None if f.get("dropped") else _kind(f),
             lambda f: f.__setitem__("reason", {**f["reason"], "kind": OTHER})),
        )
        grouped: dict[str, dict[str, int]] = {}
        for name, counted, value, regroup in fields:
            kept = counted.shown()
            if kept is None:
                continue
            for frame in sample:
                v = value(frame)
                if v is not None and v not in kept:
                    regroup(frame)
            if name == "split":
                self.seconds = _folded(self.seconds, kept)
            grouped[name] = counted.group(kept)
        return grouped

    def drops_by_reason(self) -> dict[str, int]:
        """:func:`timeline.drops_by_reason`, counted: most frequent first, ties by name."""
        counts: dict[str, int] = {}
        for reason, n in self.drop_reasons.counts.items():
            key = reason or timeline.NOT_RECORDED
            counts[key] = counts.get(key, 0) + n
        if self.drops_unrecorded:
            counts[timeline.NOT_RECORDED] = counts.get(timeline.NOT_RECORDED, 0) + self.drops_unrecorded
        return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))

    def split_reasons(self) -> dict[str, int]:
        """:func:`timeline.split_reasons`, counted (a kind that is an empty word is none)."""
        counts = {kind: n for kind, n in self.kinds.counts.items() if kind}
        return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))

    def deadline_misses(self) -> dict[str, Any] | None:
        """:func:`timeline.deadline_misses`, counted."""
        if not self.with_deadline:
            return None
        return {"with_deadline": self.with_deadline, "missed": self.missed, "share": self.missed / self.with_deadline}


def _folded(seconds: dict[str, float], kept: set[str]) -> dict[str, float]:
    out = {split: s for split, s in seconds.items() if split in kept}
    rest = [s for split, s in seconds.items() if split not in kept]
    if rest:
        out[OTHER] = out.get(OTHER, 0.0) + sum(rest)
    return out


def _spread(index: int) -> int:
    """A frame index's place in the sample's order: deterministic (ints and tuples of ints hash the
    same in every process), spread over the indices so that the lowest are a uniform sample."""
    return hash((index, 0x45))


class Sample:
    """At most ``cap`` frames: all of them up to ``cap``, else those whose index spreads lowest
    (:func:`_spread`), returned in the order they were added."""

    def __init__(self, cap: int = MAX_KEPT) -> None:
        self.cap = cap
        self.seen = 0
        self._heap: list[tuple[int, int, dict[str, Any]]] = []  # (-spread, -seq, frame): the highest on top

    def add(self, frame: dict[str, Any]) -> None:
        self.seen += 1
        key = (-_spread(frame["index"]), -self.seen, frame)
        if len(self._heap) < self.cap:
            heapq.heappush(self._heap, key)
        elif key[:2] > self._heap[0][:2]:
            heapq.heapreplace(self._heap, key)

    def __len__(self) -> int:
        return len(self._heap)

    def frames(self) -> list[dict[str, Any]]:
        """The frames kept, in the order added."""
        return [frame for _, _, frame in sorted(self._heap, key=lambda k: -k[1])]
