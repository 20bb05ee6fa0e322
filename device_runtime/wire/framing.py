"""Length-prefixed framing, written for ``asyncio.BufferedProtocol``: the socket reads into our buffers.

Between frames the socket reads into a reusable scratch buffer, so many small frames arrive
in one read and are cut out of it. When a frame is incomplete, its body gets a buffer of
its own (uninitialised, no zero-fill) and the socket then reads *directly into it*: a
megabyte tensor is copied once, by the kernel, and the decoded array is a view of that
buffer. An oversized frame is refused from its 4-byte prefix — before its body arrives —
and its body is read into scratch and dropped, so the connection stays usable.

A body buffer is allocated from a length prefix, before the body arrives, so a peer that
sends prefixes and little else could make the receiver hold memory it never uses (twenty
connections once held 1.28 GB of a host that way). A :class:`FrameBudget` shared by every
connection bounds that: a decoder reserves its body there first and, when the budget cannot
cover it, stalls with the prefix kept until another frame completes or its connection goes.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Iterator, Union

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


class FrameBudget:
    """Bytes that all decoders together may hold in frames still arriving (a host-wide bound).

    Waiters are served first come, first served: a large frame is not overtaken for ever by
    small ones. A waiter's bytes are reserved for it before it is woken, so nothing can take
    them in between.
    """

    def __init__(self, capacity: int) -> None:
        assert capacity >= 1, f"a frame budget needs at least one byte, got {capacity}"
        self.capacity = capacity
        self.held = 0
        self._waiters: OrderedDict[FrameDecoder, int] = OrderedDict()

    def reserve(self, nbytes: int) -> bool:
        """Take ``nbytes`` if they fit and nobody waits ahead (False: call :meth:`wait`)."""
        if self._waiters or self.held + nbytes > self.capacity:
            return False
        self.held += nbytes
        return True

    def release(self, nbytes: int) -> None:
        self.held -= nbytes
        assert self.held >= 0, f"released more than was reserved ({self.held} bytes held)"
        while self._waiters:
            decoder, wanted = next(iter(self._waiters.items()))
            if self.held + wanted > self.capacity:
                return
            del self._waiters[decoder]
            self.held += wanted
            decoder.granted(wanted)

    def wait(self, decoder: "FrameDecoder", nbytes: int) -> None:
        self._waiters[decoder] = nbytes

    def cancel(self, decoder: "FrameDecoder") -> None:
        self._waiters.pop(decoder, None)

    @property
    def waiting(self) -> int:
        """Decoders stalled until the budget covers their frame."""
        return len(self._waiters)


class FrameDecoder:
    """Incremental framing. Transports call :meth:`get_buffer` / :meth:`buffer_updated`;
    :meth:`feed` does the same from bytes already read (tests, other transports)."""

    def __init__(
        self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, scratch_bytes: int = SCRATCH_BYTES,
        budget: FrameBudget | None = None,
    ) -> None:
        self.max_frame_bytes = max_frame_bytes  # the owner may change it between reads (a handshake's)
        self.budget = budget
        #: Called when a stalled frame's bytes have been granted: the owner reads again and
        #: calls ``buffer_updated(0)`` to cut the frame now.
        self.on_granted: Callable[[], None] = lambda: None
        self._scratch = bytearray(max(scratch_bytes, LENGTH.size))
        self._pending = 0  # bytes at the start of scratch not yet cut into frames (< 4 between reads)
        self._body: np.ndarray | None = None  # the frame being read in place
        self._filled = 0
        self._skip = 0  # body bytes of an oversized frame still to drop
        self._stalled = 0  # length of the frame waiting for the budget (its prefix kept in scratch)
        self._granted = 0  # bytes the budget reserved for the stalled frame

    @property
    def stalled(self) -> bool:
        """True while a frame waits for the budget: read nothing more until :attr:`on_granted`."""
        return self._stalled != 0 and self._granted == 0

    @property
    def held(self) -> int:
        """Bytes of the frame body allocated and still arriving (what this decoder holds of the budget)."""
        return 0 if self._body is None else len(self._body)

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

    def buffer_updated(self, nbytes: int) -> Iterator[Event]:
        """``nbytes`` were written into the last :meth:`get_buffer`; yields the frames completed.

        Lazily, and it must be consumed to the end: each length prefix is checked against
        :attr:`max_frame_bytes` as it is when that frame's turn comes, so a limit the consumer
        changes on one frame (the end of a handshake) applies to the frames behind it.
        """
        if self._body is not None:
            self._filled += nbytes
            if self._filled < len(self._body):
                return iter(())
            body, self._body = self._body, None
            if self.budget is not None:
                self.budget.release(len(body))  # complete: what holds it now is bounded per request
            return iter((memoryview(body),))
        if self._skip:
            self._skip -= nbytes
            return iter(())
        self._pending += nbytes
        return self._cut_scratch()

    def _cut_scratch(self) -> Iterator[Event]:
        scratch, start, end = self._scratch, 0, self._pending
        while end - start >= LENGTH.size:
            (length,) = LENGTH.unpack_from(scratch, start)
            start += LENGTH.size
            if length > self.max_frame_bytes:
                yield Oversized(length, self.max_frame_bytes)
                dropped = min(length, end - start)
                start += dropped
                self._skip = length - dropped
                if self._skip:
                    break
            elif end - start >= length:
                # Complete in scratch: copy it out, scratch is reused by the next read.
                frame = memoryview(bytes(scratch[start : start + length]))
                start += length
                yield frame
            elif not self._reserve(length):
                start -= LENGTH.size  # cut again, prefix and all, once the budget grants it
                break
            else:
                body = np.empty(length, dtype=np.uint8)
                have = end - start
                body[:have] = np.frombuffer(scratch, dtype=np.uint8, count=have, offset=start)
                self._body, self._filled = body, have
                start = end
        leftover = end - start  # a partial length prefix (at most 3 bytes), or a stalled frame's start
        scratch[:leftover] = scratch[start:end]
        self._pending = leftover

    def _reserve(self, length: int) -> bool:
        """The budget's bytes for a body of ``length``: already granted, taken now, or waited for."""
        if self.budget is None:
            return True
        if self._granted:
            assert self._granted == length, f"granted {self._granted} bytes for a frame of {length}"
            self._granted = self._stalled = 0
            return True
        if self.budget.reserve(length):
            return True
        self._stalled = length
        self.budget.wait(self, length)
        return False

    def granted(self, nbytes: int) -> None:
        """The budget reserved ``nbytes`` for the stalled frame (called by :class:`FrameBudget`)."""
        self._granted = nbytes
        self.on_granted()

    def close(self) -> None:
        """The connection is gone: give back what this decoder holds or waits for."""
        if self.budget is None:
            return
        self.budget.cancel(self)
        held = self.held + self._granted
        self._body, self._granted, self._stalled = None, 0, 0
        if held:
            self.budget.release(held)

    def feed(self, data: Buffer) -> Iterator[Event]:
        view = memoryview(data).cast("B")
        pos = 0
        while pos < len(view):
            target = self.get_buffer()
            n = min(len(target), len(view) - pos)
            target[:n] = view[pos : pos + n]
            pos += n
            yield from self.buffer_updated(n)
