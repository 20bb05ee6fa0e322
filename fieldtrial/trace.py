"""Read a trace written by ``split-device run --trace`` (:mod:`device_runtime.stream.trace`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from device_runtime.stream import TRACE_SCHEMA
from splitedge import SplitEdgeError

__all__ = ["TRACE_SCHEMA_1", "read_trace", "records_waits"]

#: Traces before the waits were recorded: ``tail_ms`` held the host's queue, and nothing else
#: told queueing from the stages.
TRACE_SCHEMA_1 = "splitedge.trace/1"


def read_trace(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The run record and the frame records; a malformed line is an error naming its number."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise SplitEdgeError(f"cannot read the trace {path}: {exc}") from exc
    records = list(_parse(path, lines))
    if not records or records[0].get("type") != "run":
        raise SplitEdgeError(f"{path}: not a splitedge trace (the first line must be the run record)")
    if records[0].get("schema") not in (TRACE_SCHEMA, TRACE_SCHEMA_1):
        raise SplitEdgeError(
            f"{path}: trace schema {records[0].get('schema')!r}; this version reads {TRACE_SCHEMA} and {TRACE_SCHEMA_1}"
        )
    frames = [r for r in records[1:] if r.get("type") == "frame"]
    return records[0], frames


def _parse(path: Path, lines: list[str]) -> Iterator[dict[str, Any]]:
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
        yield record


def records_waits(run: dict[str, Any]) -> bool:
    """Whether the run's frames record their waits apart from their stage times (trace schema 2)."""
    return run.get("schema") != TRACE_SCHEMA_1
