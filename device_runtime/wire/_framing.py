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
connection bounds that, and shares it fairly: 200 connections that each sent a 64 MiB prefix
and then a byte a second once held it all, first come first served, and every board frame that
did not arrive in one read waited behind them. Now each connection with a frame arriving is
owed an equal share; a frame within its share is never made to wait: the connections holding
more than theirs, the least arrived first, are closed to make room (:meth:`FrameBudget.reserve`).

Between frames there is nothing per connection: the socket reads into a scratch buffer of the
thread's (reads are synchronous on an event loop), and only what is left of a read (a partial
length prefix, or the start of a frame waiting for the budget) is kept. Ten thousand idle
connections once held 64 KiB each.
"""

from __future__ import annotations

import struct
import threading
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
    """Bytes that all decoders together may hold in frames still arriving (a host-wide bound),
    shared fairly among the decoders holding or waiting for some.

    A decoder's *share* is the capacity divided by the decoders holding bytes or waiting for
    them, itself included. A frame within its share is granted at once, if need be by evicting
    holders over their share (fewest bytes arrived first: the slowest); a larger one waits, in
    arrival order, for bytes no one else needs. A waiter's bytes are reserved for it before it
    is woken, so nothing can take them in between.
    """

    def __init__(self, capacity: int) -> None:
        assert capacity >= 1, f"a frame budget needs at least one byte, got {capacity}"
        self.capacity = capacity
        self.held = 0
        self.evicted = 0  # decoders evicted so far (each closed its connection)
        self._holders: dict[FrameDecoder, int] = {}
        self._waiters: OrderedDict[FrameDecoder, int] = OrderedDict()

    def share(self, decoder: "FrameDecoder") -> int:
        """What ``decoder`` is owed: an equal part among the decoders holding or waiting, itself counted."""
        others = len(self._holders) + len(self._waiters)
        counted = others if decoder in self._holders or decoder in self._waiters else others + 1
        return self.capacity // counted

    def reserve(self, decoder: "FrameDecoder", nbytes: int) -> bool:
        """Take ``nbytes`` for ``decoder`` (False: it waits, and :meth:`FrameDecoder.granted` is
        called when they are reserved for it)."""
        if not self._waiters and self.held + nbytes <= self.capacity:  # the usual case: it fits, no one waits
            self._take(decoder, nbytes)
            return True
        fair = nbytes <= self.share(decoder)
        if fair and self.held + nbytes > self.capacity:
            self._evict_for(decoder, nbytes)
        if self.held + nbytes <= self.capacity and (fair or not self._waiters):
            self._take(decoder, nbytes)
            return True
        self._waiters[decoder] = nbytes
        return False

    def _take(self, decoder: "FrameDecoder", nbytes: int) -> None:
        self.held += nbytes
        self._holders[decoder] = self._holders.get(decoder, 0) + nbytes

    def _evict_for(self, decoder: "FrameDecoder", nbytes: int) -> None:
        """Close holders over their share, the slowest first, until ``nbytes`` fit."""
        share = self.share(decoder)
        over = sorted((d for d, held in self._holders.items() if held > share), key=lambda d: d.received)
        for victim in over:
            if self.held + nbytes <= self.capacity:
                return
            self.evicted += 1
            self._forget(victim)
            victim.evict()

    def _forget(self, decoder: "FrameDecoder") -> None:
        """Drop what ``decoder`` holds or waits for, waking no one (its bytes are being taken)."""
        self.held -= self._holders.pop(decoder, 0)
        self._waiters.pop(decoder, None)

    def release(self, decoder: "FrameDecoder", nbytes: int) -> None:
        left = self._holders.get(decoder, 0) - nbytes
        assert left >= 0, f"released {nbytes} bytes, {decoder} held {left + nbytes}"
        if left:
            self._holders[decoder] = left
        else:
            self._holders.pop(decoder, None)
        self.held -= nbytes
        if self._waiters:
            self._grant()

    def _grant(self) -> None:
        """Wake waiters whose frames now fit, in arrival order; one over its share that does
        not fit lets those behind it pass, one within its share does not."""
        for waiter, wanted in list(self._waiters.items()):
            if self.held + wanted <= self.capacity:
                del self._waiters[waiter]
                self._take(waiter, wanted)
                waiter.granted(wanted)
            elif wanted <= self.share(waiter):
                return

    def cancel(self, decoder: "FrameDecoder") -> None:
        self._waiters.pop(decoder, None)

    @property
    def waiting(self) -> int:
        """Decoders stalled until the budget covers their frame."""
        return len(self._waiters)


_THREAD = threading.local()


def _scratch(nbytes: int) -> bytearray:
    """This thread's scratch buffer, at least ``nbytes`` long: every decoder on an event loop reads
    into it in turn (``get_buffer`` and ``buffer_updated`` run back to back in one callback)."""
    scratch = getattr(_THREAD, "scratch", None)
    if scratch is None or len(scratch) < nbytes:
        scratch = _THREAD.scratch = bytearray(nbytes)
    return scratch


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
        #: Called when the budget took this decoder's frame for a fairer one: the owner closes the connection.
        self.on_evicted: Callable[[], None] = lambda: None
        self._scratch_bytes = max(scratch_bytes, LENGTH.size)
        self._leftover = b""  # bytes of the last read not yet cut into frames (< 4 unless stalled)
        self._placed = False  # the leftover is at the start of the thread's scratch, ahead of a read
        self._body: np.ndarray | None = None  # the frame being read in place
        self._filled = 0
        self._skip = 0  # body bytes of an oversized frame still to drop
        self._stalled = 0  # length of the frame waiting for the budget (its start kept in the leftover)
        self._granted = 0  # bytes the budget reserved for the stalled frame
        self._evicted = False  # the budget took this frame's bytes: nothing more is read

    @property
    def stalled(self) -> bool:
        """True while a frame waits for the budget: read nothing more until :attr:`on_granted`."""
        return self._stalled != 0 and self._granted == 0

    @property
    def held(self) -> int:
        """Bytes of the frame body allocated and still arriving (what this decoder holds of the budget)."""
        return 0 if self._body is None else len(self._body)

    @property
    def received(self) -> int:
        """Bytes of the frame being read in place that have arrived (the budget evicts the fewest first)."""
        return self._filled if self._body is not None else 0

    @property
    def idle(self) -> bool:
        """True between frames: nothing partial is buffered."""
        return not self._leftover and self._body is None and self._skip == 0

    @property
    def body_remaining(self) -> int:
        """Bytes still to come of the frame being read in place (0 between frames)."""
        return 0 if self._body is None else len(self._body) - self._filled

    def get_buffer(self) -> memoryview:
        """Where the next bytes from the socket should go."""
        if self._body is not None:
            return memoryview(self._body)[self._filled :]
        scratch = _scratch(self._scratch_bytes)
        if self._skip or self._evicted:
            return memoryview(scratch)[: min(self._skip or len(scratch), self._scratch_bytes)]
        self._place(scratch)
        return memoryview(scratch)[len(self._leftover) : self._scratch_bytes]

    def _place(self, scratch: bytearray) -> None:
        scratch[: len(self._leftover)] = self._leftover
        self._placed = True

    def buffer_updated(self, nbytes: int) -> Iterator[Event]:
        """``nbytes`` were written into the last :meth:`get_buffer`; yields the frames completed.

        Lazily, and it must be consumed to the end: each length prefix is checked against
        :attr:`max_frame_bytes` as it is when that frame's turn comes, so a limit the consumer
        changes on one frame (the end of a handshake) applies to the frames behind it.
        """
        if self._evicted:
            return iter(())
        if self._body is not None:
            self._filled += nbytes
            if self._filled < len(self._body):
                return iter(())
            body, self._body = self._body, None
            if self.budget is not None:
                self.budget.release(self, len(body))  # complete: what holds it now is bounded per request
            return iter((memoryview(body),))
        if self._skip:
            self._skip -= nbytes
            return iter(())
        scratch = _scratch(self._scratch_bytes)
        if not self._placed:  # cut again after a grant, without a read
            self._place(scratch)
        self._placed = False
        return self._cut_scratch(scratch, len(self._leftover) + nbytes)

    def _cut_scratch(self, scratch: bytearray, end: int) -> Iterator[Event]:
        start = 0
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
                # Complete in scratch: copied out once (a bytearray's slice would be a second copy),
                # scratch is reused by the next read.
                frame = memoryview(bytes(memoryview(scratch)[start : start + length]))
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
        # A partial length prefix (at most 3 bytes), or a stalled frame's start: kept, scratch is shared.
        self._leftover = bytes(scratch[start:end]) if end > start else b""

    def _reserve(self, length: int) -> bool:
        """The budget's bytes for a body of ``length``: already granted, taken now, or waited for."""
        if self.budget is None:
            return True
        if self._granted:
            assert self._granted == length, f"granted {self._granted} bytes for a frame of {length}"
            self._granted = self._stalled = 0
            return True
        if self.budget.reserve(self, length):
            self._stalled = 0
            return True
        self._stalled = length
        return False

    def granted(self, nbytes: int) -> None:
        """The budget reserved ``nbytes`` for the stalled frame (called by :class:`FrameBudget`)."""
        self._granted = nbytes
        self.on_granted()

    def evict(self) -> None:
        """The budget took back this frame's bytes (called by :class:`FrameBudget`): drop the frame,
        read nothing more, and have the owner close the connection."""
        self._body, self._granted, self._stalled, self._leftover, self._evicted = None, 0, 0, b"", True
        self.on_evicted()

    def close(self) -> None:
        """The connection is gone: give back what this decoder holds or waits for."""
        if self.budget is None:
            return
        self.budget.cancel(self)
        held = self.held + self._granted
        self._body, self._granted, self._stalled = None, 0, 0
        if held:
            self.budget.release(self, held)

    def feed(self, data: Buffer) -> Iterator[Event]:
        view = memoryview(data).cast("B")
        pos = 0
        while pos < len(view):
            target = self.get_buffer()
            n = min(len(target), len(view) - pos)
            target[:n] = view[pos : pos + n]
            pos += n
            yield from self.buffer_updated(n)
