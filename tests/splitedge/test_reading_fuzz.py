"""The trace readers fuzzed (issue 45: traces are untrusted input): whatever bytes a trace holds,
:func:`splitedge.reading.trace_lines`, :func:`~splitedge.reading.trace_json`,
:func:`~splitedge.reading.trace_records` and the report's reading of records
(:func:`fieldtrial._trace.load_trace`, then the summary) give records, or a :class:`SplitEdgeError`
of one line naming the file and the line; never another exception. Derandomized, and a few hundred
examples each: the same cases every run, in a few seconds."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Any
from unittest import mock

from hypothesis import example, given, settings
from hypothesis import strategies as st

from device_runtime.stream.trace import TRACE_SCHEMA
from fieldtrial._report import strict_json, summarize
from fieldtrial._trace import load_trace, records_waits
from splitedge import SplitEdgeError, reading

FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None)
#: A line of bytes: mostly JSON-ish text, sometimes anything at all.
_LINE = st.one_of(
    st.binary(max_size=40),
    st.text(alphabet='{}[]":,0123456789.eE+-tfnrul \t\\\x00é', max_size=40).map(str.encode),
    st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"[" * 3000, b"1" * 5000, b"\xff\xfe", b'"\\ud800"',
                     b"{}", b"[]", b"null", b"\r", b"\x0c"]),
)


_FOLDER = tempfile.TemporaryDirectory(prefix="fuzz-trace-")  # one file, written over by each example


def _write(data: bytes) -> Path:
    path = Path(_FOLDER.name) / "run.jsonl"
    path.write_bytes(data)
    return path


def _no_constant(name: str) -> Any:
    raise AssertionError(f"the summary holds {name}: not strict JSON")


def _names_a_line(exc: SplitEdgeError, path: Path, lines: int) -> None:
    """One line, naming ``path`` and a line of it (or saying the first must be the run record)."""
    message = str(exc)
    assert "\n" not in message and "Traceback" not in message, message
    found = re.match(re.escape(str(path)) + r":(\d+): ", message)
    if found is None:
        assert message.startswith(f"{path}: not a splitedge trace (the first line must be the run record)"), message
    else:
        assert 1 <= int(found.group(1)) <= max(lines, 1), message


@FUZZ
@given(st.lists(_LINE, max_size=12), st.booleans())
def test_trace_lines_number_every_line_or_name_the_long_one(lines: list[bytes], ends_a_line: bool) -> None:
    data = b"\n".join(lines) + (b"\n" if ends_a_line and lines else b"")
    path = _write(data)
    with mock.patch.object(reading, "MAX_LINE_BYTES", 32):  # a cap the examples reach
        try:
            read = list(reading.trace_lines(path))
        except SplitEdgeError as exc:
            _names_a_line(exc, path, data.count(b"\n") + 1)
            assert "longer than 32 bytes" in str(exc)
            return
    assert [n for n, _ in read] == list(range(1, len(read) + 1))
    assert b"".join(line for _, line in read) == data


@FUZZ
@given(st.lists(_LINE, max_size=12))
@example([b'{"type": "run"}', b"1" * 5000, b"{}"])  # an int past Python's 4,300 digits: ValueError, not JSON
@example([b"[" * 3000, b"{}"])  # nested past the recursion limit
def test_trace_json_gives_records_or_names_the_line(lines: list[bytes]) -> None:
    path = _write(b"\n".join(lines) + b"\n")
    try:
        read = list(reading.trace_json(path))
    except SplitEdgeError as exc:
        _names_a_line(exc, path, len(lines))
        return
    assert all(1 <= n <= len(lines) for n, _ in read)


@FUZZ
@given(st.lists(_LINE, max_size=12))
def test_trace_records_give_a_run_first_or_say_why_not(lines: list[bytes]) -> None:
    path = _write(b"\n".join(lines) + b"\n")
    for strict in (False, True):  # the board and the replay leave a line of no object out; the report refuses it
        try:
            read = list(reading.trace_records(path, strict=strict))
        except SplitEdgeError as exc:
            _names_a_line(exc, path, len(lines))
            continue
        assert read[0][1]["type"] == "run" and all(isinstance(record, dict) for _, record in read)


@FUZZ
@given(st.lists(_LINE, max_size=10))
def test_the_report_reads_any_lines_after_a_run_record_or_names_the_line(lines: list[bytes]) -> None:
    run = {"type": "run", "schema": TRACE_SCHEMA, "bundle_id": "b", "policy": "auto", "batch": 1}
    path = _write(b"\n".join([json.dumps(run).encode(), *lines]) + b"\n")
    try:
        load_trace(path)
    except SplitEdgeError as exc:
        _names_a_line(exc, path, len(lines) + 1)


#: JSON values a field of a record may hold, the hostile ones included (NaN and the infinities are
#: what Python's json writes and reads back).
_VALUE = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
    st.sampled_from(["local", "offload", "$\\frac{a}{$", "other (grouped)", "queue_full", "", "\ud800"]),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.sampled_from(["kind", "x"]), st.text(max_size=4), max_size=2),
)
_FIELDS = ("t", "index", "dropped", "drop_reason", "split", "batch", "bytes", "rate_bps", "preprocess_ms", "head_ms",
           "transfer_ms", "tail_ms", "total_ms", "queue_ms", "slot_ms", "host_queue_ms", "deadline_ms", "error",
           "reason", "set_by")


def _frame(i: int) -> dict[str, Any]:
    return {"type": "frame", "t": i * 0.1, "index": i, "split": ("cut", "local", "offload")[i % 3], "batch": 1,
            "bytes": 100, "rate_bps": 8e6, "preprocess_ms": 1.0, "head_ms": 2.0, "transfer_ms": 3.0, "tail_ms": 4.0,
            "total_ms": 12.0, "queue_ms": 0.5, "dropped": False, "error": None, "reason": {"kind": "table"}}


#: A record of a trace: a frame or a link_rate record with some fields changed to any value, or dropped.
_RECORD = st.builds(
    lambda i, kind, changes, removed: {
        **{k: v for k, v in ({**_frame(i), "type": kind} if kind == "frame" else
                             {"type": kind, "t": i * 0.1, "rate_bps": 1e6, "set_by": "netem"}).items()
           if k not in removed},
        **changes},
    st.integers(min_value=0, max_value=50), st.sampled_from(["frame", "frame", "frame", "link_rate", "other"]),
    st.dictionaries(st.sampled_from(_FIELDS), _VALUE, max_size=3), st.sets(st.sampled_from(_FIELDS), max_size=2),
)


def _line(record: dict[str, Any]) -> bytes:
    return json.dumps(record, allow_nan=True).encode()


@FUZZ
@given(st.lists(_RECORD, min_size=1, max_size=8), st.dictionaries(st.sampled_from(
    ["schema", "bundle_id", "calibration_key", "batch", "policy"]), _VALUE, max_size=2))
def test_the_report_reads_any_records_into_strict_json_or_names_the_line(
    records: list[dict[str, Any]], run_changes: dict[str, Any],
) -> None:
    """A trace :func:`load_trace` takes is summarized into strict JSON (no NaN, no infinity); one it
    refuses is one line naming the line and the field."""
    run = {"type": "run", "schema": TRACE_SCHEMA, "bundle_id": "b", "policy": "auto", "batch": 1,
           "calibration": None, **run_changes}
    lines = [_line(run), *map(_line, records)]
    path = _write(b"\n".join(lines) + b"\n")
    try:
        trace = load_trace(path)
    except SplitEdgeError as exc:
        _names_a_line(exc, path, len(lines))
        return
    if trace.frames:
        summary = summarize(trace.run, trace.frames, None, records_waits(trace.run), trace.link_rates, trace.tally)
        json.loads(strict_json(summary, path), parse_constant=_no_constant)
