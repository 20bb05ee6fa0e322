"""``--trace FILE.jsonl``: one JSON record per frame, for ``split-device report`` and for users' own tools.

The first line describes the run (``type: run``: bundle, policy, batch size, the
calibration used, the wall-clock start); every other line is one frame (``type: frame``):
``t`` (seconds from the start, at capture), the split, batch, bytes on the link, the rate
estimate, head / transfer / tail / total ms, whether it was dropped, local or remote, the
host, and the error that made a remote batch fall back. Lines are flushed as they are
written, so a run cut short (a Pi losing power) leaves a readable trace.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator, TextIO

from device_runtime.errors import SplitEdgeError
from device_runtime.runner import FrameResult

__all__ = ["TRACE_SCHEMA", "TraceWriter", "read_trace"]

TRACE_SCHEMA = "splitedge.trace/1"
_FRAME_FIELDS = (
    "index", "name", "label", "probability", "split", "batch", "bytes", "rate_bps", "preprocess_ms", "head_ms",
    "transfer_ms", "tail_ms", "total_ms", "dropped", "where", "host", "error",
)


class TraceWriter:
    """Appends frame records to a JSONL file; a context manager."""

    def __init__(self, path: str | Path, run: dict[str, Any]) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file: TextIO = self.path.open("w", encoding="utf-8")
        except OSError as exc:
            raise SplitEdgeError(f"cannot write the trace {self.path}: {exc}") from exc
        self._t0 = time.monotonic()
        self._write({"type": "run", "schema": TRACE_SCHEMA, "started_unix": time.time(), **run})

    def frame(self, result: FrameResult) -> None:
        record = {k: v for k, v in asdict(result).items() if k in _FRAME_FIELDS}
        self._write({"type": "frame", "t": result.captured - self._t0, **record})

    def _write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
    if records[0].get("schema") != TRACE_SCHEMA:
        raise SplitEdgeError(f"{path}: trace schema {records[0].get('schema')!r}; this version reads {TRACE_SCHEMA}")
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
