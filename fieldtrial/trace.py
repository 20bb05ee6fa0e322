"""Read a trace written by ``split-device run --trace`` (:mod:`device_runtime.stream.trace`)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from device_runtime.stream import LINK_RATE, TRACE_SCHEMA
from splitedge import SplitEdgeError

__all__ = [
    "TRACE_SCHEMA_1", "TRACE_SCHEMA_2", "TRACE_SCHEMA_3", "TRACE_SCHEMA_4", "TRACE_SCHEMA_5", "Trace", "load_trace",
    "read_trace", "records_waits",
]

#: Traces before the waits were recorded: ``tail_ms`` held the host's queue, and nothing else
#: told queueing from the stages.
TRACE_SCHEMA_1 = "splitedge.trace/1"
#: Traces before drop reasons and the link's real rate were recorded.
TRACE_SCHEMA_2 = "splitedge.trace/2"
#: Traces before each frame carried the reason for its split.
TRACE_SCHEMA_3 = "splitedge.trace/3"
#: Traces before the head times the policy decided with were recorded.
TRACE_SCHEMA_4 = "splitedge.trace/4"
#: The ``head_times`` records (what ``--split auto`` decided with; a report leaves them to a replay).
#: Named here as well as by the writer's :data:`TRACE_SCHEMA`, so that this reader takes it whichever
#: the writer writes.
TRACE_SCHEMA_5 = "splitedge.trace/5"
_READABLE = tuple(dict.fromkeys(
    (TRACE_SCHEMA, TRACE_SCHEMA_5, TRACE_SCHEMA_4, TRACE_SCHEMA_3, TRACE_SCHEMA_2, TRACE_SCHEMA_1)))


@dataclass(frozen=True)
class Trace:
    """One run as its trace recorded it: the run record, the frames, and the link's real rate
    where a testbed set it (``link_rates``: ``t``, ``rate_bps``, ``set_by``; sorted by ``t``,
    empty for a run on a link nobody shaped)."""

    run: dict[str, Any]
    frames: list[dict[str, Any]]
    link_rates: list[dict[str, Any]]


def load_trace(path: str | Path) -> Trace:
    """Every record of a trace a report reads; a malformed line is an error naming its number."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise SplitEdgeError(f"cannot read the trace {path}: {exc}") from exc
    records = list(_parse(path, lines))
    if not records or records[0][1].get("type") != "run":
        raise SplitEdgeError(f"{path}: not a splitedge trace (the first line must be the run record)")
    run = records[0][1]
    if run.get("schema") not in _READABLE:
        raise SplitEdgeError(f"{path}: trace schema {run.get('schema')!r}; this version reads {', '.join(_READABLE)}")
    frames = [r for _, r in records[1:] if r.get("type") == "frame"]
    rates = [_checked_rate(path, number, r) for number, r in records[1:] if r.get("type") == LINK_RATE]
    return Trace(run, frames, sorted(rates, key=lambda r: r["t"]))


def read_trace(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The run record and the frame records (:func:`load_trace` without the link's rate)."""
    trace = load_trace(path)
    return trace.run, trace.frames


def _parse(path: Path, lines: list[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines):  # the last line of a run cut short
                return
            raise SplitEdgeError(f"{path}:{number}: not JSON: {exc}") from exc
        if not isinstance(record, dict):
            raise SplitEdgeError(f"{path}:{number}: expected a JSON object")
        yield number, record


def _checked_rate(path: Path, number: int, record: dict[str, Any]) -> dict[str, Any]:
    """A link_rate record with a time and a positive rate: a plot of a bad one would mislead."""
    t, rate = record.get("t"), record.get("rate_bps")
    for name, value in (("t", t), ("rate_bps", rate)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise SplitEdgeError(f"{path}:{number}: a {LINK_RATE} record needs a number {name}, got {value!r}")
    if rate <= 0:
        raise SplitEdgeError(f"{path}:{number}: a {LINK_RATE} record's rate_bps must be > 0, got {rate!r}")
    return record


def records_waits(run: dict[str, Any]) -> bool:
    """Whether the run's frames record their waits apart from their stage times (trace schema 2 on)."""
    return run.get("schema") != TRACE_SCHEMA_1
