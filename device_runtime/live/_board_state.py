"""The board's live page: what :class:`LiveBoard` keeps of the stream, and how it answers a page.

The stream calls :meth:`LiveBoard.publish` for every result and reads frames through
:meth:`LiveBoard.watch`; both only keep references (O(1), no copy, no encoding): a result in a
ring, a frame until its result comes (the pipeline holds it meanwhile anyway), then the latest
answered one. Watching costs the stream next to nothing whether or not a page is open. Everything else is done
when a page asks, in the page server's thread: results become JSON records at most ten times a
second per cursor whatever the number of pages (the server keeps a state a period), only those a
page has not seen and never more than :data:`FRAMES_SENT` (:data:`FRAMES_SENT_BYTES`), and the latest answered frame is scaled down and
encoded as a JPEG at most :data:`PICTURES_PER_S` times a second whatever the number of pages.

What a record carries is the trace's (:mod:`device_runtime.stream.trace`) plus the result's
``reason`` where the stream gives one (why its split was chosen), so the page says what the
trace will say.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from calibration import SplitTable
from device_runtime.live._page import BOARD_PAGE
from device_runtime.live._ring import Ring
from device_runtime.live._server import LiveServer, parse_live_address
from device_runtime.stream import Frame, FrameResult, FrameSource

__all__ = ["FRAMES_SENT", "FRAMES_SENT_BYTES", "PICTURES_PER_S", "PICTURE_WIDTH", "LiveBoard"]

#: Results kept: a minute at 30 fps and then some, for a page that reconnects ...
RESULTS_KEPT = 4096
#: ... and what a page shows: a new page gets the results of the last minute ...
WINDOW_S = 60.0
#: ... and no state carries more than the newest FRAMES_SENT records, FRAMES_SENT_BYTES of them as
#: JSON (about 12 s at 30 fps: the page's figures over 10 s are whole at once, its minute fills as
#: it watches); a page that polls with its cursor gets what is new, a few records a poll. What
#: is left out of a state is skipped, not sent later: the cursor is the newest's (issue 45: a new
#: page, or a poll from an old cursor, was sent up to 4,096 records, 0.5 to 1 MB, each time).
FRAMES_SENT = 600
FRAMES_SENT_BYTES = 256 * 1024
#: Frames captured and not yet answered or dropped, kept by reference at most: the pipeline's
#: queue and in-flight batches hold fewer (a frame whose result never came is forgotten oldest first).
PENDING_KEPT = 64
PICTURES_PER_S = 5.0
PICTURE_WIDTH = 320  # pixels: the page shows what was classified, not the camera's full frame
JPEG_QUALITY = 70
#: The trace's fields a page shows (FrameResult's names), in a record of their own names.
_FIELDS = (
    "index", "name", "label", "probability", "split", "where", "host", "batch", "bytes", "rate_bps", "preprocess_ms",
    "head_ms", "transfer_ms", "tail_ms", "queue_ms", "slot_ms", "host_queue_ms", "total_ms", "dropped", "drop_reason",
    "error", "attempted", "deadline_ms",
)


class _Watched(FrameSource):
    """A frame source seen through: every frame it yields is also kept (its reference) for the page."""

    def __init__(self, source: FrameSource, keep: Callable[[Frame], None]) -> None:
        self._source, self._keep = source, keep

    def __getattr__(self, name: str) -> Any:  # live, frame_interval_s, description, ...: the source's own
        return getattr(self._source, name)

    def __iter__(self) -> Iterator[Frame]:
        for frame in self._source:
            self._keep(frame)
            yield frame

    def close(self) -> None:
        self._source.close()


class LiveBoard:
    """The stream, as a live page sees it: the last results, the frames they answered, the table.

    ``clock``: ``time.monotonic`` (the clock of a result's ``captured``), injected by tests.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.started = time.time()  # tells a page a new run from a reconnect
        self._results: Ring[FrameResult] = Ring(RESULTS_KEPT)
        self._pending: dict[int, Frame] = {}  # by index: captured (the camera's thread), not yet published
        self._pending_lock = threading.Lock()
        self._answered: Frame | None = None  # the frame of the latest answered result
        self._plan: dict[str, Any] | None = None
        self._drops: Callable[[], dict[str, Any]] | None = None
        self._picture_lock = threading.Lock()
        self._picture: tuple[int, bytes] | None = None  # (frame index, JPEG) last encoded
        self._encoded_at = -math.inf
        # seq -> (record, its JSON's bytes), made once per result, not once per window built: a new
        # page's window of 600 records, built each second, was 600 records made and encoded a
        # second, holding the GIL the stream's threads need (issue 45). Read by the page's thread only.
        self._records: OrderedDict[int, tuple[dict[str, Any], int]] = OrderedDict()

    def serve(self, where: str, key: bytes | None = None) -> LiveServer:
        """The board's page on ``where`` (``[ADDRESS:]PORT``: 127.0.0.1 unless an address is
        given), asking for the token of ``key`` when there is one (``--key-file``)."""
        address, port = parse_live_address(where)
        return LiveServer(self, BOARD_PAGE, address, port, key)

    def watch(self, source: FrameSource) -> FrameSource:
        """``source``, its frames kept for the page as the stream reads them."""
        return _Watched(source, self._captured)

    def _captured(self, frame: Frame) -> None:
        with self._pending_lock:
            self._pending[frame.index] = frame
            if len(self._pending) > PENDING_KEPT:
                del self._pending[next(iter(self._pending))]

    def publish(self, result: FrameResult) -> None:
        """One result of the stream (dropped ones too): O(1), references kept."""
        self._results.add(result)
        with self._pending_lock:
            frame = self._pending.pop(result.index, None)
        if frame is not None and not result.dropped:
            self._answered = frame

    def plan(self, table: SplitTable | None, batch: int) -> None:
        """The calibration table the run chooses its splits with, for batches of ``batch``: the page
        draws its rate boundaries (DSC Eq. 6) on the rate estimate. None: no table (a fixed split)."""
        if table is None:
            self._plan = None
            return
        self._plan = {
            "batch": batch,
            "rates_bps": [table.rates_bps[0], table.rates_bps[-1]],
            "first": table.lookup(batch, table.rates_bps[0]),
            "boundaries": [[rate, below, above] for rate, below, above in table.boundaries(batch)],
        }

    def drops(self, state: Callable[[], dict[str, Any]]) -> None:
        """Where the page reads the run's drops so far and their forecast from the stage times the
        stream measures (:class:`~device_runtime.stream._summary.DropWatch`'s ``state``: a fixed
        set of fields, read once per state asked for); the page says what the summaries say."""
        self._drops = state

    def state(self, since: int | None) -> tuple[dict[str, Any], int]:
        """The results after ``since`` as records (each with its number, ``seq``; a new page, None,
        gets the last :data:`WINDOW_S`; none more than the newest :data:`FRAMES_SENT` and
        :data:`FRAMES_SENT_BYTES` of them), the table, the drops and their forecast (None until
        the run gives them), and the clock (``now``: a record's ``t`` is its capture on the same clock)."""
        results, cursor = self._results.since(since)
        results = results[-FRAMES_SENT:]
        first = cursor - len(results)
        now = self.clock()
        if since is None:  # a new page: what it shows, the last minute, not all that is kept
            recent = [r for r in results if r.captured >= now - WINDOW_S]
            first, results = first + len(results) - len(recent), recent
        frames: list[dict[str, Any]] = []
        size = 0
        for n in range(len(results) - 1, -1, -1):  # the newest first, while they fit
            record, length = self._made(first + n, results[n])
            size += length
            if size > FRAMES_SENT_BYTES:
                break
            frames.append(record)
        frames.reverse()
        return {
            "run": self.started, "now": now, "plan": self._plan,
            "drops": None if self._drops is None else _plain(self._drops()),
            "frames": frames,
        }, cursor

    def _made(self, seq: int, result: FrameResult) -> tuple[dict[str, Any], int]:
        """Result ``seq`` as a record and the bytes it takes in a state, made at its first state."""
        made = self._records.get(seq)
        if made is None:
            record = _record(seq, result)
            made = self._records[seq] = (record, len(json.dumps(record, separators=(",", ":"), default=str)) + 1)
            if len(self._records) > 2 * FRAMES_SENT:
                self._records.popitem(last=False)  # the oldest made: out of every window by now
        return made

    def picture(self) -> tuple[bytes, dict[str, str]] | None:
        """The latest answered frame as a JPEG (its index in ``X-Frame-Index``), encoded at most
        :data:`PICTURES_PER_S` times a second: a page asking more often gets the last one again.
        None before any frame is answered, or without OpenCV to encode it."""
        with self._picture_lock:
            now = self.clock()
            frame = self._answered
            if frame is not None and (self._picture is None or frame.index != self._picture[0]) and \
                    now - self._encoded_at >= 1.0 / PICTURES_PER_S:
                jpeg = _jpeg(frame.image)
                if jpeg is not None:
                    self._picture, self._encoded_at = (frame.index, jpeg), now
            if self._picture is None:
                return None
            index, jpeg = self._picture
            return jpeg, {"X-Frame-Index": str(index)}


def _record(seq: int, result: FrameResult) -> dict[str, Any]:
    """One result as the page reads it: the trace's fields, ``t`` (capture), ``waits_ms``, the
    reason as the trace records it and as the printed line says it (``why``)."""
    record: dict[str, Any] = {name: _plain(getattr(result, name)) for name in _FIELDS}
    reason = getattr(result, "reason", None)
    text = getattr(reason, "text", None)
    record.update(seq=seq, t=result.captured, waits_ms=result.waits_ms, reason=_plain(reason),
                  why=text() if callable(text) else None)
    return record


def _plain(value: Any) -> Any:
    """A value as JSON: a reason as its ``as_dict`` (any other dataclass as its fields), numbers
    that are not finite as None; whatever else, as text."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if callable(getattr(value, "as_dict", None)):  # device_runtime.stream's Reason: the fields its kind fills
        value = value.as_dict()
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


def _jpeg(image: np.ndarray) -> bytes | None:
    """An RGB (H, W, 3) frame scaled down by whole steps to at most :data:`PICTURE_WIDTH` wide, as a
    JPEG; None without OpenCV (the ``camera`` extra), which the page then says."""
    try:
        import cv2
    except ImportError:
        return None
    step = max(1, math.ceil(image.shape[1] / PICTURE_WIDTH))
    bgr = np.ascontiguousarray(image[::step, ::step, ::-1])  # a few hundred kB at most: the frame is never copied whole
    ok, data = cv2.imencode(".jpg", bgr, (cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY))
    return data.tobytes() if ok else None
