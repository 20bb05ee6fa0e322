"""The asyncio side of the wire protocol, shared by device and host: feed the codec, write frames.

Reading uses ``asyncio.BufferedProtocol``: the event loop reads straight into the buffers
:class:`FrameDecoder` hands out, so a tensor is copied once, by the kernel, into the buffer
its decoded array will view. While a large frame is incomplete, ``SO_RCVLOWAT`` tells the
kernel not to wake us until the rest of it is there: a 250 KB frame arriving as 1460-byte
Wi-Fi-sized segments costs 2 reads instead of 172 (measured on loopback with paced sends).
Writing sends the codec's prefix and the tensor's own memory without joining them.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from typing import Any, cast

import numpy as np

from device_runtime.protocol import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, Oversized, encode

#: Since Python 3.12 a selector transport's ``writelines`` sends a list of buffers with one
#: ``sendmsg`` and copies nothing (CPython gh-91166); before, it joins them into one bytes.
WRITELINES_IS_ZERO_COPY = sys.version_info >= (3, 12)
#: Never ask the kernel to hold back more than this: the wait must fit in the receive buffer.
MAX_RCVLOWAT = 1 << 20


class FramedProtocol(asyncio.BufferedProtocol):
    """Base protocol: subclasses implement :meth:`frame_received` and :meth:`oversized`."""

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.decoder = FrameDecoder(max_frame_bytes)
        self.transport: asyncio.Transport | None = None
        self._socket: Any = None
        self._lowat = 1

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A cast, not an isinstance check: uvloop's transports do not subclass asyncio's.
        self.transport = cast(asyncio.Transport, transport)
        self._socket = transport.get_extra_info("socket")

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.decoder.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        for event in self.decoder.buffer_updated(nbytes):
            if isinstance(event, Oversized):
                self.oversized(event)
            else:
                self.frame_received(event)
        self._set_low_water(min(max(self.decoder.body_remaining, 1), MAX_RCVLOWAT))

    def _set_low_water(self, nbytes: int) -> None:
        if nbytes == self._lowat or self._socket is None:
            return
        try:
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, nbytes)
        except OSError:  # not every platform or socket honours it; it only saves wake-ups
            self._socket = None
            return
        self._lowat = nbytes

    def frame_received(self, body: memoryview) -> None:
        raise NotImplementedError

    def oversized(self, event: Oversized) -> None:
        raise NotImplementedError

    def send(self, message: dict[str, Any], tensor: np.ndarray | None = None, **tensor_fields: Any) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        buffers = encode(message, tensor, **tensor_fields)
        if WRITELINES_IS_ZERO_COPY:
            transport.writelines(buffers)  # prefix and tensor in one sendmsg
        else:
            for buffer in buffers:
                transport.write(buffer)
