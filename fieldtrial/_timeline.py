"""A run's timeline beside its latencies: why frames were dropped, why a frame ran on the board,
when the split changed, and what the link really did.

A dropped frame has no latency (it was never classified), so the report counts and draws it on
its own, by the reason the trace gives. A frame answered on the board (split ``local``) was put
there by the policy, or by a host that refused it for its deadline, or by a host that failed:
three different stories (a choice, a host too busy to be in time, a host gone), so the report
never lumps them (:func:`local_cause`). The split changes are counted as the run counts them,
in the order the frames were answered (:func:`split_changes`). The board only estimates the
link's rate; where a testbed shaped the link, the trace also holds the rate it really had
(``link_rate`` records), and the estimate is judged against that.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from device_runtime import LOCAL
from device_runtime.stream import DROP_QUEUE_FULL

__all__ = [
    "AFTER_DEADLINE", "AFTER_FAILURE", "BY_CHOICE", "LOCAL_CAUSES", "NOT_RECORDED", "NOT_TOLD", "deadline_misses",
    "drop_reason", "drops_by_reason", "estimate_over_real", "local_cause", "local_cause_label", "real_rate_at",
    "real_rate_steps", "reason_label", "split_changes", "split_reason_label", "split_reasons",
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


#: A split reason's kind (trace schema 4: ``device_runtime.stream._reason``) in words.
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


#: Why an answered frame ran on the board: the policy put it there (``fixed``, ``table``,
#: ``no_host``, ``upload_cap``, ...); the host refused it for its deadline (reason ``deadline``);
#: the host failed (reason ``fallback``); or it fell back in a trace that does not say why (an
#: ``error`` without either reason: traces before schema 4, where a deadline refusal fell back
#: like a failure). The two causes are named by their reason's kind (``device_runtime.stream._reason``).
BY_CHOICE, AFTER_DEADLINE, AFTER_FAILURE, NOT_TOLD = "by_choice", "deadline", "fallback", "refused_or_failed"
LOCAL_CAUSES = (BY_CHOICE, AFTER_DEADLINE, AFTER_FAILURE, NOT_TOLD)
_LOCAL_CAUSE_LABELS = {  # (in a legend, in a table's row under local)
    BY_CHOICE: ("local by choice", "by choice"),
    AFTER_DEADLINE: ("local after a deadline refusal (the host could not answer in time)", "after a deadline refusal"),
    AFTER_FAILURE: ("local after a host failure", "after a host failure"),
    NOT_TOLD: ("local after a refused or failed offload (this trace does not say which)", "refused or failed (untold)"),
}


def local_cause(frame: dict[str, Any]) -> str | None:
    """Why an answered ``frame`` ran on the board (one of :data:`LOCAL_CAUSES`); None where it did not.

    The reason's kind decides (trace schema 4 on); an ``error`` without a ``deadline`` or
    ``fallback`` reason is :data:`NOT_TOLD`, not a failure: before schema 4 a deadline refusal
    fell back with an error too, and calling it a failure is what the report must not do.
    """
    if frame["split"] != LOCAL:
        return None
    reason = frame.get("reason")
    kind = reason.get("kind") if isinstance(reason, dict) else None
    if kind in (AFTER_DEADLINE, AFTER_FAILURE):
        return kind
    return NOT_TOLD if frame.get("error") else BY_CHOICE


def local_cause_label(cause: str, short: bool = False) -> str:
    """A local cause (:data:`LOCAL_CAUSES`) in words; ``short``: for a row under the local split's."""
    return _LOCAL_CAUSE_LABELS[cause][short]


def split_changes(frames: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The answered frames whose split differs from the answered frame's before them, in the order
    the trace wrote them: the order the run answered them, which is how the run counts its split
    changes (``split_change`` events, ``split_changes`` in its final summary: the split answering
    frames changed, a fallback to local included). Not in capture order: with requests in flight a
    frame answered here after a failure is answered before frames captured ahead of it, and sorting
    by capture would hide the changes the run saw. ``frames``: as read, not sorted."""
    answered = [f for f in frames if not f.get("dropped")]
    return [b for a, b in zip(answered, answered[1:]) if a["split"] != b["split"]]


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


def real_rate_at(times: Sequence[float], steps: Sequence[dict[str, Any]], t: float) -> float | None:
    """The real rate in force at ``t`` (Mbit/s; ``times``: the steps' ``t``, :func:`real_rate_steps`'
    order); None before the first step."""
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
        real = real_rate_at(times, steps, f["t"]) if f.get("rate_bps") else None
        if real is not None:
            ratios.append(f["rate_bps"] / _BITS_PER_MBIT / real)
    if not ratios:
        return None
    p5, p50, p95 = np.percentile(np.asarray(ratios), [5, 50, 95])
    return {"frames": len(ratios), "p5": float(p5), "p50": float(p50), "p95": float(p95)}
