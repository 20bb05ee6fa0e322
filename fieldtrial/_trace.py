"""Read a trace written by ``split-device run --trace`` (:mod:`device_runtime.stream.trace`) for a report.

Its records come from the one reader of a trace (:func:`splitedge.reading.trace_records`, strict: a line
that is no JSON object is an error); what is here is what a report keeps of them and the checks of
the fields it reads.

A trace is untrusted input (it comes off a board, or from anyone): every field the report reads
is checked here, once, so that a bad record ends the report with one line naming its file, line
and field, never a traceback or a NaN in a summary. A number must be finite and in a range a run
can produce: a time of a frame a day long, a rate of 10 Tbit/s or bytes past 4 GiB are no
measurement, and would overflow the sums the report makes of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from device_runtime.stream.trace import TRACE_SCHEMA
from fieldtrial._tally import MAX_KEPT, MAX_SHOWN, OTHER, Sample, Tally
from splitedge import SplitEdgeError, shown
from splitedge.reading import FRAME, LINK_RATE, MAX_LINE_BYTES, trace_records

__all__ = [
    "MAX_KEPT", "MAX_LINE_BYTES", "MAX_NAME", "MAX_SHOWN", "OTHER", "TRACE_SCHEMA_1", "TRACE_SCHEMA_2",
    "TRACE_SCHEMA_3", "TRACE_SCHEMA_4", "TRACE_SCHEMA_5", "Trace", "load_trace", "read_trace", "records_waits",
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
    empty for a run on a link nobody shaped). ``grouped``: per field (``split``, ``drop_reason``,
    ``reason``), how many distinct values past :data:`MAX_SHOWN` were read as :data:`OTHER` and on
    how many frames (``{"values": n, "frames": m}``); empty where none was.

    ``frames``: every frame up to :data:`MAX_KEPT`, else a sample of that many (:mod:`fieldtrial._tally`),
    in the trace's order, each with the fields a report reads; ``tally``: the exact counts over every
    frame (None: ``frames`` are all of them, and a report counts them); ``rates_left_out``: the
    ``link_rate`` records past :data:`MAX_KEPT`, counted and not read."""

    run: dict[str, Any]
    frames: list[dict[str, Any]]
    link_rates: list[dict[str, Any]]
    grouped: dict[str, dict[str, int]] = field(default_factory=dict)
    tally: Tally | None = None
    rates_left_out: int = 0

    @property
    def sampled(self) -> bool:
        """Whether ``frames`` are a sample: the trace had more than :data:`MAX_KEPT`."""
        return self.tally is not None and self.tally.frames > len(self.frames)


#: The longest name of a split, a drop reason, a split reason's kind or a link_rate's setter: a
#: split id is a few dozen characters, and a report keeps up to 10,000 names (a megabyte each would
#: be 10 GB).
MAX_NAME = 256
#: The fields of the run record a report copies into its summary or compares (each checked).
_RUN_SCALARS = ("bundle_id", "policy", "batch", "source", "started_unix", "backend", "precision", "calibration",
                "schema")
#: The fields of a frame record a report reads: a kept frame holds these alone, under one copy of
#: each name (a parsed record holds its own copy of every name: a frame kept whole cost 3 KB).
_FRAME_FIELDS = ("type", "t", "index", "dropped", "drop_reason", "split", "batch", "bytes", "rate_bps",
                 "preprocess_ms", "head_ms", "transfer_ms", "tail_ms", "total_ms", "queue_ms", "slot_ms",
                 "host_queue_ms", "deadline_ms", "error", "reason")


def load_trace(path: str | Path, keep: int = MAX_KEPT) -> Trace:
    """Every record of a trace a report reads; a malformed line is an error naming its number.

    Read a line at a time, each at most :data:`MAX_LINE_BYTES`, in memory bounded whatever the
    trace's length: every frame is counted (:class:`fieldtrial._tally.Tally`) and at most
    :data:`MAX_KEPT` are kept, with the fields a report reads (:class:`fieldtrial._tally.Sample`);
    splits, drop reasons and split reasons past :data:`MAX_SHOWN` distinct values are grouped
    (:class:`Trace`'s ``grouped``). ``keep``: the most frames (and link_rate records) kept."""
    path = Path(path)
    records = trace_records(path, kinds=(FRAME, LINK_RATE), strict=True)
    number, record = next(records)  # the run record (the reader refuses a file that starts with none)
    run = _checked_run(path, number, record)
    tally, sample = Tally(), Sample(keep)
    rates: list[dict[str, Any]] = []
    rates_left_out = 0
    for number, record in records:
        if record.get("type") == FRAME:
            frame = _kept(_checked_frame(path, number, record))
            tally.add(frame)
            sample.add(frame)
        elif record.get("type") == LINK_RATE:
            if len(rates) < keep:
                rate = _checked_rate(path, number, record)
                rates.append({"type": LINK_RATE, "t": rate["t"], "rate_bps": rate["rate_bps"],
                              "set_by": rate.get("set_by")})
            else:
                rates_left_out += 1
    tally.finish()
    frames = sample.frames()
    grouped = tally.group(frames)
    return Trace(run, frames, sorted(rates, key=lambda r: r["t"]), grouped, tally, rates_left_out)


def _kept(frame: dict[str, Any]) -> dict[str, Any]:
    """What a report keeps of a checked frame: the fields it reads (:data:`_FRAME_FIELDS`), the reason's
    kind alone and at most :data:`MAX_NAME` characters of an error (whose presence is all it reads): a
    frame kept is a few hundred bytes, whatever its line held (up to :data:`MAX_LINE_BYTES`)."""
    kept = {name: frame[name] for name in _FRAME_FIELDS if name in frame}
    if isinstance(kept.get("reason"), dict):
        kept["reason"] = {"kind": kept["reason"]["kind"]}
    if isinstance(kept.get("error"), str):
        kept["error"] = kept["error"][:MAX_NAME]
    return kept


def read_trace(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The run record and the frame records (:func:`load_trace` without the link's rate): every frame
    up to :data:`MAX_KEPT`, else a sample of that many."""
    trace = load_trace(path)
    return trace.run, trace.frames


def _checked_run(path: Path, number: int, record: dict[str, Any]) -> dict[str, Any]:
    """A run record whose fields a report copies into its summary (strict JSON) are null, a word,
    true or false, or a finite number; ``calibration_key`` null or a list of up to two words."""
    for name in _RUN_SCALARS:
        value = record.get(name)
        finite = isinstance(value, float) and math.isfinite(value)
        if not (value is None or _is_text(value) or isinstance(value, (bool, int)) or finite):
            raise SplitEdgeError(f"{path}:{number}: the run record's {name} must be null, a word or a finite "
                                 f"number, got {shown(value)}")
    key = record.get("calibration_key")
    if key is not None and not (isinstance(key, list) and len(key) <= 2 and all(_is_text(k) for k in key)):
        raise SplitEdgeError(f"{path}:{number}: the run record's calibration_key must be null or "
                             f"[backend, precision], got {shown(key)}")
    if record.get("schema") not in _READABLE:
        raise SplitEdgeError(f"{path}:{number}: trace schema {shown(record.get('schema'))}; this version reads "
                             f"{', '.join(_READABLE)}")
    return record


#: The bounds of what a trace's fields can hold (module docstring).
_MAX_MS = 86_400_000.0  # a day
_MAX_T_S = 1e9  # 31 years from the run's start
_MIN_RATE_BPS, _MAX_RATE_BPS = 1.0, 1e13
_MAX_BYTES = 2**32
_MAX_BATCH = 65_536
#: A frame's times that the report reads: the stages always, the waits from trace schema 2 on.
_STAGE_TIMES = ("preprocess_ms", "head_ms", "transfer_ms", "tail_ms", "total_ms")
_WAIT_TIMES = ("queue_ms", "slot_ms", "host_queue_ms")


def _is_text(value: Any) -> bool:
    """A string a picture or a page can hold: one with a lone surrogate (JSON's ``"\\ud800"``) is no
    text (matplotlib's font code raised a TypeError on a split named so), and no writer writes one."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_name(value: Any) -> bool:
    """Text of at most :data:`MAX_NAME` characters: a name a report counts, keeps and draws."""
    return _is_text(value) and len(value) <= MAX_NAME


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
        if not (record.get("drop_reason") is None or _is_name(record["drop_reason"])):
            raise bad("drop_reason", f"a word (at most {MAX_NAME} characters) or null")
        return record
    if not _is_name(record.get("split")) or not record["split"]:
        raise bad("split", f"a split's name (at most {MAX_NAME} characters)")
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
    if not (record.get("error") is None or _is_text(record["error"])):
        raise bad("error", "null or a message")
    reason = record.get("reason")
    if reason is not None and not (isinstance(reason, dict) and _is_name(reason.get("kind"))):
        raise bad("reason", f"null or an object with a kind (a word of at most {MAX_NAME} characters)")
    return record


def _checked_rate(path: Path, number: int, record: dict[str, Any]) -> dict[str, Any]:
    """A link_rate record with a time and a positive rate: a plot of a bad one would mislead."""
    t, rate = record.get("t"), record.get("rate_bps")
    if not _in_range(t, -_MAX_T_S, _MAX_T_S):
        raise SplitEdgeError(f"{path}:{number}: a {LINK_RATE} record needs a number t (seconds within "
                             f"±{_MAX_T_S:g}), got {shown(t)}")
    if not _in_range(rate, -math.inf, math.inf):
        raise SplitEdgeError(f"{path}:{number}: a {LINK_RATE} record needs a number rate_bps, got {shown(rate)}")
    if not (record.get("set_by") is None or _is_name(record["set_by"])):
        raise SplitEdgeError(f"{path}:{number}: a {LINK_RATE} record's set_by must be null or a word (at most "
                             f"{MAX_NAME} characters), got "
                             f"{shown(record.get('set_by'))}")
    if not _MIN_RATE_BPS <= rate <= _MAX_RATE_BPS:
        raise SplitEdgeError(f"{path}:{number}: a {LINK_RATE} record's rate_bps must be > 0 (from {_MIN_RATE_BPS:g} "
                             f"to {_MAX_RATE_BPS:g} bit/s), got {shown(rate)}")
    return record


def records_waits(run: dict[str, Any]) -> bool:
    """Whether the run's frames record their waits apart from their stage times (trace schema 2 on)."""
    return run.get("schema") != TRACE_SCHEMA_1
