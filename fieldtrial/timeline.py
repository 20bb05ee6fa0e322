"""A run's timeline beside its latencies: why frames were dropped, and what the link really did.

A dropped frame has no latency (it was never classified), so the report counts and draws it on
its own, by the reason the trace gives. The board only estimates the link's rate; where a
testbed shaped the link, the trace also holds the rate it really had (``link_rate`` records),
and the estimate is judged against that.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from device_runtime.stream import DROP_QUEUE_FULL

__all__ = [
    "NOT_RECORDED", "deadline_misses", "drop_reason", "drops_by_reason", "estimate_over_real", "reason_label",
    "real_rate_steps", "split_reason_label", "split_reasons",
]

_BITS_PER_MBIT = 1e6
#: The reason of a drop in a trace that did not record one (schema 1 and 2).
NOT_RECORDED = "not_recorded"
_REASON_LABELS = {
    DROP_QUEUE_FULL: "queue full (a newer frame took its place)",
    NOT_RECORDED: "reason not recorded (older trace)",
}


def drop_reason(frame: dict[str, Any]) -> str:
    """The trace's word for why ``frame`` (a dropped one) was dropped; :data:`NOT_RECORDED` when it has none."""
    return frame.get("drop_reason") or NOT_RECORDED


def reason_label(reason: str) -> str:
    """A drop reason in words a reader needs no schema for; a reason this version does not know, as written."""
    return _REASON_LABELS.get(reason, reason.replace("_", " "))


def drops_by_reason(frames: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Dropped frames per reason, most frequent first (ties by name, so the order is stable)."""
    counts = Counter(drop_reason(f) for f in frames if f.get("dropped"))
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


#: A split reason's kind (trace schema 4: ``device_runtime.stream.reason``) in words.
_SPLIT_REASON_LABELS = {
    "fixed": "fixed (--split, or no table)",
    "table": "the table's cell for the rate",
    "refined": "the table refined with this run's head times",
    "hold": "held by hysteresis",
    "no_rate": "no rate estimate yet",
    "no_host": "no host for the split wanted",
    "upload_cap": "a slow upload capped the rate",
    "fallback": "host failed: answered here",
    "deadline": "host past the deadline: answered here",
    "bandit": "the layer/semantic bandit",
}


def split_reason_label(kind: str) -> str:
    """A split reason's kind in words; a kind this version does not know, as written."""
    return _SPLIT_REASON_LABELS.get(kind, kind.replace("_", " "))


def split_reasons(frames: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Answered frames per kind of reason for their split (trace schema 4's ``reason: {kind: ...}``),
    most frequent first; empty for a trace that records none (schema 1 to 3)."""
    counts = Counter(
        f["reason"]["kind"] for f in frames
        if not f.get("dropped") and isinstance(f.get("reason"), dict) and f["reason"].get("kind")
    )
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def deadline_misses(frames: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """Answered frames that had a deadline (``deadline_ms``) and how many were answered after it (a
    violation, in SplitPlace's terms; a dropped frame is counted as a drop, not here). None when
    no frame had one (a run without ``--deadline-ms`` on a file source)."""
    timed = [f for f in frames if not f.get("dropped") and f.get("deadline_ms")]
    if not timed:
        return None
    missed = sum(1 for f in timed if f["total_ms"] > f["deadline_ms"])
    return {"with_deadline": len(timed), "missed": missed, "share": missed / len(timed)}


def real_rate_steps(link_rates: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The link's real rate as steps, in Mbit/s from ``t`` on: the trace's ``link_rate`` records
    (sorted by ``t``), a repeat of the rate already in force left out."""
    steps: list[dict[str, Any]] = []
    for record in link_rates:
        rate = record["rate_bps"] / _BITS_PER_MBIT
        if not steps or steps[-1]["rate_mbit"] != rate:
            steps.append({"t": record["t"], "rate_mbit": rate, "set_by": record.get("set_by")})
    return steps


def _rate_at(times: Sequence[float], steps: Sequence[dict[str, Any]], t: float) -> float | None:
    """The real rate in force at ``t`` (Mbit/s; ``times``: the steps' ``t``); None before the first step."""
    i = bisect_right(times, t)
    return steps[i - 1]["rate_mbit"] if i else None


def estimate_over_real(frames: Sequence[dict[str, Any]], steps: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """How the board's rate estimate compared with the real rate: its ratio to the rate in force at
    each frame's capture, over the frames that had both (p5 / p50 / p95). None when none had both.

    1.0 is an estimate that matched; an estimate still catching up after a step shows in the tails.
    """
    times = [s["t"] for s in steps]
    ratios = []
    for f in frames:
        real = _rate_at(times, steps, f["t"]) if f.get("rate_bps") else None
        if real is not None:
            ratios.append(f["rate_bps"] / _BITS_PER_MBIT / real)
    if not ratios:
        return None
    p5, p50, p95 = np.percentile(np.asarray(ratios), [5, 50, 95])
    return {"frames": len(ratios), "p5": float(p5), "p50": float(p50), "p95": float(p95)}
