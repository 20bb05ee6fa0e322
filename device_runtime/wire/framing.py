"""Length-prefixed framing, written for ``asyncio.BufferedProtocol``: the socket reads into our buffers.

Between frames the socket reads into a reusable scratch buffer, so many small frames arrive
in one read and are cut out of it. When a frame is incomplete, its body gets a buffer of
its own (uninitialised, no zero-fill) and the socket then reads *directly into it*: a
megabyte tensor is copied once, by the kernel, and the decoded array is a view of that
buffer. An oversized frame is refused from its 4-byte prefix — before its body arrives —
and its body is read into scratch and dropped, so the connection stays usable.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterator, Union

import numpy as np

LENGTH = struct.Struct(">I")
#: A 1×3×224×224 float32 input is 602 KB; 64 MiB leaves room for batches of large cuts
#: while still refusing a length prefix that would make the peer allocate gigabytes.
DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024
SCRATCH_BYTES = 64 * 1024  # small frames batch here; a larger one gets a buffer of its own at once

Buffer = Union[bytes, bytearray, memoryview]


@dataclass(frozen=True)
class Oversized:
    """A frame whose length prefix exceeds the limit; its body is skipped, never buffered."""

    length: int
    limit: int

    @property
    def message(self) -> str:
        return f"frame of {self.length} bytes exceeds the limit of {self.limit} bytes"


Event = Union[memoryview, Oversized]


class FrameDecoder:
    """Incremental framing. Transports call :meth:`get_buffer` / :meth:`buffer_updated`;
    :meth:`feed` does the same from bytes already read (tests, other transports)."""

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, scratch_bytes: int = SCRATCH_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._scratch = bytearray(max(scratch_bytes, LENGTH.size))
        self._pending = 0  # bytes at the start of scratch not yet cut into frames (< 4 between reads)
        self._body: np.ndarray | None = None  # the frame being read in place
        self._filled = 0
        self._skip = 0  # body bytes of an oversized frame still to drop

    @property
    def idle(self) -> bool:
        """True between frames: nothing partial is buffered."""
        return self._pending == 0 and self._body is None and self._skip == 0

    @property
    def body_remaining(self) -> int:
        """Bytes still to come of the frame being read in place (0 between frames)."""
        return 0 if self._body is None else len(self._body) - self._filled

    def get_buffer(self) -> memoryview:
        """Where the next bytes from the socket should go."""
        if self._body is not None:
            return memoryview(self._body)[self._filled :]
        if self._skip:
            return memoryview(self._scratch)[: min(self._skip, len(self._scratch))]
        return memoryview(self._scratch)[self._pending :]

    def buffer_updated(self, nbytes: int) -> list[Event]:
        """``nbytes`` were written into the last :meth:`get_buffer`; returns the frames completed."""
        if self._body is not None:
            self._filled += nbytes
            if self._filled < len(self._body):
                return []
            body, self._body = self._body, None
            return [memoryview(body)]
        if self._skip:
            self._skip -= nbytes
            return []
        self._pending += nbytes
        return self._cut_scratch()

    def _cut_scratch(self) -> list[Event]:
        events: list[Event] = []
        scratch, start, end = self._scratch, 0, self._pending
        while end - start >= LENGTH.size:
            (length,) = LENGTH.unpack_from(scratch, start)
            start += LENGTH.size
            if length > self.max_frame_bytes:
                events.append(Oversized(length, self.max_frame_bytes))
                dropped = min(length, end - start)
                start += dropped
                self._skip = length - dropped
                if self._skip:
                    break
            elif end - start >= length:
                # Complete in scratch: copy it out, scratch is reused by the next read.
                events.append(memoryview(bytes(scratch[start : start + length])))
                start += length
            else:
                body = np.empty(length, dtype=np.uint8)
                have = end - start
                body[:have] = np.frombuffer(scratch, dtype=np.uint8, count=have, offset=start)
                self._body, self._filled = body, have
                start = end
        leftover = end - start  # a partial length prefix, at most 3 bytes
        scratch[:leftover] = scratch[start:end]
        self._pending = leftover
        return events

    def feed(self, data: Buffer) -> Iterator[Event]:
        view = memoryview(data).cast("B")
        pos = 0
        while pos < len(view):
            target = self.get_buffer()
            n = min(len(target), len(view) - pos)
            target[:n] = view[pos : pos + n]
            pos += n
            yield from self.buffer_updated(n)
