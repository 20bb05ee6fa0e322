"""The device's connection to a host: many requests in flight, replies matched by id.

Each request gets a future keyed by its id; the reader resolves whichever reply arrives,
in any order. Every wait is bounded: a host that stops answering raises
:class:`HostUnavailableError` after the timeout, and a host that goes away fails every
pending request at once, so the caller can fall back without losing a frame.

:class:`Credentials` carry what a device proves and trusts: the pre-shared key (every frame
authenticated, see :mod:`device_runtime.wire._auth`) and the TLS context (see :mod:`device_runtime.wire._tls`).
A failure of either raises :class:`AuthenticationError`, whose message names what to fix; so
does a device without TLS that dials a host serving TLS.

Requests are built and replies parsed only by the typed ops of :mod:`device_runtime.wire.ops`:
a reply missing a field, or with one of the wrong type, is a malformed reply
(:class:`HostUnavailableError`), never a ``KeyError`` here or a wrong number downstream.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import ssl
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from device_runtime.link._kernel_timing import POLL_FIRST_S, KernelTiming, UploadTiming, UploadWatch
from device_runtime.wire import DEFAULT_MAX_FRAME_BYTES, DeviceAuth, FramedProtocol, Oversized, decode
from device_runtime.wire.coding import CodedCut
from device_runtime.wire.ops import (
    DEFAULT_LINK_BYTES,
    ErrorReply,
    HelloReply,
    HelloRequest,
    Hop,
    HopTiming,
    InferReply,
    InferRequest,
    LinksReply,
    LinksRequest,
    PingRequest,
    ProfileReply,
    ProfileRequest,
    Quantization,
    Reply,
    Request,
    StatsRequest,
    parse_reply,
)
from splitedge.errors import AuthenticationError, FrameRefused, HostUnavailableError, ProtocolError, RemoteError

#: A request as it goes out: its message, its tensor (None: none) and the tensor's fields.
_Parts = tuple[dict[str, Any], Optional[np.ndarray], Mapping[str, Any]]


@dataclass(frozen=True)
class InferResult:
    output: np.ndarray
    compute_ms: float  # the host's own time for the tail
    round_trip_ms: float  # send → reply, as the device saw it
    queue_ms: float = 0.0  # the host's wait for a worker before the tail ran
    sent: float = 0.0  # perf_counter when the request was handed to the socket
    # perf_counter when the reply reached this board: its kernel's receive stamp where there is
    # one (kernel_timing), else when the reply was read
    received: float = 0.0
    upload: UploadTiming | None = None  # what TCP_INFO showed of the request's upload (None: no TCP_INFO)
    reply_wait_ms: float = 0.0  # how long the reply then waited for this board's CPU (not in round_trip_ms)
    hops: tuple[HopTiming, ...] = ()  # a chain's hosts after the first, in route order
    batch: int = 1  # the samples of the host's batch this request ran in

    @property
    def downstream_ms(self) -> float:
        """The time a chain spent past its first host: the later hops' queues, stages and links."""
        return sum(hop.queue_ms + hop.compute_ms + hop.link_ms for hop in self.hops)

    @property
    def transfer_ms(self) -> float:
        """This board's link time: the round trip less the host's queueing and compute, and less
        whatever a chain did past its first host (what the rate estimate needs)."""
        return max(self.round_trip_ms - self.compute_ms - self.queue_ms - self.downstream_ms, 0.0)


@dataclass(frozen=True)
class Probe:
    """A ping's round trip and what the kernel measured of it (see :class:`InferResult`)."""

    payload_bytes: int
    round_trip_ms: float  # sent → the reply reached this board (its kernel's stamp where there is one)
    upload: UploadTiming | None = None  # what TCP_INFO showed of its upload (None: no TCP_INFO)
    reply_wait_ms: float = 0.0  # how long the reply then waited for this board's CPU


@dataclass(frozen=True)
class _Timing:
    sent: float  # perf_counter just before the request was written
    received: float  # ... when its reply reached this board
    upload: UploadTiming | None
    reply_wait_s: float

    @property
    def round_trip_ms(self) -> float:
        return (self.received - self.sent) * 1000.0


@dataclass(frozen=True)
class Deadline:
    """A request's budget on the host: ``ms`` for its queue and tail, and what the device would do
    instead and its ms (``("local", 300.0)``; None: nothing). The host then refuses for the deadline
    only where it would answer after that too (:attr:`InferRequest.give_up_ms`)."""

    ms: float
    alternative: tuple[str, float] | None = None


@dataclass(frozen=True)
class Leg:
    """Where a request stands in a chain: the stage (or a semantic split's fragment) this host runs,
    and the hops of the stages after it."""

    stage: int
    route: tuple[Hop, ...] = ()


@dataclass(frozen=True)
class Credentials:
    """What a device proves and trusts: the host's pre-shared key (None: frames are not
    authenticated) and a TLS context (None: plain TCP)."""

    key: bytes | None = field(default=None, repr=False)
    tls: ssl.SSLContext | None = None


NEEDS_KEY = "requires authenticated frames: give this device the host's key (split-device --key-file)"
PASS_TLS_CA = "pass its CA certificate with --tls-ca"
#: A TLS record starts with its content type (change_cipher_spec, alert, handshake, application
#: data) and the major version 3. As a frame's length prefix it would claim over 335 MB.
TLS_RECORD_TYPES = range(0x14, 0x18)


def _sent_as(fields: Mapping[str, Any]) -> tuple[Quantization | None, CodedCut | None]:
    """What a tensor's own wire fields say it is: affine uint8 (``scale``, ``zero_point``), or a
    coded cut's packed bits (``coding`` and the ``shape`` they unpack to, issue 47)."""
    if "coding" in fields:
        return None, CodedCut(fields["coding"], tuple(fields["shape"]))
    return (Quantization(**fields) if fields else None), None


def looks_like_tls(first: memoryview) -> bool:
    """Whether the first bytes a host sent are a TLS record rather than a frame."""
    return len(first) >= 1 and first[0] in TLS_RECORD_TYPES and (len(first) < 2 or first[1] == 0x03)


class _ClientProtocol(FramedProtocol):
    def __init__(self, max_frame_bytes: int, address: str, auth: DeviceAuth | None = None, tls: bool = False,
                 kernel_timing: bool = True) -> None:
        super().__init__(max_frame_bytes, auth)
        self.address = address
        self.tls = tls
        self.kernel_timing = kernel_timing
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.lost: Exception | None = None
        # Resolved when the host's challenge has been answered: only then may requests be sealed.
        self.ready: asyncio.Future[None] | None = asyncio.get_running_loop().create_future() if auth else None
        self.heard = False  # any bytes from the host yet
        self._first_read: memoryview | None = None
        self.kernel: KernelTiming | None = None  # the connection as the kernel sees it (None: not a TCP socket)
        self.watch: UploadWatch | None = None  # TCP_INFO looks at uploads crossing (plain TCP only)
        self._look_timer: asyncio.TimerHandle | None = None
        # Each reply's arrival (perf_counter) and wait for this board's CPU, by request id, until _exchange takes it.
        self.arrivals: dict[int, tuple[float, float]] = {}
        self._read_arrival: tuple[float, float] | None = None  # the current read's
        self.clock = time.perf_counter  # times requests and replies (a test drives its own)
        self.realtime = time.time  # the kernel's stamps' clock, CLOCK_REALTIME

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        sock = transport.get_extra_info("socket")
        if self.kernel_timing and sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # Receive stamps are peeked off the socket: under TLS the TLS layer reads ahead of us.
            self.kernel = KernelTiming(sock, stamps=not self.tls)
            if not self.tls:  # under TLS the kernel counts records, not the frames' bytes
                self.watch = UploadWatch(self.kernel.tcp_info, lambda: self.clock())
        super().connection_made(transport)

    def sent(self, request_id: int, start: float) -> None:
        """A request was written at ``start``: watch its upload, looking again soon if it is crossing."""
        if self.watch is not None and self.watch.sent(request_id, start, self.bytes_written):
            if self._look_timer is not None:
                self._look_timer.cancel()
            self._look_timer = asyncio.get_running_loop().call_later(POLL_FIRST_S, self._look)

    def take_acks(self) -> None:
        """The kernel's ACK stamps (its error queue wakes the loop as a read would, so they are
        taken here, before every read): each upload is across when its last byte's ACK came."""
        if self.kernel is not None and self.watch is not None:
            stamps = self.kernel.acks()
            if stamps:
                offset = self.clock() - self.realtime()  # read together: no system call between them
                for byte, stamp in stamps:
                    self.watch.acked(byte, stamp + offset)

    def _look(self) -> None:
        self._look_timer = None
        delay = self.watch.look() if self.watch is not None and self.transport is not None else None
        if delay is not None and not self.transport.is_closing():
            self._look_timer = asyncio.get_running_loop().call_later(delay, self._look)

    def get_buffer(self, sizehint: int) -> memoryview:
        # The event loop reads right after this: what is waiting arrived lag seconds ago.
        lag = self.kernel.reply_lag_s() if self.kernel is not None else None
        now = self.clock()
        self.take_acks()
        self._read_arrival = (now, 0.0) if lag is None else (now - lag, lag)
        buffer = super().get_buffer(sizehint)
        if not self.heard:
            self._first_read = buffer
        return buffer

    def buffer_updated(self, nbytes: int) -> None:
        if not self.heard:
            self.heard = True
            first, self._first_read = self._first_read, None
            # A plain device that dialled a TLS host: say so, rather than "a reply too large".
            if not self.tls and first is not None and looks_like_tls(first[:nbytes]):
                self._fail_all(AuthenticationError(f"host {self.address} speaks TLS: {PASS_TLS_CA}"))
                return
        super().buffer_updated(nbytes)

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
            self._fail_all(HostUnavailableError(f"host {self.address} sent a malformed reply: {exc}"))
            return
        if reply.get("op") == "challenge":  # this device has no key; the host wants one
            self._fail_all(AuthenticationError(f"host {self.address} {NEEDS_KEY}"))
            return
        request_id = reply.get("id")
        if request_id is None and reply.get("ok") is False:  # about the connection, not one request
            self._connection_error(reply)
            return
        future = self.pending.pop(request_id, None) if type(request_id) is int else None  # our ids are ints
        if future is not None and not future.done():
            if self._read_arrival is not None:
                self.arrivals[request_id] = self._read_arrival
            future.set_result(reply)

    def _connection_error(self, reply: dict[str, Any]) -> None:
        """An error reply with no id: an authentication refusal ends the connection (the host closes
        after it); any other (a frame of ours the host could not read) concerns no pending request."""
        try:
            error = ErrorReply.parse(reply)
        except ProtocolError as exc:
            self._fail_all(HostUnavailableError(f"host {self.address} sent a malformed reply: {exc}"))
            return
        if error.code == "unauthorized":
            self._fail_all(AuthenticationError(f"host {self.address} refused this device: {error.message}"))
        elif error.code == "overloaded":  # past a connection limit of the host's, which closes now
            self._fail_all(HostUnavailableError(f"host {self.address} {error.message}; try another host or later"))

    def oversized(self, event: Oversized) -> None:
        self._fail_all(HostUnavailableError(f"host sent a reply too large: {event.message}"))

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self.kernel is not None:
            self.kernel.close()
        if self._look_timer is not None:
            self._look_timer.cancel()
        if not self.heard and not self.tls and self.auth is None:
            # Our plain hello went out and the host hung up without a byte: what a TLS host does.
            self._fail_all(AuthenticationError(
                f"host {self.address} closed the connection during hello: it speaks TLS, most likely; {PASS_TLS_CA}"
            ))
        else:
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
        self.hello: HelloReply | None = None  # the host's answer to hello, once connected

    @property
    def alive(self) -> bool:
        """Whether the connection still stands (a lost one fails every request at once)."""
        transport = self._protocol.transport
        return self._protocol.lost is None and transport is not None and not transport.is_closing()

    @property
    def idle(self) -> bool:
        """No request of this connection is waiting for its reply (a pool may close it for another)."""
        return not self._protocol.pending

    @property
    def server_info(self) -> dict[str, Any]:
        """The hello reply as a map (``bundles``, ``auth``, ``device``...); :attr:`hello` is the typed one."""
        return {} if self.hello is None else self.hello.parts()[0]

    @classmethod
    async def connect(
        cls, host: str, port: int, timeout: float = 5.0, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        credentials: Credentials = Credentials(), kernel_timing: bool = True,
    ) -> "HostClient":
        """Open the connection (TLS, then the key's handshake, when ``credentials`` have them) and
        exchange ``hello``; the host's answer is kept in :attr:`hello`.

        ``kernel_timing=False`` leaves the kernel's stamps and ``TCP_INFO`` off
        (:mod:`~device_runtime.link._kernel_timing`): a client that estimates no link (a load
        generator standing in for boards) saves the third of its CPU per request they cost,
        and each request's timing is then its own clock's."""
        loop = asyncio.get_running_loop()
        address = f"{host}:{port}"
        auth = DeviceAuth(credentials.key) if credentials.key is not None else None
        tls = credentials.tls
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _ClientProtocol(max_frame_bytes, address, auth, tls=tls is not None,
                                           kernel_timing=kernel_timing), host, port,
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
            hello = await client._call(HelloRequest(client._next_id()), timeout)
        except BaseException:
            await client.close()
            raise
        assert isinstance(hello, HelloReply)
        client.hello = hello
        if auth is not None and not hello.auth:
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

    def _next_id(self) -> int:
        return next(self._ids)

    async def _exchange(self, request_id: int, op: object, parts: _Parts, timeout: float) -> dict[str, Any]:
        """Send one request's frame and wait for the reply map carrying its id."""
        return (await self._exchange_timed(request_id, op, parts, timeout))[0]

    async def _exchange_timed(
        self, request_id: int, op: object, parts: _Parts, timeout: float
    ) -> tuple[dict[str, Any], _Timing]:
        """:meth:`_exchange`, and when the request went out and its reply came in."""
        protocol = self._protocol
        if protocol.lost is not None:
            raise protocol.lost
        loop = asyncio.get_running_loop()
        future: asyncio.Future[dict[str, Any]] = loop.create_future()
        protocol.pending[request_id] = future
        message, tensor, tensor_fields = parts
        sent = protocol.clock()
        protocol.send(message, tensor, **tensor_fields)
        protocol.sent(request_id, sent)
        # A bare timer rather than asyncio.wait_for: this is the per-frame hot path, and the
        # timer is all wait_for would add here.
        timer = loop.call_later(timeout, self._expire, request_id, op, timeout)
        try:
            reply = await future
        finally:
            timer.cancel()
            if future.cancelled():  # the caller gave up on it (a late fragment): its reply is not awaited
                protocol.pending.pop(request_id, None)
            arrival = protocol.arrivals.pop(request_id, None)
            protocol.take_acks()
            upload = protocol.watch.settled(request_id) if protocol.watch is not None else None
        received, lag = arrival if arrival is not None else (protocol.clock(), 0.0)
        return reply, _Timing(sent, max(received, sent), upload, lag)

    async def _call(self, request: Request, timeout: float) -> Reply:
        """Send a typed request and parse its reply: the op's ok reply, or :class:`RemoteError`."""
        return (await self._call_timed(request, timeout))[0]

    async def _call_timed(self, request: Request, timeout: float) -> tuple[Reply, _Timing]:
        reply, timing = await self._exchange_timed(request.id, request.op, request.parts(), timeout)
        return self._parsed(request.op, reply), timing

    def _parsed(self, op: str, reply: dict[str, Any]) -> Reply:
        try:
            parsed = parse_reply(op, reply)
        except ProtocolError as exc:
            raise HostUnavailableError(f"host {self.address} sent a malformed reply: {exc}") from exc
        if isinstance(parsed, ErrorReply):
            raise RemoteError(parsed.code, parsed.message)
        return parsed

    async def request(
        self, message: dict[str, Any], timeout: float, tensor: np.ndarray | None = None, **tensor_fields: Any
    ) -> dict[str, Any]:
        """Send a request map as it is (given an id) and return the reply map, for requests made by
        hand: tests, benchmarks, malformed ones on purpose. The device's own requests go through the
        typed methods. An error reply raises :class:`RemoteError`."""
        request_id = self._next_id()
        op = message.get("op")
        reply = await self._exchange(request_id, op, ({**message, "id": request_id}, tensor, tensor_fields), timeout)
        if reply.get("ok") is not True:
            self._parsed(str(op), reply)  # raises: RemoteError, or a malformed reply
        return reply

    def _expire(self, request_id: int, op: object, timeout: float) -> None:
        future = self._protocol.pending.pop(request_id, None)
        if future is not None and not future.done():
            future.set_exception(
                HostUnavailableError(f"host {self.address} did not answer {op} #{request_id} within {timeout:g} s")
            )

    async def infer(
        self, bundle_id: str, split_id: str, tensor: np.ndarray, timeout: float = 10.0,
        deadline: Deadline | None = None, leg: Leg | None = None, **tensor_fields: Any,
    ) -> InferResult:
        """Run the tail of ``split_id`` on the host for a cut tensor (B, ...); ``tensor_fields``
        (``scale``, ``zero_point``) for an affine uint8 one, or (``coding``, ``shape``) for a coded
        cut's packed bits (:meth:`~device_runtime.wire.coding.CodedCut.fields`).

        ``deadline`` is the host's budget for the request (its queue and tail; None: none), and
        ``timeout`` how long this device waits for the reply: apart, because a frame's budget is far
        shorter than the time after which a silent host is taken for gone, and a frame the host says
        it cannot answer in time must not cost the connection. For a chain (or a fragment), ``leg``
        is the stage this host runs and the hosts of the stages after it.
        """
        quantization, coding = _sent_as(tensor_fields)
        deadline_ms = None if deadline is None else deadline.ms
        name, ms = deadline.alternative if deadline is not None and deadline.alternative is not None else (None, None)
        stage, route = (None, ()) if leg is None else (leg.stage, tuple(leg.route))
        request = InferRequest(self._next_id(), bundle_id, split_id, tensor, deadline_ms, quantization, stage,
                               route, name, ms, coding)
        reply, timing = await self._call_timed(request, timeout)
        assert isinstance(reply, InferReply)
        return InferResult(
            reply.tensor, reply.compute_ms, timing.round_trip_ms, reply.queue_ms, sent=timing.sent,
            received=timing.received, upload=timing.upload, reply_wait_ms=timing.reply_wait_s * 1000.0,
            hops=reply.hops, batch=reply.batch,
        )

    def crossing(self) -> tuple[float, float] | None:
        """The rate (bit/s) and span (s) the kernel sees the oldest upload in flight crossing at
        now (:meth:`~device_runtime.link._kernel_timing.UploadWatch.crossing`); None without one."""
        watch = self._protocol.watch
        return watch.crossing() if watch is not None else None

    async def profile(
        self, bundle_id: str, batches: Sequence[int], repeats: int = 10, splits: Sequence[str] | None = None,
        timeout: float = 300.0,
    ) -> dict[str, dict[int, float]]:
        """The host's own median tail ms per split and batch size (its compute, measured there)."""
        chosen = None if splits is None else tuple(splits)
        reply = await self._call(ProfileRequest(self._next_id(), bundle_id, tuple(batches), repeats, chosen), timeout)
        assert isinstance(reply, ProfileReply)
        return reply.tail_ms

    async def ping(self, payload_bytes: int = 0, timeout: float = 5.0) -> float:
        """Round trip in ms; a payload makes it a link-rate probe (the host answers with a small reply)."""
        return (await self.probe(payload_bytes, timeout)).round_trip_ms

    async def probe(self, payload_bytes: int = 0, timeout: float = 5.0) -> Probe:
        """A ``ping`` with ``payload_bytes`` and what the kernel saw of it (:class:`Probe`)."""
        request = PingRequest(self._next_id(), np.zeros(payload_bytes, dtype=np.uint8) if payload_bytes else None)
        _, timing = await self._call_timed(request, timeout)
        return Probe(payload_bytes, timing.round_trip_ms, timing.upload, timing.reply_wait_s * 1000.0)

    async def links(
        self, peers: Sequence[str], payload_bytes: int = DEFAULT_LINK_BYTES, timeout: float = 30.0
    ) -> LinksReply:
        """Have the host measure its links to ``peers`` (rate and round trip), for placing a chain."""
        reply = await self._call(LinksRequest(self._next_id(), tuple(peers), payload_bytes), timeout)
        assert isinstance(reply, LinksReply)
        return reply

    async def stats(self, timeout: float = 5.0) -> dict[str, Any]:
        """The host's stats reply as a map: ``["stats"]`` holds its figures (docs/protocol.md)."""
        return (await self._call(StatsRequest(self._next_id()), timeout)).parts()[0]

    async def close(self) -> None:
        transport = self._protocol.transport
        if transport is not None and not transport.is_closing():
            transport.close()
        await asyncio.sleep(0)  # let the transport run connection_lost
