"""The host's TCP server: speaks the wire protocol, runs tails in worker threads.

One connection per device, many requests in flight on it; replies go out in completion
order and carry the request id. Malformed input never kills anything: a frame that fails to
decode gets a typed error reply and the connection goes on (framing is intact); an oversized
frame is refused from its length prefix and its body skipped unread. Each connection's
in-flight requests are bounded: past the limit the host stops reading from that socket
(backpressure) until replies drain. Across connections, :class:`~host_runtime.batcher.Batcher`
batches requests per tail and bounds the host's queue; :class:`~host_runtime.metrics.HostStats`
counts everything once, for ``stats`` and for Prometheus.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
from prometheus_client import Counter as PromCounter

from device_runtime.wire.auth import REFUSAL_KINDS, HostAuth
from device_runtime.wire.connection import FramedProtocol
from device_runtime.wire.protocol import (
    DEFAULT_MAX_FRAME_BYTES,
    OPS,
    PROTOCOL_VERSION,
    Oversized,
    decode,
    error_reply,
)
from device_runtime.wire.quantization import dequantize
from host_runtime.batcher import BatchConfig, Batcher, BatchResult, TailKey, absolute_deadline
from host_runtime.metrics import PREFIX, HostStats, MetricsEndpoint
from host_runtime.tails import TailRegistry, profile_tails
from splitedge.errors import FrameRefused, ProtocolError

log = logging.getLogger("splitedge.host")


@dataclass(frozen=True)
class ServerConfig:
    host: str = "0.0.0.0"
    port: int = 7767
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    max_in_flight: int = 32  # per connection, before the host stops reading from it
    workers: int = max(os.cpu_count() or 1, 1)
    shutdown_timeout: float = 5.0
    batching: BatchConfig = field(default_factory=BatchConfig)  # --max-batch, --max-wait-ms, --max-queue
    metrics_port: int | None = None  # Prometheus text on host:metrics_port (0: a free port); None: off
    key: bytes | None = field(default=None, repr=False)  # --key-file: every frame authenticated (device_runtime.wire.auth)
    tls: ssl.SSLContext | None = None  # --tls-cert/--tls-key (device_runtime.wire.tls.server_context)


class _HostProtocol(FramedProtocol):
    def __init__(self, server: "HostServer") -> None:
        key = server.config.key
        super().__init__(server.config.max_frame_bytes, HostAuth(key) if key is not None else None)
        self.server = server
        self.in_flight = 0
        self.paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)

    def reply_error(self, request_id: Any, code: str, message: str) -> None:
        self.server.stats.error(code)
        log.debug("error reply %s: %s", code, message)
        self.send(error_reply(request_id, code, message))

    def oversized(self, event: Oversized) -> None:
        self.reply_error(None, "bad_request", event.message)

    def refused(self, exc: FrameRefused) -> None:
        """A frame failed authentication: nothing of it is trusted, not even its id. The peer gets
        one ``unauthorized`` reply, the same whatever went wrong, and the connection closes."""
        self.server.frames_refused.labels(exc.kind).inc()
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        log.warning("refused a frame from %s (%s); closing the connection", peer, exc.reason)
        self.reply_error(None, "unauthorized", str(exc))
        super().refused(exc)

    def frame_received(self, body: memoryview) -> None:
        received = time.perf_counter()  # the frame is all here: queue_ms and deadlines count from now
        try:
            message = decode(body)
        except ProtocolError as exc:
            self.reply_error(exc.request_id, exc.code, str(exc))
            return
        request_id = message.get("id")
        op = message.get("op")
        self.server.stats.request(op)
        if op == "infer":
            self.start_infer(request_id, message, received)
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

    def start_infer(self, request_id: Any, message: dict[str, Any], received: float) -> None:
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
            key: TailKey = (message["bundle"], message["split"])
            deadline = absolute_deadline(message.get("deadline_ms"), received)
            result = self.server.batcher.submit(key, tail, tensor, received, deadline)
        except ProtocolError as exc:  # refused at once: bad, overloaded, or too late already
            self.reply_error(request_id, exc.code, str(exc))
            return
        self.in_flight += 1
        if self.in_flight >= self.server.config.max_in_flight and not self.paused and self.transport:
            self.transport.pause_reading()
            self.paused = True
        result.add_done_callback(partial(self.finish_infer, request_id, key, received))

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

    def finish_infer(self, request_id: Any, key: TailKey, received: float, result: asyncio.Future[BatchResult]) -> None:
        """Reply with this request's slice of its batch, or the typed error it ended with."""
        self.in_flight -= 1
        if self.paused and self.in_flight < self.server.config.max_in_flight // 2 and self.transport:
            self.transport.resume_reading()
            self.paused = False
        if result.cancelled():  # the host is shutting down; the connection goes with it
            return
        error = result.exception()
        if isinstance(error, ProtocolError):  # deadline passed in the queue, or the tail failed
            self.reply_error(request_id, error.code, str(error))
            return
        assert error is None, f"the batcher fails requests with ProtocolError only, got {error!r}"
        done = result.result()
        self.send(
            {"id": request_id, "ok": True, "compute_ms": done.compute_ms, "queue_ms": done.queue_ms, "batch": done.batch},
            done.output,
        )
        self.server.stats.served(key, done.queue_ms / 1000.0, done.compute_ms / 1000.0, time.perf_counter() - received)


class HostServer:
    """Serve the tails of a :class:`TailRegistry` on TCP until :meth:`close`."""

    def __init__(self, registry: TailRegistry, config: ServerConfig = ServerConfig()) -> None:
        self.registry = registry
        self.config = config
        self.connections: set[_HostProtocol] = set()
        self.tasks: set[asyncio.Future[None]] = set()
        self.executor = ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="tail")
        self.stats = HostStats(  # the gauges read the batcher when collected
            connections=lambda: len(self.connections),
            in_flight=lambda: self.batcher.pending,
            queue_depth=lambda: self.batcher.queued,
        )
        self.batcher = Batcher(config.batching, self.executor, config.workers, on_batch=self.stats.batch_size.observe)
        self.frames_refused = PromCounter(
            PREFIX + "frames_refused", "Frames refused by authentication (each closes its connection), by reason.",
            ["reason"], registry=self.stats.registry,
        )
        for kind in REFUSAL_KINDS:
            self.frames_refused.labels(kind)
        self.metrics: MetricsEndpoint | None = None
        self._server: asyncio.AbstractServer | None = None

    def hello(self) -> dict[str, Any]:
        return {
            "protocol": PROTOCOL_VERSION,
            "bundles": self.registry.served(),
            "auth": self.config.key is not None,
            "max_frame_bytes": self.config.max_frame_bytes,
            "device": self.registry.device,
        }

    def load(self) -> float:
        """Mean samples queued or running per worker since the previous call (the TXT record's ``load``)."""
        return self.batcher.load()

    async def start(self) -> tuple[str, int]:
        """Bind and listen; returns the bound address (port 0 picks a free port)."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _HostProtocol(self), self.config.host, self.config.port, reuse_address=True, ssl=self.config.tls
        )
        host, port = self._server.sockets[0].getsockname()[:2]
        if self.config.metrics_port is not None:
            self.metrics = self.stats.serve_http(self.config.host, self.config.metrics_port)
        return host, port

    async def close(self) -> None:
        """Stop accepting, let requests in flight finish (bounded), then drop connections."""
        if self._server is not None:
            self._server.close()
        await self.batcher.close(self.config.shutdown_timeout)
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=self.config.shutdown_timeout)
        if self.metrics is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.metrics.close)
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.close()
        if self._server is not None:
            await asyncio.wait_for(self._server.wait_closed(), self.config.shutdown_timeout)
        self.executor.shutdown(wait=False, cancel_futures=True)
