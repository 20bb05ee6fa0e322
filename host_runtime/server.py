"""The host's TCP server: speaks the wire protocol, runs tails in worker threads.

One connection per device, many requests in flight on it; replies go out in completion
order and carry the request id. Malformed input never kills anything: a frame that fails to
decode gets a typed error reply and the connection goes on (framing is intact); an oversized
frame is refused from its length prefix and its body skipped unread. Each connection's
in-flight requests are bounded: past the limit the host stops reading from that socket
(backpressure) until replies drain.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from device_runtime.connection import FramedProtocol
from device_runtime.errors import ProtocolError
from device_runtime.protocol import (
    DEFAULT_MAX_FRAME_BYTES,
    OPS,
    PROTOCOL_VERSION,
    Oversized,
    decode,
    error_reply,
)
from device_runtime.quantization import dequantize
from host_runtime.tails import TailRegistry, profile_tails, timed_run

log = logging.getLogger("splitedge.host")


@dataclass(frozen=True)
class ServerConfig:
    host: str = "0.0.0.0"
    port: int = 7767
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    max_in_flight: int = 32  # per connection, before the host stops reading from it
    workers: int = max(os.cpu_count() or 1, 1)
    shutdown_timeout: float = 5.0


class HostStats:
    """Counters every connection updates; ``stats`` returns them."""

    def __init__(self) -> None:
        self.connections = 0
        self.requests: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.in_flight = 0
        self.compute_ms: Counter[str] = Counter()  # total per split, for the mean
        self.served: Counter[str] = Counter()

    def as_dict(self) -> dict[str, Any]:
        return {
            "connections": self.connections,
            "requests": dict(self.requests),
            "errors": dict(self.errors),
            "in_flight": self.in_flight,
            "tail_ms_mean": {k: self.compute_ms[k] / n for k, n in self.served.items()},
        }


class _HostProtocol(FramedProtocol):
    def __init__(self, server: "HostServer") -> None:
        super().__init__(server.config.max_frame_bytes)
        self.server = server
        self.in_flight = 0
        self.paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.server.connections.add(self)
        self.server.stats.connections += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.server.stats.connections -= 1

    def reply_error(self, request_id: Any, code: str, message: str) -> None:
        self.server.stats.errors[code] += 1
        log.debug("error reply %s: %s", code, message)
        self.send(error_reply(request_id, code, message))

    def oversized(self, event: Oversized) -> None:
        self.reply_error(None, "bad_request", event.message)

    def frame_received(self, body: memoryview) -> None:
        try:
            message = decode(body)
        except ProtocolError as exc:
            self.reply_error(exc.request_id, exc.code, str(exc))
            return
        request_id = message.get("id")
        op = message.get("op")
        self.server.stats.requests[str(op)] += 1
        if op == "infer":
            self.start_infer(request_id, message)
        elif op == "hello":
            if message.get("protocol") != PROTOCOL_VERSION:
                self.reply_error(
                    request_id, "bad_request",
                    f"protocol version {message.get('protocol')!r} is not spoken here; this host speaks {PROTOCOL_VERSION}",
                )
                return
            self.send({"id": request_id, "ok": True, **self.server.hello()})
        elif op == "ping":
            payload = message.get("tensor")
            self.send({"id": request_id, "ok": True, "bytes": 0 if payload is None else int(payload.nbytes)})
        elif op == "stats":
            self.send({"id": request_id, "ok": True, "stats": self.server.stats.as_dict()})
        elif op == "profile":
            task = asyncio.ensure_future(self.profile(request_id, message))
            self.server.tasks.add(task)
            task.add_done_callback(self.server.tasks.discard)
        else:
            self.reply_error(request_id, "bad_request", f"unknown op {op!r}; ops: {', '.join(OPS)}")

    def start_infer(self, request_id: Any, message: dict[str, Any]) -> None:
        tensor = message.get("tensor")
        if not isinstance(tensor, np.ndarray):
            self.reply_error(request_id, "bad_request", "infer needs a tensor")
            return
        quantization = message.get("quantization")
        if quantization is not None:
            if tensor.dtype != np.uint8:
                self.reply_error(request_id, "bad_request", f"a quantized tensor must be uint8, got {tensor.dtype.name}")
                return
            # The tail takes float32: the board sent uint8 to save the link three quarters of the bytes.
            tensor = dequantize(tensor, quantization["scale"], quantization["zero_point"])
        try:
            tail = self.server.registry.lookup_for(message.get("bundle"), message.get("split"), tensor)
        except ProtocolError as exc:
            self.reply_error(request_id, exc.code, str(exc))
            return
        self.in_flight += 1
        self.server.stats.in_flight += 1
        if self.in_flight >= self.server.config.max_in_flight and not self.paused and self.transport:
            self.transport.pause_reading()
            self.paused = True
        received = time.perf_counter()
        key = f"{message['bundle']}/{message['split']}"
        task = asyncio.ensure_future(self.finish_infer(request_id, key, tail, tensor, received))
        self.server.tasks.add(task)
        task.add_done_callback(self.server.tasks.discard)

    async def profile(self, request_id: Any, message: dict[str, Any]) -> None:
        """Time tails here for a board's calibration; bounded by :func:`profile_tails`."""
        loop = asyncio.get_running_loop()
        splits, batches = message.get("splits"), message.get("batches")
        try:
            if splits is not None and not (isinstance(splits, list) and all(isinstance(s, str) for s in splits)):
                raise ProtocolError(f"profile splits must be a list of split ids, got {splits!r}", code="bad_request")
            if not isinstance(batches, list):
                raise ProtocolError(f"profile batches must be a list of batch sizes, got {batches!r}", code="bad_request")
            times = await loop.run_in_executor(
                self.server.executor, profile_tails, self.server.registry, message.get("bundle"), splits, batches,
                message.get("repeats", 10),
            )
        except ProtocolError as exc:
            self.reply_error(request_id, exc.code, str(exc))
        except Exception as exc:
            log.exception("profile failed")
            self.reply_error(request_id, "internal", f"profile failed: {exc}")
        else:
            self.send({"id": request_id, "ok": True, "tail_ms": times})

    async def finish_infer(self, request_id: Any, key: str, tail: Any, tensor: np.ndarray, received: float) -> None:
        loop = asyncio.get_running_loop()
        try:
            output, queue_ms, compute_ms = await loop.run_in_executor(
                self.server.executor, timed_run, tail, tensor, received
            )
        except Exception as exc:  # a tail that fails must not take the connection with it
            log.exception("tail %s failed", key)
            self.reply_error(request_id, "internal", f"tail {key} failed: {exc}")
        else:
            self.server.stats.served[key] += 1
            self.server.stats.compute_ms[key] += compute_ms
            self.send({"id": request_id, "ok": True, "compute_ms": compute_ms, "queue_ms": queue_ms}, output)
        finally:
            self.in_flight -= 1
            self.server.stats.in_flight -= 1
            if self.paused and self.in_flight < self.server.config.max_in_flight // 2 and self.transport:
                self.transport.resume_reading()
                self.paused = False


class HostServer:
    """Serve the tails of a :class:`TailRegistry` on TCP until :meth:`close`."""

    def __init__(self, registry: TailRegistry, config: ServerConfig = ServerConfig()) -> None:
        self.registry = registry
        self.config = config
        self.stats = HostStats()
        self.connections: set[_HostProtocol] = set()
        self.tasks: set[asyncio.Future[None]] = set()
        self.executor = ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="tail")
        self._server: asyncio.AbstractServer | None = None

    def hello(self) -> dict[str, Any]:
        return {
            "protocol": PROTOCOL_VERSION,
            "bundles": self.registry.served(),
            "auth": False,
            "max_frame_bytes": self.config.max_frame_bytes,
        }

    async def start(self) -> tuple[str, int]:
        """Bind and listen; returns the bound address (port 0 picks a free port)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _HostProtocol(self), self.config.host, self.config.port, reuse_address=True
        )
        host, port = self._server.sockets[0].getsockname()[:2]
        return host, port

    async def close(self) -> None:
        """Stop accepting, let requests in flight finish (bounded), then drop connections."""
        if self._server is not None:
            self._server.close()
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=self.config.shutdown_timeout)
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.close()
        if self._server is not None:
            await asyncio.wait_for(self._server.wait_closed(), self.config.shutdown_timeout)
        self.executor.shutdown(wait=False, cancel_futures=True)
