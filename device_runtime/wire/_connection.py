"""The asyncio side of the wire protocol, shared by device and host: feed the codec, write frames.

Reading uses ``asyncio.BufferedProtocol``: the event loop reads straight into the buffers
:class:`FrameDecoder` hands out, so a tensor is copied once, by the kernel, into the buffer
its decoded array will view. While a large frame is incomplete, ``SO_RCVLOWAT`` tells the
kernel not to wake us until the rest of it is there: a 250 KB frame arriving as 1460-byte
Wi-Fi-sized segments costs 2 reads instead of 172 (measured on loopback with paced sends).
Writing sends the codec's prefix and the tensor's own memory without joining them.

With a pre-shared key, a :class:`~device_runtime.wire._auth.FrameAuth` seals every frame on the way
out and opens it on the way in (sans-IO, like the codec); a frame that does not verify goes to
:meth:`FramedProtocol.refused` and nothing read after it on that connection is looked at. Until
the handshake is complete only handshake-sized frames are taken (a larger length prefix is
refused at once, before anything is allocated for it): a peer that has not shown the key
cannot make the other side hold a frame buffer.

Reading stops for a reason and resumes when every reason has gone (:meth:`FramedProtocol.pause`):
a host stops reading a connection with too many requests in flight, and any side stops while
a frame waits for the host-wide :class:`~device_runtime.wire._framing.FrameBudget`.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from typing import Any, cast

import numpy as np

from device_runtime.wire._auth import MAX_HANDSHAKE_BYTES, FrameAuth
from device_runtime.wire._framing import FrameBudget
from device_runtime.wire._protocol import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, Oversized, encode
from splitedge.errors import FrameRefused

#: Since Python 3.12 a selector transport's ``writelines`` sends a list of buffers with one
#: ``sendmsg`` and copies nothing (CPython gh-91166); before, it joins them into one bytes.
WRITELINES_IS_ZERO_COPY = sys.version_info >= (3, 12)
#: Before 3.12, a frame up to this size is joined and written once: one ``send`` and one wake-up
#: of the peer instead of two, for a copy that costs less than the system call it saves. A
#: larger tensor is written from its own memory, after the prefix.
JOIN_BELOW_BYTES = 64 * 1024
#: Never ask the kernel to hold back more than this: the wait must fit in the receive buffer.
MAX_RCVLOWAT = 1 << 20


class FramedProtocol(asyncio.BufferedProtocol):
    """Base protocol: subclasses implement :meth:`frame_received` and :meth:`oversized`
    (and, with ``auth``, may override :meth:`handshake` and :meth:`refused`)."""

    def __init__(
        self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, auth: FrameAuth | None = None,
        budget: FrameBudget | None = None,
    ) -> None:
        self.max_frame_bytes = max_frame_bytes
        limit = max_frame_bytes if auth is None else min(max_frame_bytes, MAX_HANDSHAKE_BYTES)
        self.decoder = FrameDecoder(limit, budget=budget)
        self.decoder.on_granted = self._granted
        self.decoder.on_evicted = self.evicted
        self.auth = auth
        self.refusing = False  # a frame failed authentication: read nothing more
        self.transport: asyncio.Transport | None = None
        self.pauses: set[str] = set()  # why reading is stopped; empty while reading
        self.frames_read = 0  # frames cut from the stream, oversized ones included
        self.bytes_written = 0  # handed to the transport, framing and seals included: the stream's write offset
        self._socket: Any = None
        self._lowat = 1

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A cast, not an isinstance check: uvloop's transports do not subclass asyncio's.
        self.transport = cast(asyncio.Transport, transport)
        # Under TLS the kernel counts ciphertext and the TLS layer may already hold part of a
        # record: a low-water mark could wait for bytes that never come. Plain TCP only.
        if transport.get_extra_info("sslcontext") is None:
            self._socket = transport.get_extra_info("socket")
        greeting = self.auth.greeting() if self.auth is not None else None
        if greeting is not None:
            self.send(greeting)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.decoder.get_buffer()

    def connection_lost(self, exc: Exception | None) -> None:
        self.decoder.close()  # what it held of the budget goes back

    def buffer_updated(self, nbytes: int) -> None:
        for event in self.decoder.buffer_updated(nbytes):
            if self.refusing:  # nothing after a refused frame is looked at (the decoder is still run out)
                continue
            self.frames_read += 1
            if isinstance(event, Oversized):
                self._oversized(event)
            elif self.auth is None:
                self.frame_received(event)
            else:
                self._open(event)
        if self.decoder.stalled:
            self.pause("budget")
        self._set_low_water(min(max(self.decoder.body_remaining, 1), MAX_RCVLOWAT))

    def pause(self, reason: str) -> None:
        """Stop reading until :meth:`resume` has been called for ``reason`` (and every other reason)."""
        if not self.pauses and self.transport is not None:
            self.transport.pause_reading()
        self.pauses.add(reason)

    def resume(self, reason: str) -> None:
        if reason not in self.pauses:
            return
        self.pauses.discard(reason)
        if not self.pauses and self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def _granted(self) -> None:
        """The budget now covers the stalled frame; cut it on the next turn of the loop, not
        inside the callback of the connection whose frame freed the bytes."""
        asyncio.get_running_loop().call_soon(self._cut_granted)

    def _cut_granted(self) -> None:
        if self.transport is None or self.transport.is_closing():
            return  # gone meanwhile: connection_lost gives the grant back
        self.buffer_updated(0)
        self.resume("budget")

    def _oversized(self, event: Oversized) -> None:
        if self.auth is not None and not self.auth.established:
            self.refusing = True
            self.refused(FrameRefused(
                f"a frame of {event.length} bytes before the handshake is complete (at most {event.limit})",
                "handshake", f"a {event.length}-byte length prefix before authenticating",
            ))
            return
        if self.auth is not None:
            self.auth.skipped()
        self.oversized(event)

    def _set_low_water(self, nbytes: int) -> None:
        if nbytes == self._lowat or self._socket is None:
            return
        try:
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, nbytes)
        except OSError:  # not every platform or socket honours it; it only saves wake-ups
            self._socket = None
            return
        self._lowat = nbytes

    def _open(self, body: memoryview) -> None:
        assert self.auth is not None
        try:
            content = self.auth.open(body)
        except FrameRefused as exc:
            self.refusing = True
            self.refused(exc)
            return
        if content is None:
            if self.auth.established:  # the key is proven: frames up to the configured size from now on
                self.decoder.max_frame_bytes = self.max_frame_bytes
            self.handshake()
        else:
            self.frame_received(content)

    def evicted(self) -> None:
        """The frame budget took this connection's frame for a fairer one (it held more than its
        share and was the slowest to arrive): the connection ends, its frame unread."""
        if self.transport is not None:
            self.transport.close()

    def handshake(self) -> None:
        """The auth layer consumed a handshake frame (the device answers the challenge here)."""

    def refused(self, exc: FrameRefused) -> None:
        """A frame failed authentication: the connection ends (subclasses reply or report first)."""
        if self.transport is not None:
            self.transport.close()

    def frame_received(self, body: memoryview) -> None:
        raise NotImplementedError

    def oversized(self, event: Oversized) -> None:
        raise NotImplementedError

    def send(self, message: dict[str, Any], tensor: np.ndarray | None = None, **tensor_fields: Any) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        buffers = encode(message, tensor, **tensor_fields)
        if self.auth is not None:
            buffers = self.auth.seal(buffers)  # the tensor stays the array's memoryview
        size = sum(map(len, buffers))  # bytes and byte-addressed views: their lengths are their sizes
        self.bytes_written += size
        if WRITELINES_IS_ZERO_COPY:
            transport.writelines(buffers)  # prefix and tensor in one sendmsg
        elif len(buffers) > 1 and size <= JOIN_BELOW_BYTES:
            transport.write(b"".join(buffers))
        else:
            for buffer in buffers:
                transport.write(buffer)
