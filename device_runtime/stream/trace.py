"""``--trace FILE.jsonl``: one JSON record per frame, for ``split-device report`` and for users' own tools.

The writer lives with the stream (a board writes traces); the reader and the report live in
``fieldtrial`` (anywhere), which reads what :data:`TRACE_SCHEMA` names.

The first line describes the run (``type: run``: bundle, policy, batch size, the
calibration file and the (backend, precision) of its table that chose the splits, the
backend and precision that ran, the wall-clock start); every other line is one frame
(``type: frame``): ``t`` (seconds from the start, at capture), the split, batch, bytes on
the link, the rate estimate, the stage times (preprocess / head / transfer / tail ms: the
tail is the host's compute alone), the waits (``queue_ms`` in the board's queue before the
head, ``slot_ms`` for an in-flight slot, ``host_queue_ms`` in the host's queue), the total
ms from capture to answer, whether it was dropped, local or remote, the host, and the error
that made a remote batch fall back. Lines are flushed as they are written, so a run cut
short (a Pi losing power) leaves a readable trace.

Schema 2 added the waits and took the host's queue out of ``tail_ms`` (schema 1 counted it
there and recorded no other wait); the report reads both.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

from device_runtime.stream.results import FrameResult
from splitedge import SplitEdgeError

__all__ = ["TRACE_SCHEMA", "TraceWriter"]

TRACE_SCHEMA = "splitedge.trace/2"
_FRAME_FIELDS = (
    "index", "name", "label", "probability", "split", "batch", "bytes", "rate_bps", "preprocess_ms", "head_ms",
    "transfer_ms", "tail_ms", "queue_ms", "slot_ms", "host_queue_ms", "total_ms", "dropped", "where", "host", "error",
    "missing", "deadline_ms",
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
