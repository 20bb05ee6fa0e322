"""Read a trace written by ``split-device run --trace`` (:mod:`device_runtime.stream.trace`).

A trace is untrusted input (it comes off a board, or from anyone): every field the report reads
is checked here, once, so that a bad record ends the report with one line naming its file, line
and field, never a traceback or a NaN in a summary. A number must be finite and in a range a run
can produce: a time of a frame a day long, a rate of 10 Tbit/s or bytes past 4 GiB are no
measurement, and would overflow the sums the report makes of them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from device_runtime.stream import LINK_RATE, TRACE_SCHEMA
from splitedge import SplitEdgeError, shown

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
    frames = [_checked_frame(path, number, r) for number, r in records[1:] if r.get("type") == "frame"]
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


#: The bounds of what a trace's fields can hold (module docstring).
_MAX_MS = 86_400_000.0  # a day
_MAX_T_S = 1e9  # 31 years from the run's start
_MIN_RATE_BPS, _MAX_RATE_BPS = 1.0, 1e13
_MAX_BYTES = 2**32
_MAX_BATCH = 65_536
#: A frame's times that the report reads: the stages always, the waits from trace schema 2 on.
_STAGE_TIMES = ("preprocess_ms", "head_ms", "transfer_ms", "tail_ms", "total_ms")
_WAIT_TIMES = ("queue_ms", "slot_ms", "host_queue_ms")


def _in_range(value: Any, low: float, high: float) -> bool:
    """A JSON number (not a bool) in [low, high]; NaN, infinities and ints past any float fail the
    comparison and so the check."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and low <= value <= high


def _checked_frame(path: Path, number: int, record: dict[str, Any]) -> dict[str, Any]:
    """A frame record whose fields the report reads are what the writer writes; else an error naming
    the line and the field. A dropped frame needs only its time, index and reason; an answered one
    its split, batch, bytes, rate, stage times and waits (absent waits: an older trace), deadline,
    error and reason."""

    def bad(name: str, expected: str) -> SplitEdgeError:
        return SplitEdgeError(
            f"{path}:{number}: a frame record's {name} must be {expected}, got {shown(record.get(name))}")

    if not _in_range(record.get("t"), -_MAX_T_S, _MAX_T_S):
        raise bad("t", f"a number of seconds within ±{_MAX_T_S:g}")
    index = record.get("index")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise bad("index", "an integer >= 0")
    if not isinstance(record.get("dropped", False), bool):
        raise bad("dropped", "true or false")
    if record.get("dropped"):
        if not isinstance(record.get("drop_reason"), (str, type(None))):
            raise bad("drop_reason", "a word or null")
        return record
    if not isinstance(record.get("split"), str) or not record["split"]:
        raise bad("split", "a split's name")
    batch = record.get("batch")
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= _MAX_BATCH:
        raise bad("batch", f"an integer from 1 to {_MAX_BATCH}")
    size = record.get("bytes", 0)
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= _MAX_BYTES:
        raise bad("bytes", f"an integer from 0 to {_MAX_BYTES}")
    for name in _STAGE_TIMES:
        if not _in_range(record.get(name), 0.0, _MAX_MS):
            raise bad(name, f"a number of ms from 0 to {_MAX_MS:g}")
    for name in _WAIT_TIMES:
        if name in record and not _in_range(record[name], 0.0, _MAX_MS):
            raise bad(name, f"a number of ms from 0 to {_MAX_MS:g}")
    rate = record.get("rate_bps")
    if rate is not None and not _in_range(rate, _MIN_RATE_BPS, _MAX_RATE_BPS):
        raise bad("rate_bps", f"null or a rate from {_MIN_RATE_BPS:g} to {_MAX_RATE_BPS:g} bit/s")
    deadline = record.get("deadline_ms")
    if deadline is not None and not (_in_range(deadline, 0.0, _MAX_MS) and deadline > 0):
        raise bad("deadline_ms", f"null or a number of ms over 0, up to {_MAX_MS:g}")
    if not isinstance(record.get("error"), (str, type(None))):
        raise bad("error", "null or a message")
    reason = record.get("reason")
    if reason is not None and not (isinstance(reason, dict) and isinstance(reason.get("kind"), str)):
        raise bad("reason", "null or an object with a kind")
    return record


def _checked_rate(path: Path, number: int, record: dict[str, Any]) -> dict[str, Any]:
    """A link_rate record with a time and a positive rate: a plot of a bad one would mislead."""
    t, rate = record.get("t"), record.get("rate_bps")
    if not _in_range(t, -_MAX_T_S, _MAX_T_S):
        raise SplitEdgeError(f"{path}:{number}: a {LINK_RATE} record needs a number t (seconds within "
                             f"±{_MAX_T_S:g}), got {shown(t)}")
    if not _in_range(rate, -math.inf, math.inf):
        raise SplitEdgeError(f"{path}:{number}: a {LINK_RATE} record needs a number rate_bps, got {shown(rate)}")
    if not _MIN_RATE_BPS <= rate <= _MAX_RATE_BPS:
        raise SplitEdgeError(f"{path}:{number}: a {LINK_RATE} record's rate_bps must be > 0 (from {_MIN_RATE_BPS:g} "
                             f"to {_MAX_RATE_BPS:g} bit/s), got {shown(rate)}")
    return record


def records_waits(run: dict[str, Any]) -> bool:
    """Whether the run's frames record their waits apart from their stage times (trace schema 2 on)."""
    return run.get("schema") != TRACE_SCHEMA_1
