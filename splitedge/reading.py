"""Reading a file someone else named (a trace's ``calibration``, a setting's path): bounded.

A path that comes from a trace, a bundle or a setting is untrusted: ``/dev/zero`` never ends (a
report read it until memory ran out), a FIFO blocks its reader for ever (a report hung on one),
``/proc/self/pagemap`` says it is 0 bytes and is not. :func:`read_bounded` opens without blocking,
checks on the open descriptor that it is a regular file (so a file swapped for a FIFO after a
check cannot hang it), and reads at most ``max_bytes``, refusing a longer file.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import stat
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

from splitedge.errors import SplitEdgeError

__all__ = [
    "FRAME", "HEAD_TIMES", "LINK_RATE", "MAX_LINE_BYTES", "NotReadable", "RUN", "add_report_arguments", "file_kind",
    "read_bounded", "read_text_bounded", "trace_json", "trace_lines", "trace_records",
]

#: The longest line a trace reader takes: the writer's longest (a ``head_times`` record of a big
#: bundle) is tens of KB; a longer one is no record of it, and reading it whole would cost its size
#: in memory several times over (a 1 GB line peaked at 3.2 GB).
MAX_LINE_BYTES = 1 << 20
#: The kinds of a trace's records (their ``type``), named once for the writer
#: (:mod:`device_runtime.stream.trace`, which says what each holds) and every reader: the run record,
#: first; a frame; the link's real rate, set by a testbed; the head times ``--split auto`` decided with.
RUN, FRAME, LINK_RATE, HEAD_TIMES = "run", "frame", "link_rate", "head_times"


class NotReadable(OSError):
    """A file :func:`read_bounded` refuses: not a regular file, or longer than its cap. An
    :class:`OSError`, so a caller that already says "cannot read FILE: ..." says this too."""


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def file_kind(mode: int) -> str:
    """What a file of ``mode`` is, as a refusal names it ("a FIFO", "a character device")."""
    return next((name for test, name in _KINDS if test(mode)), "a special file")


def read_bounded(path: str | Path, max_bytes: int) -> bytes:
    """The bytes of the regular file at ``path``, at most ``max_bytes`` of them; :class:`NotReadable`
    for anything else (a FIFO, a device, a directory, a longer file), ``OSError`` as ``open`` raises it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO's open does not wait for a writer
    with os.fdopen(fd, "rb") as file:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotReadable(f"not a regular file ({file_kind(mode)})")
        data = file.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise NotReadable(f"longer than {max_bytes:,} bytes")
    return data


def read_text_bounded(path: str | Path, max_bytes: int) -> str:
    """:func:`read_bounded` as UTF-8 text (``UnicodeDecodeError`` where it is not)."""
    return read_bounded(path, max_bytes).decode("utf-8")


def trace_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """A trace's lines with their numbers, each refused past :data:`MAX_LINE_BYTES` before more of
    it is read (a trace is untrusted: the report, ``--pace`` and ``testbed replay`` read one)."""
    try:
        with path.open("rb") as file:
            for number in itertools.count(1):
                line = file.readline(MAX_LINE_BYTES + 1)
                if not line:
                    return
                if len(line) > MAX_LINE_BYTES:
                    raise SplitEdgeError(f"{path}:{number}: a line longer than {MAX_LINE_BYTES:,} bytes: no record "
                                         "of a trace is this long")
                yield number, line
    except OSError as exc:
        raise SplitEdgeError(f"cannot read the trace {path}: {exc}") from exc


def trace_json(path: Path) -> Iterator[tuple[int, Any]]:
    """A trace's records with their line numbers, parsed as they are read (a report streams them).
    A line cut short at the end (a run that lost power) is left out; one that is not JSON before
    the end is an error naming it."""
    broken: tuple[int, Exception] | None = None  # a line that is not JSON: an error unless it is the last
    for number, line in trace_lines(path):
        if not line.strip():
            continue
        if broken is not None:
            raise SplitEdgeError(f"{path}:{broken[0]}: not JSON: {broken[1]}") from broken[1]
        try:
            record = json.loads(line.decode("utf-8"))
        except (ValueError, RecursionError) as exc:  # not UTF-8, not JSON, an int past 4,300 digits, nested too deep
            broken = (number, exc)
            continue
        yield number, record


def trace_records(
    path: str | Path, kinds: Collection[str] | None = None, strict: bool = False,
) -> Iterator[tuple[int, dict[str, Any]]]:
    """The one reader of a trace: the board's (``--head-times``, ``--pace``), the report's and
    ``testbed replay``'s. Its records with their line numbers, parsed as they are read
    (:func:`trace_json`: each line at most :data:`MAX_LINE_BYTES`, a last line cut short left out),
    so that a reader keeping only what it needs reads a trace of any length in bounded memory.

    The run record first: a file whose first record is not one is not a trace, an error that says
    so. Then the records whose ``type`` is one of ``kinds`` (:data:`FRAME`, :data:`LINK_RATE`,
    :data:`HEAD_TIMES`; None: every one), in the order written. A later line that is JSON but no
    object is no record a writer writes: left out, or with ``strict`` an error naming its line (the
    report, which refuses what it cannot read). Each reader checks the fields it reads."""
    path = Path(path)
    wanted = None if kinds is None else tuple(kinds)  # a tuple: a "type" that is a list is compared, not hashed
    records = trace_json(path)
    first = next(records, None)
    if first is not None and strict and not isinstance(first[1], dict):
        raise SplitEdgeError(f"{path}:{first[0]}: expected a JSON object")
    if first is None or not isinstance(first[1], dict) or first[1].get("type") != RUN:
        raise SplitEdgeError(f"{path}: not a splitedge trace (the first line must be the run record)")
    yield first
    for number, record in records:
        if not isinstance(record, dict):
            if strict:
                raise SplitEdgeError(f"{path}:{number}: expected a JSON object")
        elif wanted is None or record.get("type") in wanted:
            yield number, record


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of a report of traces: the traces it reads, where it writes, the calibrations and
    the runs' names. Defined once, here, for ``split-device report`` (the board runtime, which never
    imports ``fieldtrial``) and ``split-trial report`` (``fieldtrial``, which runs both)."""
    parser.add_argument("traces", nargs="+", metavar="TRACE",
                        help="JSONL traces written by split-device run --trace, or folders of them; two or more are "
                             "compared side by side")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="directory for report.html, the PNGs and summary.json (with several runs, a folder per run "
                             "beside them)")
    parser.add_argument("--calibration", action="append", metavar="FILE",
                        help="calibration.json for the gain over static splits and the model (default: the one each run "
                             "used); once per bundle compared, each run takes its bundle's")
    parser.add_argument("--label", action="append", metavar="NAME",
                        help="the run's name on the page, once per run in order (default: the trace's file name, or "
                             "what tells the runs apart: bundle, policy)")
