"""Which connections the host keeps: :class:`Admission`, the walls of :mod:`host_runtime._limits`
applied to the connections of one :class:`~host_runtime._server.HostServer`.

A new connection is counted in or refused at accept (said in the clear, so that a board reports
the limit instead of guessing at a lost connection); a full table first sheds its oldest
connection that has not proven itself, else the least recently active one of an address beyond
its fair share (:func:`~host_runtime._limits.beyond_fair_share`). Under TLS the handshake is the
connection's first frame, run here within ``--first-frame-timeout`` and counted against the caps
from accept. A watchdog closes connections idle, with a frame unfinished, or unproven too long.
The server's protocol reads, dispatches and replies; it tells this object when a connection was
made, read from, or lost.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from functools import partial
from typing import TYPE_CHECKING, Any, Callable

from prometheus_client import CollectorRegistry, Counter as PromCounter

from device_runtime.wire import ErrorCode, FramedProtocol, accept_tls, encode_message
from device_runtime.wire.ops import ErrorReply
from host_runtime._limits import ConnectionGate, ConnectionOrder, beyond_fair_share
from host_runtime._metrics import PREFIX

if TYPE_CHECKING:  # the server imports this module
    from host_runtime._server import ServerConfig

log = logging.getLogger("splitedge.host")

#: Every reason a connection is refused or closed by the host itself (the metric's labels, all shown from the start).
CLOSE_REASONS = ("max_connections", "max_connections_per_address", "idle_timeout", "frame_timeout",
                 "first_frame_timeout", "shed", "shed_beyond_share", "tls_handshake", "frame_evicted")


class Admission:
    """The host's connection table: counts connections in (or refuses them), sheds for new ones
    when full, forgets them however they end, runs their TLS handshakes and closes them past
    their timeouts. A connection is the server's protocol: it has an ``address``, a
    ``transport`` (None until its framing starts), a ``handshaking`` transport under TLS, its
    ``activity``, ``decoder`` and ``pauses``, ``working`` (requests in flight, a profile or links
    running) and ``send_reply``."""

    def __init__(self, config: ServerConfig, registry: CollectorRegistry, clock: Callable[[], float]) -> None:
        self.config = config
        self.clock = clock  # the event loop's clock once the server started
        self.connections: set[Any] = set()  # every connection counted in
        self.gate = ConnectionGate(config.max_connections, config.max_connections_per_address)
        self.unproven = ConnectionOrder()  # connections with no complete frame (or handshake) yet, oldest first
        self.recent = ConnectionOrder()  # every connection, least recently read from first
        self.handshakes: set[asyncio.Future[None]] = set()  # TLS handshakes running (cancelled when stopping)
        self.connections_closed = PromCounter(
            PREFIX + "connections_closed", "Connections the host refused or closed itself, by the limit that did it.",
            ["reason"], registry=registry,
        )
        for kind in CLOSE_REASONS:
            self.connections_closed.labels(kind)

    def admit(self, connection: Any, transport: asyncio.BaseTransport) -> bool:
        """Count a new connection in (True), or refuse it (False: said and closed). A full table
        first sheds its oldest connection that has not proven itself (of an address beyond its fair
        share where there is one), else the least recently
        active one of an address beyond its fair share (:func:`~host_runtime._limits.beyond_fair_share`):
        neither idle sockets nor connections that pinged once can lock boards out."""
        if self.gate.total >= self.gate.max_connections:
            self._shed(connection.address)
        refusal = self.gate.admit(connection.address)
        if refusal is None:
            self.connections.add(connection)
            self.unproven.add(connection)
            self.recent.touch(connection)
            return True
        kind, reason = refusal
        self.connections_closed.labels(kind).inc()
        log.warning("refused a connection from %s: %s", transport.get_extra_info("peername"), reason)
        # Said in the clear, before any handshake, so that a device (with a key or without)
        # reports the limit instead of guessing at a lost connection; no worse than a reset.
        # Under TLS the refusal comes before the handshake (a handshake is what the caps bound):
        # the device reads it as a handshake that failed, and its log names the host.
        transport.writelines(encode_message(ErrorReply(None, ErrorCode.OVERLOADED, f"refused the connection: {reason}")))
        transport.close()
        return False

    def _shed(self, address: str) -> None:
        # The oldest unproven of an address beyond its share first: a flood of connections that
        # never finish their handshake sheds its own, not a board alone on its address whose
        # handshake a busy host has not got round to yet (a TLS board during a flood was shed).
        victim = beyond_fair_share(self.unproven, self.gate, address, _never_busy) or self.unproven.oldest()
        if victim is not None:
            kind, why = "shed", "it sent no complete frame yet"
        else:
            victim = beyond_fair_share(self.recent, self.gate, address, _busy)
            if victim is None:
                return
            kind, why = "shed_beyond_share", (f"it was the least recently active of the {self.gate.per_address[victim.address]} "
                                              f"from {victim.address}, more than that address's share")
        self.forget(victim)
        self.connections_closed.labels(kind).inc()
        reason = f"the table is full (--max-connections {self.gate.max_connections}) and {why}"
        log.info("shed the connection from %s: %s", victim.address, reason)
        if victim.transport is not None:  # said first, as to a connection refused: the board reports it and reconnects
            victim.send_reply(ErrorReply(None, ErrorCode.OVERLOADED, f"closed the connection: {reason}"))
            victim.transport.close()
        elif victim.handshaking is not None:
            victim.handshaking.abort()

    def read_from(self, connection: Any) -> None:
        """``connection`` was read from: last in the order a full table sheds by, and proven once it
        has sent a complete frame (with a key, once its handshake is done)."""
        self.recent.touch(connection)
        if connection.frames_read and (connection.auth is None or connection.auth.established):
            self.unproven.discard(connection)

    def forget(self, connection: Any) -> None:
        """Out of the host's tables and counts (once, however the connection ended)."""
        self.unproven.discard(connection)
        self.recent.discard(connection)
        if connection in self.connections:
            self.connections.discard(connection)
            self.gate.leave(connection.address)

    def handshake(self, connection: Any, transport: asyncio.Transport, tls: ssl.SSLContext) -> None:
        """Run ``connection``'s TLS handshake as a task the shutdown cancels (it is no work in flight).

        The handshake is the connection's first frame: counted against the caps from accept and
        bounded by --first-frame-timeout (asyncio's own TLS server counted a connection only once
        its handshake was done and gave it 60 s: 5,000 that never finished held 4,677 descriptors
        outside every cap, issue 45)."""
        connection.handshaking = transport
        task = asyncio.ensure_future(self._upgrade(connection, transport, tls))
        self.handshakes.add(task)
        task.add_done_callback(self.handshakes.discard)

    async def _upgrade(self, connection: Any, transport: asyncio.Transport, tls: ssl.SSLContext) -> None:
        """Run the TLS handshake on ``transport`` within what is left of the first-frame timeout,
        then read frames from the TLS transport; a handshake that fails or times out closes the
        connection and frees its place (one line in the log at debug: a scanner's probe is no news)."""
        left = self.config.first_frame_timeout - (self.clock() - connection.activity.opened)
        try:
            # made: the framed protocol's connection_made; admission was done at accept
            await accept_tls(transport, connection, tls, max(left, 1e-3), made=partial(FramedProtocol.connection_made, connection))
        except (OSError, ssl.SSLError, asyncio.TimeoutError) as exc:
            self.connections_closed.labels("tls_handshake").inc()
            log.debug("closed the connection from %s: TLS handshake failed (%s)", connection.address, exc or type(exc).__name__)
            self.forget(connection)
        except asyncio.CancelledError:  # the host is stopping
            transport.abort()
            self.forget(connection)
            raise
        finally:
            connection.handshaking = None

    def stop_handshakes(self) -> None:
        for task in list(self.handshakes):
            task.cancel()

    async def watch(self) -> None:
        """Close connections idle or with a frame unfinished past their timeouts; checked every
        quarter of the shorter timeout, so a connection is closed at most a quarter late."""
        config = self.config
        period = min(config.idle_timeout, config.frame_timeout, config.first_frame_timeout) / 4
        while True:
            await asyncio.sleep(period)
            now = self.clock()
            for connection in list(self.connections):
                self.check_timeouts(connection, now)

    def check_timeouts(self, connection: Any, now: float) -> None:
        """Close ``connection`` if it has been idle, left a frame unfinished, or sent no complete
        frame, too long. Not while the host holds it paused for its own work (requests in flight):
        that wait is the host's; a wait for memory is the frame's."""
        transport = connection.transport
        if connection.pauses - {"budget"} or transport is None or transport.is_closing():
            return
        config = self.config
        first = config.first_frame_timeout if connection in self.unproven else None
        expired = connection.activity.expired(now, config.idle_timeout, config.frame_timeout,
                                              busy=connection.working, first_frame_timeout=first)
        if expired is None:
            return
        kind, reason = expired
        self.connections_closed.labels(kind).inc()
        peer = transport.get_extra_info("peername")
        log.log(logging.INFO if kind == "idle_timeout" else logging.WARNING, "closed the connection from %s: %s", peer, reason)
        transport.close()


def _busy(connection: Any) -> bool:
    """Requests in flight, a profile or links running, or a frame arriving: not to be shed."""
    return bool(connection.working or not connection.decoder.idle)


def _never_busy(connection: Any) -> bool:
    """A connection that has not proven itself has nothing in flight to lose."""
    return False
