"""``--trace FILE.jsonl``: one JSON record per frame, for ``split-device report`` and for users' own tools.

The writer lives with the stream (a board writes traces); the one reader of a trace is
:func:`splitedge.reading.trace_records` (the run record first, the records of the kinds asked for), which
the board (``--head-times``, ``--pace``), the report in ``fieldtrial`` (anywhere: it reads what
:data:`TRACE_SCHEMA` names) and ``testbed replay`` use; the kinds of record are named there once.

The first line describes the run (``type: run``: bundle, policy, batch size, the
calibration file and the (backend, precision) of its table that chose the splits, the
backend and precision that ran, the wall-clock start); every other line is one frame
(``type: frame``): ``t`` (seconds from the start, at capture), the split, batch, bytes on
the link, the rate estimate, the stage times (preprocess / head / transfer / tail ms: the
tail is the host's compute alone), the waits (``queue_ms`` in the board's queue before the
head, ``slot_ms`` for an in-flight slot, ``host_queue_ms`` in the host's queue), the total
ms from capture to answer, whether it was dropped, local or remote, the host, and the error
that made a remote batch fall back, and for a dropped frame why (``drop_reason``:
:data:`~device_runtime.stream._results.DROP_QUEUE_FULL`, ...), and for an answered one why its
batch took its split (``reason``: an object with ``kind`` — fixed, table, refined, hold, no_rate,
no_host, upload_cap, fallback, deadline, bandit — and the fields that kind fills: the table's
cell ``lo_bps``/``hi_bps`` around the estimate, the split the table wanted, the uncapped
estimate, the error, the bandit's arm and score; :mod:`device_runtime.stream._reason`). Lines are
flushed as they are written, so a run cut short (a Pi losing power) leaves a readable trace.

A rehearsal on a shaped link adds the link's real rate (``type: link_rate``: ``t`` in the
frames' seconds, ``rate_bps``, ``set_by``), one record each time it changes, so the report
can set the board's estimate against the truth. The testbed that shapes the link is another
process: it appends them with :func:`append_link_rate`, which times them by the wall clock
from the run record's ``started_unix`` (the frames' ``t`` counts from that same instant);
the writer opens the file for appending, so their lines land between the frames', never
over them. Records are in the order written, not sorted by ``t``.

A run with ``--split auto`` also records what its policy decided with (``type: head_times``:
``t``, and :class:`~device_runtime.stream._policy.HeadTimes`' fields: ``source`` — calibrated,
refined or recorded —, ``index``, the last frame chosen for before they were taken up (null at
the start), ``observed``, ``head_ms`` split -> batch -> ms, and ``edges`` batch -> the table's
``[rate_bps, below, above]``): one at the start and one at each refinement. :func:`read_head_times`
reads them back, for a run that decides with them again (``split-device run --head-times``).

Schema 2 added the waits and took the host's queue out of ``tail_ms`` (schema 1 counted it
there and recorded no other wait); schema 3 added ``drop_reason`` and the ``link_rate``
records; schema 4 added ``reason`` (absent, or null for a dropped frame, in older traces);
schema 5 added the ``head_times`` records. The report reads all five.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

from device_runtime.stream._policy import HeadTimes
from device_runtime.stream._results import FrameResult
from splitedge import SplitEdgeError
from splitedge.reading import FRAME, HEAD_TIMES, LINK_RATE, RUN, trace_records

__all__ = [
    "HEAD_TIMES", "LINK_RATE", "TRACE_SCHEMA", "TraceWriter", "append_link_rate", "frame_record", "read_head_times",
    "read_records",
]

TRACE_SCHEMA = "splitedge.trace/5"
# LINK_RATE: the record kind of the link's real rate (set by a testbed: the board itself only estimates
# it); HEAD_TIMES: of the head times the split policy decided with (trace schema 5 on). Both named in
# splitedge.reading, with the one reader, and exported here as before.
_FRAME_FIELDS = (
    "index", "name", "label", "probability", "split", "batch", "bytes", "rate_bps", "preprocess_ms", "head_ms",
    "transfer_ms", "tail_ms", "queue_ms", "slot_ms", "host_queue_ms", "total_ms", "dropped", "where", "host", "error",
    "missing", "deadline_ms", "drop_reason",
)


class TraceWriter:
    """Appends frame records to a JSONL file; a context manager."""

    def __init__(self, path: str | Path, run: dict[str, Any]) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # O_APPEND: a testbed's link_rate lines, appended by another process, are not overwritten.
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o666)
            self._file: TextIO = open(fd, "w", encoding="utf-8")
        except OSError as exc:
            raise SplitEdgeError(f"cannot write the trace {self.path}: {exc}") from exc
        self._t0 = time.monotonic()
        self._write({"type": RUN, "schema": TRACE_SCHEMA, "started_unix": time.time(), **run})

    def frame(self, result: FrameResult) -> None:
        self._write({"type": FRAME, "t": result.captured - self._t0, **frame_record(result)})

    def link_rate(self, rate_bps: float, set_by: str, applied: float | None = None) -> None:
        """The link's real rate from ``applied`` on (``time.monotonic()``, like a frame's capture;
        default now), for a run that shapes its own link in-process."""
        at = time.monotonic() if applied is None else applied
        self._write(_link_rate_record(at - self._t0, rate_bps, set_by))

    def head_times(self, times: HeadTimes) -> None:
        """What the split policy decides with from now on (:meth:`AutoPolicy.watch
        <device_runtime.stream._policy.AutoPolicy.watch>` calls this)."""
        self._write({"type": HEAD_TIMES, "t": time.monotonic() - self._t0, **times.as_dict()})

    def _write(self, record: dict[str, Any]) -> None:
        self._file.write(_line(record))
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def frame_record(result: FrameResult) -> dict[str, Any]:
    """A frame's fields as its trace record holds them (the reason as an object), JSON-ready:
    also what ``split-device run --json --verbose`` prints for it."""
    record = {k: v for k, v in asdict(result).items() if k in _FRAME_FIELDS}
    return {**record, "reason": result.reason_dict()}


def append_link_rate(path: str | Path, rate_bps: float, set_by: str) -> None:
    """Append the link's real rate from now on to the trace a run is writing (from another process).

    ``t`` is the wall clock since the run record's ``started_unix``: the two processes share
    no monotonic clock, and the frames' ``t`` starts at that instant. One short line in one
    write to a file opened for appending, so it cannot interleave with a frame's line.
    """
    path = Path(path)
    try:
        with path.open("r", encoding="utf-8") as file:
            started = json.loads(file.readline())["started_unix"]
        with path.open("a", encoding="utf-8") as file:
            file.write(_line(_link_rate_record(time.time() - started, rate_bps, set_by)))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SplitEdgeError(f"cannot add the link's rate to the trace {path}: {exc}") from exc


def read_records(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    """A trace's records with their line numbers, the run record first (:func:`splitedge.reading.trace_records`,
    the one reader: a line at a time, each at most ``MAX_LINE_BYTES``); records that are no object are left out."""
    return list(trace_records(path))


def read_head_times(path: str | Path) -> tuple[dict[str, Any], list[HeadTimes]]:
    """The run record of a trace and the head times its policy decided with, in the order written;
    a trace without such records (written before schema 5, or by a run with a fixed split) is an
    error that says so."""
    (_, run), *records = trace_records(path, kinds=(HEAD_TIMES,))
    times = [HeadTimes.from_dict(r, f"{path}:{number}") for number, r in records]
    if not times:
        raise SplitEdgeError(f"{path}: no {HEAD_TIMES} records (trace schema {run.get('schema')!r}, --split "
                             f"{run.get('policy')}): only a run with --split auto written by trace schema 5 on "
                             "records the head times it decided with")
    return run, times


def _link_rate_record(t: float, rate_bps: float, set_by: str) -> dict[str, Any]:
    return {"type": LINK_RATE, "t": t, "rate_bps": rate_bps, "set_by": set_by}


def _line(record: dict[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":")) + "\n"
