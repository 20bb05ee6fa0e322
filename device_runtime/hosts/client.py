"""The device's connection to a host: many requests in flight, replies matched by id.

Each request gets a future keyed by its id; the reader resolves whichever reply arrives,
in any order. Every wait is bounded: a host that stops answering raises
:class:`HostUnavailableError` after the timeout, and a host that goes away fails every
pending request at once, so the caller can fall back without losing a frame.

:class:`Credentials` carry what a device proves and trusts: the pre-shared key (every frame
authenticated, see :mod:`device_runtime.wire.auth`) and the TLS context (see :mod:`device_runtime.wire.tls`).
A failure of either raises :class:`AuthenticationError`, whose message names what to fix.
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from device_runtime.wire.auth import DeviceAuth
from device_runtime.wire.connection import FramedProtocol
from device_runtime.wire.protocol import DEFAULT_MAX_FRAME_BYTES, PROTOCOL_VERSION, Oversized, decode
from splitedge.errors import AuthenticationError, FrameRefused, HostUnavailableError, ProtocolError, RemoteError


@dataclass(frozen=True)
class InferResult:
    output: np.ndarray
    compute_ms: float  # the host's own time for the tail
    round_trip_ms: float  # send → reply, as the device saw it
    queue_ms: float = 0.0  # the host's wait for a worker before the tail ran
    sent: float = 0.0  # perf_counter when the request was handed to the socket
    received: float = 0.0  # perf_counter when the reply was read

    @property
    def transfer_ms(self) -> float:
        """Link time: the round trip less the host's queueing and compute (what the rate estimate needs)."""
        return max(self.round_trip_ms - self.compute_ms - self.queue_ms, 0.0)


@dataclass(frozen=True)
class Credentials:
    """What a device proves and trusts: the host's pre-shared key (None: frames are not
    authenticated) and a TLS context (None: plain TCP)."""

    key: bytes | None = field(default=None, repr=False)
    tls: ssl.SSLContext | None = None


NEEDS_KEY = "requires authenticated frames: give this device the host's key (split-device --key-file)"


class _ClientProtocol(FramedProtocol):
    def __init__(self, max_frame_bytes: int, address: str, auth: DeviceAuth | None = None) -> None:
        super().__init__(max_frame_bytes, auth)
        self.address = address
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.lost: Exception | None = None
        # Resolved when the host's challenge has been answered: only then may requests be sealed.
        self.ready: asyncio.Future[None] | None = asyncio.get_running_loop().create_future() if auth else None

    def handshake(self) -> None:
        assert isinstance(self.auth, DeviceAuth)
        self.send(self.auth.auth_message())
        if self.ready is not None and not self.ready.done():
            self.ready.set_result(None)

    def refused(self, exc: FrameRefused) -> None:
        self._fail_all(AuthenticationError(f"host {self.address}: {exc.reason}"))  # the device's own reasons

    def frame_received(self, body: memoryview) -> None:
        try:
            reply = decode(body)
        except ProtocolError as exc:
            self._fail_all(HostUnavailableError(f"host sent a malformed reply: {exc}"))
            return
        if reply.get("op") == "challenge":  # this device has no key; the host wants one
            self._fail_all(AuthenticationError(f"host {self.address} {NEEDS_KEY}"))
            return
        error = reply.get("error")
        if isinstance(error, dict) and error.get("code") == "unauthorized":  # the host closes after it
            self._fail_all(AuthenticationError(f"host {self.address} refused this device: {error.get('message')}"))
            return
        future = self.pending.pop(reply.get("id"), None)  # type: ignore[arg-type]
        if future is not None and not future.done():
            future.set_result(reply)

    def oversized(self, event: Oversized) -> None:
        self._fail_all(HostUnavailableError(f"host sent a reply too large: {event.message}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail_all(HostUnavailableError(f"connection to host lost{f': {exc}' if exc else ''}"))

    def _fail_all(self, error: Exception) -> None:
        # The first cause is the one to report (a refusal), not the lost connection that follows it.
        error = self.lost = self.lost or error
        if self.ready is not None and not self.ready.done():
            self.ready.set_exception(error)
        for future in self.pending.values():
            if not future.done():
                future.set_exception(error)
        self.pending.clear()
        if self.transport is not None:
            self.transport.close()


class HostClient:
    """One TCP connection to one host. Use :meth:`connect`; close with :meth:`close`."""

    def __init__(self, address: str, protocol: _ClientProtocol) -> None:
        self.address = address
        self._protocol = protocol
        self._ids = itertools.count(1)
        self.server_info: dict[str, Any] = {}

    @classmethod
    async def connect(
        cls, host: str, port: int, timeout: float = 5.0, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        credentials: Credentials = Credentials(),
    ) -> "HostClient":
        """Open the connection (TLS, then the key's handshake, when ``credentials`` have them) and
        exchange ``hello``; the host's answer is kept in ``server_info``."""
        loop = asyncio.get_running_loop()
        address = f"{host}:{port}"
        auth = DeviceAuth(credentials.key) if credentials.key is not None else None
        tls = credentials.tls
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _ClientProtocol(max_frame_bytes, address, auth), host, port,
                    ssl=tls, server_hostname=host if tls is not None else None,
                ),
                timeout,
            )
        except ssl.SSLCertVerificationError as exc:
            raise AuthenticationError(
                f"host {address}: its TLS certificate is not trusted ({exc.verify_message}); pass the certificate "
                "or the CA that signed it with --tls-ca, and dial a name or address the certificate lists"
            ) from exc
        except (OSError, asyncio.TimeoutError) as exc:
            tls_hint = " (does the host serve TLS? it needs --tls-cert and --tls-key)"
            hint = tls_hint if isinstance(exc, ssl.SSLError) else ""
            raise HostUnavailableError(f"cannot connect to host {address}: {exc or 'timed out'}{hint}") from exc
        client = cls(address, protocol)
        try:
            if protocol.ready is not None:
                await client._answer_challenge(protocol.ready, timeout)
            client.server_info = await client.request({"op": "hello", "protocol": PROTOCOL_VERSION}, timeout)
        except BaseException:
            await client.close()
            raise
        if auth is not None and client.server_info.get("auth") is not True:
            await client.close()
            raise AuthenticationError(f"host {address} says it does not authenticate frames; this device has a key")
        return client

    async def _answer_challenge(self, ready: asyncio.Future[None], timeout: float) -> None:
        """Wait for the host's challenge (answered by the protocol as soon as it arrives)."""
        try:
            await asyncio.wait_for(asyncio.shield(ready), timeout)
        except asyncio.TimeoutError:
            ready.cancel()
            raise AuthenticationError(
                f"host {self.address} sent no authentication challenge within {timeout:g} s: it does not "
                "authenticate frames (started without --key-file?) or it serves TLS (pass --tls-ca); a device "
                "with a key talks only to hosts that authenticate frames"
            ) from None

    async def request(
        self, message: dict[str, Any], timeout: float, tensor: np.ndarray | None = None, **tensor_fields: Any
    ) -> dict[str, Any]:
        """Send one request and wait for its reply; typed error replies raise :class:`RemoteError`."""
        if self._protocol.lost is not None:
            raise self._protocol.lost
        request_id = next(self._ids)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._protocol.pending[request_id] = future
        self._protocol.send({**message, "id": request_id}, tensor, **tensor_fields)
        # A bare timer rather than asyncio.wait_for: this is the per-frame hot path, and the
        # timer is all wait_for would add here.
        timer = loop.call_later(timeout, self._expire, request_id, message.get("op"), timeout)
        try:
            reply = await future
        finally:
            timer.cancel()
        if not reply.get("ok"):
            error = reply.get("error") or {}
            raise RemoteError(str(error.get("code", "internal")), str(error.get("message", "")))
        return reply

    def _expire(self, request_id: int, op: object, timeout: float) -> None:
        future = self._protocol.pending.pop(request_id, None)
        if future is not None and not future.done():
            future.set_exception(
                HostUnavailableError(f"host {self.address} did not answer {op} #{request_id} within {timeout:g} s")
            )

    async def infer(
        self, bundle_id: str, split_id: str, tensor: np.ndarray, timeout: float = 10.0, **tensor_fields: Any
    ) -> InferResult:
        """Run the tail of ``split_id`` on the host for a cut tensor (B, ...)."""
        start = time.perf_counter()
        reply = await self.request(
            {"op": "infer", "bundle": bundle_id, "split": split_id, "deadline_ms": timeout * 1000.0},
            timeout,
            tensor,
            **tensor_fields,
        )
        end = time.perf_counter()
        output = reply.get("tensor")
        if not isinstance(output, np.ndarray):
            raise HostUnavailableError(f"host {self.address} answered infer without a tensor")
        return InferResult(
            output, float(reply.get("compute_ms", 0.0)), (end - start) * 1000.0, float(reply.get("queue_ms", 0.0)),
            sent=start, received=end,
        )

    async def profile(
        self, bundle_id: str, batches: Sequence[int], repeats: int = 10, splits: Sequence[str] | None = None,
        timeout: float = 300.0,
    ) -> dict[str, dict[int, float]]:
        """The host's own median tail ms per split and batch size (its compute, measured there)."""
        message = {"op": "profile", "bundle": bundle_id, "batches": list(batches), "repeats": repeats}
        if splits is not None:
            message["splits"] = list(splits)
        reply = await self.request(message, timeout)
        return {split: {int(b): float(ms) for b, ms in times.items()} for split, times in reply["tail_ms"].items()}

    async def ping(self, payload_bytes: int = 0, timeout: float = 5.0) -> float:
        """Round trip in ms; a payload makes it a link-rate probe (the host answers with a small reply)."""
        payload = np.zeros(payload_bytes, dtype=np.uint8) if payload_bytes else None
        start = time.perf_counter()
        await self.request({"op": "ping"}, timeout, payload)
        return (time.perf_counter() - start) * 1000.0

    async def stats(self, timeout: float = 5.0) -> dict[str, Any]:
        return await self.request({"op": "stats"}, timeout)

    async def close(self) -> None:
        transport = self._protocol.transport
        if transport is not None and not transport.is_closing():
            transport.close()
        await asyncio.sleep(0)  # let the transport run connection_lost
