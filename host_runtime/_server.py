"""The host's TCP server: speaks the wire protocol, runs tails in worker threads.

One connection per device, many requests in flight on it; replies go out in completion
order and carry the request id. Malformed input never kills anything: a frame that fails to
decode gets a typed error reply and the connection goes on (framing is intact); an oversized
frame is refused from its length prefix and its body skipped unread. Each connection's
in-flight requests are bounded: past the limit the host stops reading from that socket
(backpressure) until replies drain. Across connections, :class:`~host_runtime._batcher.Batcher`
batches requests per tail and bounds the host's queue; :class:`~host_runtime._metrics.HostStats`
counts everything once, for ``stats`` and for Prometheus.

The host's walls (:mod:`host_runtime._limits`): connections are capped in all and per address,
closed when idle or when a frame stays unfinished too long (:class:`~host_runtime._admission.Admission`);
the frames still arriving on all connections together hold at most ``max_partial_bytes`` (a
connection whose frame does not fit stops being read until it does); ``profile`` runs on a thread
of its own, bounded (:mod:`host_runtime._profiling`), and it and ``links`` are metered
(:class:`~host_runtime._limits.CostlyWork`). Stopping refuses new work at once (``overloaded``), so a
loaded host drains instead of waiting out its timeout.

A chain's stage arrives with its route: the host runs its stage like any tail, passes the output
on to the next hop (:mod:`host_runtime._peers`: who may be one is bounded) and answers with what
comes back, each hop's queue, compute and link times added.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import ssl
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Callable, Iterator, cast

from prometheus_client import Counter as PromCounter, Gauge as PromGauge

from device_runtime.wire import REFUSAL_KINDS, FrameBudget, FramedProtocol, HostAuth
from device_runtime import stage_id
from device_runtime.wire.ops import (
    ErrorReply, HelloReply, HelloRequest, InferReply, InferRequest, LinksReply, LinksRequest, PingReply,
    PingRequest, ProfileReply, ProfileRequest, Reply, Request, StatsReply, StatsRequest, parse_request,
)
from device_runtime.wire import (
    DEFAULT_MAX_FRAME_BYTES, ErrorCode, Oversized, PROTOCOL_VERSION, REQUEST_LIMITS, decode,
)
from device_runtime.wire.ops import MAX_LINKS_REQUEST_BYTES
from host_runtime._admission import Admission
from host_runtime._batcher import Arrival, BatchConfig, Batcher, BatchResult, Outcome, TailKey
from host_runtime._limits import (
    DEFAULT_FIRST_FRAME_TIMEOUT_S,
    DEFAULT_FRAME_TIMEOUT_S,
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_CONNECTIONS_PER_ADDRESS,
    AcceptFailures,
    Activity,
    ConnectionGate,
    CostlyWork,
    Rate,
)
from host_runtime._metrics import PREFIX, HostStats, MetricsEndpoint
from host_runtime._metrics_http import endpoint_token
from host_runtime._peers import Peers
from host_runtime._profiling import DEFAULT_PROFILE_BUDGET_S, Profiler, ProfilePlan, plan_profile
from host_runtime._tails import TailRegistry, warm_up
from splitedge import SplitEdgeError
from splitedge.errors import FrameRefused, ProtocolError

log = logging.getLogger("splitedge.host")


@dataclass(frozen=True)
class ServerConfig:
    host: str = "0.0.0.0"
    port: int = 7767
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    max_in_flight: int = 32  # per connection, before the host stops reading from it
    workers: int = max(os.cpu_count() or 1, 1)
    shutdown_timeout: float = 5.0  # --drain-timeout: one deadline over everything pending when the host stops
    batching: BatchConfig = field(default_factory=BatchConfig)  # --max-batch, --max-wait-ms, --max-queue
    metrics_port: int | None = None  # Prometheus text on metrics_host:metrics_port (0: a free port); None: off
    # --metrics-interface: where the metrics listen (not ``host``: this machine only unless told);
    # anywhere else they ask for metrics_token, or metrics_http.metrics_token of ``key`` (issue 45)
    metrics_host: str = "127.0.0.1"
    metrics_token: bytes | None = field(default=None, repr=False)  # --metrics-token-file
    key: bytes | None = field(default=None, repr=False)  # --key-file: every frame authenticated (device_runtime.wire._auth)
    tls: ssl.SSLContext | None = None  # --tls-cert/--tls-key (device_runtime.wire.server_context)
    max_connections: int = DEFAULT_MAX_CONNECTIONS  # in all; past it a new connection is refused
    max_connections_per_address: int = DEFAULT_MAX_CONNECTIONS_PER_ADDRESS
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT_S  # s with nothing read and nothing in flight: closed
    frame_timeout: float = DEFAULT_FRAME_TIMEOUT_S  # s a frame may stay unfinished: closed
    first_frame_timeout: float = DEFAULT_FIRST_FRAME_TIMEOUT_S  # s a connection has to send its first complete frame
    profile_budget_s: float = DEFAULT_PROFILE_BUDGET_S  # tail-run s one profile request may spend
    profile_rate: float = 0.25  # tail-run s per s that profiles may spend, all connections together
    links_rate: float = 16 * 2**20  # bytes per s that links requests may send to peers, all together
    # Frames still arriving, all connections together (FrameBudget): room for four of the largest.
    max_partial_bytes: int = 4 * DEFAULT_MAX_FRAME_BYTES
    peers: tuple[str, ...] = ()  # --peer host:port: next hops a host without a key may pass chains on to
    forward_timeout: float = 10.0  # s to wait for a next hop's answer when the request has no deadline
    # Listen with SO_REUSEPORT: ``--procs`` runs several servers on one port, the kernel spreading connections.
    reuse_port: bool = False

    def __post_init__(self) -> None:
        assert self.max_partial_bytes >= self.max_frame_bytes, (
            f"max_partial_bytes ({self.max_partial_bytes}) must hold one frame of max_frame_bytes ({self.max_frame_bytes})"
        )
        assert min(self.idle_timeout, self.frame_timeout, self.first_frame_timeout) > 0, "timeouts must be positive"
        # hello announces it, and a board refuses a hello whose budget is out of this range
        low, high = HelloReply.MIN_PROFILE_BUDGET_MS / 1000, HelloReply.MAX_PROFILE_BUDGET_MS / 1000
        assert low <= self.profile_budget_s <= high, (
            f"profile_budget_s must be {low:g}..{high:g} s, got {self.profile_budget_s!r}"
        )


class _HostProtocol(FramedProtocol):
    """One connection: reads its frames, dispatches each request to its handler, replies. Which
    connections the host keeps is :class:`~host_runtime._admission.Admission`'s, what ``profile``
    and ``links`` may spend :class:`~host_runtime._limits.CostlyWork`'s, a chain's next hop
    :class:`~host_runtime._peers.Peers`'."""

    def __init__(self, server: "HostServer") -> None:
        key = server.config.key
        super().__init__(server.config.max_frame_bytes, HostAuth(key) if key is not None else None, server.budget)
        self.server = server
        self.in_flight = 0
        self.address = ""  # the peer's IP address, once admitted
        # Under TLS, the TCP transport while its handshake runs (counted against the caps from accept,
        # shed like any connection that has not proven itself); None once the TLS transport is made.
        self.handshaking: asyncio.Transport | None = None
        self.splits: Counter[str] = Counter()  # infer requests admitted, by tail (the live page's "its splits")
        now = server.clock()
        self.activity = Activity(now, opened=now)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        self.address = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        if not self.server.admission.admit(self, transport):  # refused: said and closed
            return
        tls = self.server.config.tls
        if tls is None:
            super().connection_made(transport)
        else:  # the handshake is the connection's first frame (Admission.handshake)
            self.server.admission.handshake(self, cast(asyncio.Transport, transport), tls)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.server.admission.forget(self)

    @property
    def working(self) -> bool:
        """Requests in flight, or a profile or links running: the host's wait, not the peer's."""
        return self.in_flight > 0 or self.server.costly.holds(self)

    def buffer_updated(self, nbytes: int) -> None:
        frames = self.frames_read
        super().buffer_updated(nbytes)
        self.activity.read(self.server.clock(), not self.decoder.idle, self.frames_read != frames)
        self.server.admission.read_from(self)

    def resume(self, reason: str) -> None:
        paused = bool(self.pauses)
        super().resume(reason)
        if paused and not self.pauses and reason != "budget":  # waiting for memory counts as the frame's time
            self.activity.resumed(self.server.clock())

    def evicted(self) -> None:
        self.server.admission.connections_closed.labels("frame_evicted").inc()
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        log.warning("closed the connection from %s: its frame held more than its share of the memory for frames "
                    "arriving, and arrived slowest, when another connection's frame needed it", peer)
        super().evicted()

    def reply_error(self, request_id: Any, code: str, message: str) -> None:
        self.server.stats.error(code)
        log.debug("error reply %s: %s", code, message)
        self.send_reply(ErrorReply(request_id, code, message))

    def send_reply(self, reply: Reply) -> None:
        message, tensor, tensor_fields = reply.parts()
        self.send(message, tensor, **tensor_fields)

    def oversized(self, event: Oversized) -> None:
        self.reply_error(None, ErrorCode.BAD_REQUEST, event.message)

    def refused(self, exc: FrameRefused) -> None:
        """A frame failed authentication: nothing of it is trusted, not even its id. The peer gets
        one ``unauthorized`` reply, the same whatever went wrong, and the connection closes."""
        self.server.frames_refused.labels(exc.kind).inc()
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        log.warning("refused a frame from %s (%s); closing the connection", peer, exc.reason)
        self.reply_error(None, ErrorCode.UNAUTHORIZED, str(exc))
        super().refused(exc)

    def frame_received(self, body: memoryview) -> None:
        received = time.perf_counter()  # the frame is all here: queue_ms and deadlines count from now
        try:
            message = decode(body, REQUEST_LIMITS)
            op = message.get("op")
            self.server.stats.request(op)
            if op in ("infer", "profile", "links") and self.server.draining:
                raise ProtocolError("this host is shutting down; use another host", ErrorCode.OVERLOADED, message.get("id"))
            request = parse_request(message)
        except ProtocolError as exc:
            self.reply_error(exc.request_id, exc.code, str(exc))
            return
        _HANDLERS[type(request)](self, request, received)

    def on_hello(self, request: HelloRequest, received: float) -> None:
        self.send_reply(HelloReply(request.id, **self.server.hello()))

    def on_ping(self, request: PingRequest, received: float) -> None:
        self.send_reply(PingReply(request.id, 0 if request.tensor is None else request.tensor.nbytes))

    def on_stats(self, request: StatsRequest, received: float) -> None:
        self.send_reply(StatsReply(request.id, self.server.stats.as_dict()))

    def on_profile(self, request: ProfileRequest, received: float) -> None:
        try:
            plan = plan_profile(self.server.registry, request)  # what it names is checked first: typed errors
            self.server.costly.admit(self, "profile", self.server.config.profile_budget_s, request.id)
        except ProtocolError as exc:  # bad, or overloaded (CostlyWork.admit: retry later)
            self.reply_error(request.id, exc.code, str(exc))
            return
        self.server.spawn(self.profile(request, plan))

    def on_links(self, request: LinksRequest, received: float) -> None:
        try:
            self.server.costly.admit(self, "links", len(request.peers) * request.bytes, request.id)
        except ProtocolError as exc:
            self.reply_error(request.id, exc.code, str(exc))
            return
        self.server.spawn(self.measure_links(request))

    async def measure_links(self, request: LinksRequest) -> None:
        """Measure the links to the peers asked for (:meth:`~host_runtime._peers.Peers.measure`) and answer."""
        try:
            links, failed = await self.server.peers.measure(request)
        finally:
            self.server.costly.done(self)
        self.send_reply(LinksReply(request.id, links, failed))

    def on_infer(self, request: InferRequest, received: float) -> None:
        split = request.split if request.stage is None else stage_id(request.split, request.stage)
        key: TailKey = (request.bundle, split)
        # The deadline, or the board's own answer's time where that is later: answering a frame a little
        # late still beats a board that would take ten times longer itself (InferRequest.give_up_ms).
        give_up_ms = request.give_up_ms
        deadline = None if give_up_ms is None else received + give_up_ms / 1000.0
        try:
            if request.route:
                self.server.peers.check(request.route[0].address)
            arrival = self._arrival(request)  # uint8 or packed bits as they came: a worker decodes them
            tail = self.server.registry.lookup_for(request.bundle, split, arrival.seen())
            self.server.batcher.submit(key, tail, arrival, received, deadline,
                                       partial(self.finish_infer, request, key, received, deadline))
        except ProtocolError as exc:  # refused at once: bad, overloaded, too late already, or a hop not allowed
            self.reply_error(request.id, exc.code, str(exc))
            return
        self.splits[split] += 1  # a tail served here: the keys are bounded by the registry
        self.in_flight += 1
        if self.in_flight >= self.server.config.max_in_flight:
            self.pause("in_flight")

    def _arrival(self, request: InferRequest) -> Arrival:
        """The request's tensor, and how a worker makes it what the tail takes: a coded cut by the
        split's coding (the split's, whichever of its stages or fragments this host runs)."""
        coded = request.coding
        if coded is None:
            return Arrival.of(request.tensor, request.quantization)
        return Arrival.coded(request.tensor, coded, self.server.registry.coding(request.bundle, request.split, coded.name))

    async def profile(self, request: ProfileRequest, plan: ProfilePlan) -> None:
        """Time tails here for a board's calibration, on the profiler's own thread (bounded and
        one at a time: :mod:`host_runtime._profiling`)."""
        budget_s = self.server.config.profile_budget_s
        try:
            try:
                with self.server.batcher.other_work(max(plan.batches)):
                    times, spent = await self.server.profiler.run(plan, budget_s)
            except ProtocolError:
                self.server.costly.refund("profile", budget_s)  # refused before its runs (or stopped)
                raise
            self.server.costly.refund("profile", budget_s - spent)  # the rate counts what was spent
        except ProtocolError as exc:
            self.reply_error(request.id, exc.code, str(exc))
        except Exception as exc:
            log.exception("profile failed")
            self.reply_error(request.id, ErrorCode.INTERNAL, f"profile failed: {exc}")
        else:
            self.send_reply(ProfileReply(request.id, times))
        finally:
            self.server.costly.done(self)

    def settled(self) -> None:
        """A request in flight has been answered (or given up): read the connection again once
        half the in-flight slots are free."""
        self.in_flight -= 1
        if self.in_flight < self.server.config.max_in_flight // 2:
            self.resume("in_flight")

    def finish_infer(
        self, request: InferRequest, key: TailKey, received: float, deadline: float | None, done: Outcome
    ) -> None:
        """Reply with this request's slice of its batch, or the typed error it ended with; a chain's
        stage with a route passes the slice on to the next hop first (:meth:`forward`)."""
        if done is None:  # the host is shutting down; the connection goes with it
            self.settled()
            return
        if isinstance(done, ProtocolError):  # deadline passed in the queue, or the tail failed
            self.settled()
            self.reply_error(request.id, done.code, str(done))
            return
        if request.route:
            self.server.spawn(self.forward(request, key, received, deadline, done))
            return
        self.settled()
        # Counted before the reply leaves: whoever has the answer may read the stats at once.
        self.server.stats.served(key, done.queue_ms / 1000.0, done.compute_ms / 1000.0, time.perf_counter() - received)
        self.send_reply(InferReply(request.id, done.output, done.compute_ms, done.queue_ms, done.batch))

    async def forward(
        self, request: InferRequest, key: TailKey, received: float, deadline: float | None, done: BatchResult
    ) -> None:
        """Pass this stage's output on to the next hop (:meth:`~host_runtime._peers.Peers.forward`)
        and answer with the last stage's output and every hop's times, or the error the chain
        broke with, naming the hop."""
        try:
            output, hops = await self.server.peers.forward(request, done.output, deadline)
        except ProtocolError as exc:
            self.reply_error(request.id, exc.code, str(exc))
        else:
            self.server.stats.served(key, done.queue_ms / 1000.0, done.compute_ms / 1000.0, time.perf_counter() - received)
            self.send_reply(InferReply(request.id, output, done.compute_ms, done.queue_ms, done.batch, hops))
        finally:
            self.settled()


#: The dispatch table: one handler per request type of device_runtime.wire.ops.REQUESTS.
_HANDLERS: dict[type[Request], Callable[[_HostProtocol, Any, float], None]] = {
    HelloRequest: _HostProtocol.on_hello, InferRequest: _HostProtocol.on_infer, PingRequest: _HostProtocol.on_ping,
    StatsRequest: _HostProtocol.on_stats, ProfileRequest: _HostProtocol.on_profile, LinksRequest: _HostProtocol.on_links,
}


#: What stopping takes after the drain (cancelling, closing peers, the metrics, connections), at
#: most: the drain ends this much before the deadline, so the host is gone by it.
TEARDOWN_S = 0.5


def teardown_reserve(timeout: float) -> float:
    """The part of a drain timeout kept for the teardown: a tenth, at most :data:`TEARDOWN_S`."""
    return min(TEARDOWN_S, 0.1 * timeout)


@contextmanager
def _port_in_use(host: str, port: int, flag: str, address_flag: str = "--interface") -> Iterator[None]:
    """A port another process holds, or an address that is none of this machine's, becomes one
    line that says what to do, not a traceback."""
    try:
        yield
    except socket.gaierror as exc:
        raise SplitEdgeError(f"{address_flag} {host} is not an address: {exc.strerror}; give one of this machine's "
                             "addresses, or 0.0.0.0 for all") from None
    except OSError as exc:
        if exc.errno == errno.EADDRNOTAVAIL:
            raise SplitEdgeError(f"{address_flag} {host} is not an address of this machine; give one of its "
                                 "addresses, or 0.0.0.0 for all") from None
        if exc.errno != errno.EADDRINUSE:
            raise
        raise SplitEdgeError(
            f"port {port} on {host} is in use; stop the other host or pass {flag} 0 for a free one"
        ) from exc


class HostServer:
    """Serve the tails of a :class:`TailRegistry` on TCP until :meth:`close`."""

    def __init__(self, registry: TailRegistry, config: ServerConfig = ServerConfig()) -> None:
        self.registry = registry
        self.config = config
        self.tasks: set[asyncio.Future[None]] = set()
        self.executor = ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="tail")
        self.profiler = Profiler()
        self.budget = FrameBudget(config.max_partial_bytes)
        self.clock = time.monotonic  # the event loop's clock once started
        self.draining = False  # stopping: new infer and profile requests are refused
        self.stats = HostStats(  # the gauges read the batcher when collected
            connections=lambda: len(self.connections),
            in_flight=lambda: self.batcher.pending,
            queue_depth=lambda: self.batcher.queued,
        )
        batching = config.batching
        if batching.share is None:  # a worker's share of the queue: on the CPU, not on CUDA (BatchConfig.share)
            batching = replace(batching, share=registry.device != "cuda")
        self.batcher = Batcher(batching, self.executor, config.workers, on_batch=self.stats.batch_size.observe,
                               on_padding=self.stats.padded_samples.inc)
        self.frames_refused = PromCounter(
            PREFIX + "frames_refused", "Frames refused by authentication (each closes its connection), by reason.",
            ["reason"], registry=self.stats.registry,
        )
        for kind in REFUSAL_KINDS:
            self.frames_refused.labels(kind)
        # Which connections the host keeps: the caps, shedding, TLS handshakes, timeouts.
        self.admission = Admission(config, self.stats.registry, lambda: self.clock())
        PromGauge(PREFIX + "partial_frame_bytes", "Bytes held for frames still arriving, all connections (bounded "
                  "by max_partial_bytes).", registry=self.stats.registry).set_function(lambda: self.budget.held)
        # a chain's next hops, and the links to peers last measured
        self.peers = Peers(config.key, config.peers, forward_timeout=config.forward_timeout)
        # What profile and links requests may spend, all connections together (a burst of four requests).
        self.costly = CostlyWork({
            "profile": Rate(config.profile_rate, 4 * config.profile_budget_s, lambda: self.clock()),
            "links": Rate(config.links_rate, 4 * MAX_LINKS_REQUEST_BYTES, lambda: self.clock()),
        })
        self.metrics: MetricsEndpoint | None = None
        self._server: asyncio.AbstractServer | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._accept_failures: AcceptFailures | None = None

    @property
    def connections(self) -> set[_HostProtocol]:
        """The connections counted in (:class:`~host_runtime._admission.Admission`)."""
        return self.admission.connections

    @property
    def gate(self) -> ConnectionGate:
        """What the connections count, in all and per address."""
        return self.admission.gate

    def spawn(self, work: Any) -> None:
        """Run a request's coroutine as a task the shutdown waits for (within its deadline)."""
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def hello(self) -> dict[str, Any]:
        return {
            "protocol": PROTOCOL_VERSION,
            "bundles": self.registry.served(),
            "auth": self.config.key is not None,
            "max_frame_bytes": self.config.max_frame_bytes,
            "device": self.registry.device,
            "links": dict(self.peers.links),
            "profile_budget_ms": self.config.profile_budget_s * 1000,
        }

    def load(self) -> float:
        """Mean samples queued or running per worker since the previous call (the TXT record's ``load``)."""
        return self.batcher.load()

    def warm_up(self) -> int:
        """Run every tail once at each bucket size (``BatchConfig.buckets``), before serving: the GPU's
        algorithm search and allocations for each shape are done when the first request comes.
        Returns the runs made."""
        return sum(warm_up(tail, self.config.batching.buckets) for tail in self.registry.tails.values())

    async def start(self) -> tuple[str, int]:
        """Warm the buckets up, bind and listen; returns the bound address (port 0 picks a free port)."""
        loop = asyncio.get_running_loop()
        self.clock = loop.time
        if self.config.batching.buckets:
            await loop.run_in_executor(self.executor, self.warm_up)
        with _port_in_use(self.config.host, self.config.port, "--port"):
            self._server = await loop.create_server(
                lambda: _HostProtocol(self), self.config.host, self.config.port, reuse_address=True,
                reuse_port=self.config.reuse_port or None,  # TLS: started per connection (Admission.handshake)
            )
        host, port = self._server.sockets[0].getsockname()[:2]
        if self.config.metrics_port is not None:
            try:
                metrics_host = self.config.metrics_host
                token, note = endpoint_token(metrics_host, self.config.key, self.config.metrics_token)
                with _port_in_use(metrics_host, self.config.metrics_port, "--metrics-port", "--metrics-interface"):
                    self.metrics = self.stats.serve_http(metrics_host, self.config.metrics_port, token=token, note=note)
            except SplitEdgeError:
                self._server.close()
                raise
        self._accept_failures = AcceptFailures(loop.get_exception_handler())
        loop.set_exception_handler(self._accept_failures)
        self._watchdog = asyncio.ensure_future(self.admission.watch())
        # what a sample of each tail (and each coded option's decode and tail) costs, for profile's budget
        self.profiler.start_probing([*self.registry.tails.values(), *self.registry.coded.values()])
        return host, port

    async def close(self, deadline: float | None = None) -> None:
        """Stop accepting and refuse new work (``overloaded``), stop a profile within one tail
        run, let what is pending finish, then drop connections: one deadline
        (``shutdown_timeout``, ``--drain-timeout``) over all of it together, queued batches,
        chain hops, links and profiles alike (two 5 s waits one after the other once took 10.2 s),
        and the teardown after them. ``deadline`` (loop time): when the host must be stopped, the
        signal's time plus the drain timeout (the default counts from now); the drain ends
        :func:`teardown_reserve` before it (draining to the deadline itself took 5.1-5.2 s of 5, issue 45)."""
        self.draining = True
        if self._server is not None:
            self._server.close()
        if self._watchdog is not None:
            self._watchdog.cancel()
        self.admission.stop_handshakes()
        loop = asyncio.get_running_loop()
        timeout = self.config.shutdown_timeout
        end = loop.time() + timeout if deadline is None else deadline
        deadline = end - teardown_reserve(timeout)
        closing = [asyncio.ensure_future(self.batcher.close(timeout)), asyncio.ensure_future(self.profiler.close(timeout))]
        while True:  # a batch that ends meanwhile may start a hop: waited for within the same deadline
            pending = [task for task in (*closing, *self.tasks) if not task.done()]
            left = deadline - loop.time()
            if not pending or left <= 0:
                break
            await asyncio.wait(pending, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        leftover = [*closing, *self.tasks]
        for task in leftover:
            task.cancel()  # past the deadline: hops and links still waiting are dropped with their connections
        await asyncio.gather(*leftover, return_exceptions=True)
        await self.peers.close()
        if self.metrics is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.metrics.close)
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.close()
        if self._server is not None:
            await asyncio.wait_for(self._server.wait_closed(), max(end - loop.time(), 0.05))
        self.executor.shutdown(wait=False, cancel_futures=True)
        if self._accept_failures is not None:
            asyncio.get_running_loop().set_exception_handler(self._accept_failures.previous)
