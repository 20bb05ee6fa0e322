"""The asyncio side of the wire protocol, shared by device and host: feed the codec, write frames.

Reading uses ``asyncio.BufferedProtocol``: the event loop reads straight into the buffers
:class:`FrameDecoder` hands out, so a tensor is copied once, by the kernel, into the buffer
its decoded array will view. Writing hands the codec's buffers to the transport one by one
— on Python 3.11 ``writelines`` would join them into one copy of the tensor.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from device_runtime.protocol import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, Oversized, encode


class FramedProtocol(asyncio.BufferedProtocol):
    """Base protocol: subclasses implement :meth:`frame_received` and :meth:`oversized`."""

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.decoder = FrameDecoder(max_frame_bytes)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.decoder.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        for event in self.decoder.buffer_updated(nbytes):
            if isinstance(event, Oversized):
                self.oversized(event)
            else:
                self.frame_received(event)

    def frame_received(self, body: memoryview) -> None:
        raise NotImplementedError

    def oversized(self, event: Oversized) -> None:
        raise NotImplementedError

    def send(self, message: dict[str, Any], tensor: np.ndarray | None = None, **tensor_fields: Any) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        for buffer in encode(message, tensor, **tensor_fields):
            transport.write(buffer)
