"""How many connections the host keeps, from whom, and for how long.

Probing a running host found 500 slowloris and 1,000 idle connections kept for ever, and a
host at its file-descriptor limit resetting every new board without a word in its log. So a
connection is refused, with a log line naming the peer and the limit, past
``max_connections`` in all or ``max_connections_per_address`` from one address; and closed
when it has been idle (nothing read, nothing in flight) for ``idle_timeout`` seconds or has
left a frame unfinished for ``frame_timeout`` seconds. The defaults are far above what a
fleet of boards does (one connection per board, a frame every few hundred ms) and far below
what a host can hold. Time is the event loop's clock, so tests configure small timeouts.

A full connection table once locked boards out for the 300 s idle timeout, renewable with one
byte: so a connection that has not proven itself (no complete frame, or with a key no
handshake) must do so within ``first_frame_timeout`` seconds of connecting, and when the table
is full the oldest such connection is shed to make room. Proving oneself with one ``ping`` was
enough to lock boards out again (1,100 connections that each pinged once and went idle held
every slot, issue 45), so a full table with nobody unproven sheds the least recently active
connection of an address holding more than its fair share of the table
(:func:`beyond_fair_share`): a board alone on its address is never shed for another, a flood
from a few addresses makes room for new boards. Both orders are a :class:`ConnectionOrder`.
Work that a request buys beyond its own frame (``profile``'s tail runs, ``links``' payloads) is
metered host-wide by a :class:`Rate`, one such request at a time per connection (:class:`CostlyWork`).
"""

from __future__ import annotations

import logging
import resource
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from device_runtime.wire import ErrorCode
from splitedge.errors import ProtocolError

log = logging.getLogger("splitedge.host")

#: A fleet is tens of boards, each with one connection; 1024 leaves room for a large one and
#: for boards reconnecting while their old connection is not yet closed.
DEFAULT_MAX_CONNECTIONS = 1024
#: Boards behind one NAT share an address (a site's cameras reaching a host elsewhere); 256
#: lets such a fleet through while one machine cannot take more than a quarter of the host.
DEFAULT_MAX_CONNECTIONS_PER_ADDRESS = 256
#: A board streams a frame every few hundred ms; one idle for 5 minutes has stopped, and it
#: reconnects by itself when it starts again.
DEFAULT_IDLE_TIMEOUT_S = 300.0
#: A 64 MiB frame (the largest by default) takes 54 s at 10 Mbit/s; a board's cut, well under
#: a second on the slowest Wi-Fi.
DEFAULT_FRAME_TIMEOUT_S = 60.0
#: A board sends its hello (or handshake) as soon as it connects: a round trip, milliseconds.
DEFAULT_FIRST_FRAME_TIMEOUT_S = 10.0
#: Descriptors the host needs besides its connections: listening sockets, metrics, zeroconf,
#: onnxruntime's files, logs.
FD_HEADROOM = 64
#: One warning per this many seconds while accept() fails for want of descriptors.
ACCEPT_WARNING_PERIOD_S = 10.0


class ConnectionGate:
    """Counts connections in all and per address, and says why one may not be kept."""

    def __init__(self, max_connections: int, max_per_address: int) -> None:
        self.max_connections = max_connections
        self.max_per_address = max_per_address
        self.total = 0
        self.per_address: Counter[str] = Counter()

    def admit(self, address: str) -> tuple[str, str] | None:
        """Count a connection from ``address`` and return None, or return why it is refused
        (a metric label and a sentence for the log)."""
        if self.total >= self.max_connections:
            return "max_connections", f"{self.total} connections open (--max-connections {self.max_connections})"
        if self.per_address[address] >= self.max_per_address:
            return "max_connections_per_address", (
                f"{self.per_address[address]} connections from {address} open "
                f"(--max-connections-per-address {self.max_per_address})"
            )
        self.total += 1
        self.per_address[address] += 1
        return None

    def leave(self, address: str) -> None:
        self.total -= 1
        self.per_address[address] -= 1
        if not self.per_address[address]:
            del self.per_address[address]


class ConnectionOrder:
    """Connections in an order a full table sheds by: the oldest (or least recently :meth:`touch`ed) first."""

    def __init__(self) -> None:
        self._order: OrderedDict[Any, None] = OrderedDict()

    def add(self, connection: Any) -> None:
        self._order[connection] = None

    def touch(self, connection: Any) -> None:
        """``connection`` did something now: last in the order (added if it was not in it)."""
        self._order[connection] = None
        self._order.move_to_end(connection)

    def discard(self, connection: Any) -> None:
        self._order.pop(connection, None)

    def oldest(self) -> Any | None:
        return next(iter(self._order), None)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._order)

    def __contains__(self, connection: Any) -> bool:
        return connection in self._order

    def __len__(self) -> int:
        return len(self._order)


#: How many of the least recently active connections a full table looks through for one to shed:
#: a flood of busy connections costs each new connection this many steps at most, not the table.
SHED_SCAN = 256


def beyond_fair_share(recent: ConnectionOrder, gate: ConnectionGate, address: str,
                      busy: Callable[[Any], bool]) -> Any | None:
    """The connection a full table sheds for a new one from ``address``: the least recently active
    (of the first :data:`SHED_SCAN`) that is not ``busy`` (requests in flight, a frame arriving)
    and whose address holds more than its fair share, the table split evenly among the addresses
    connected and the new one. None: nobody holds more than their share, and the new one is refused."""
    addresses = len(gate.per_address) + (address not in gate.per_address)
    fair = max(gate.max_connections // addresses, 1)
    for _, connection in zip(range(SHED_SCAN), recent):
        if gate.per_address[connection.address] > fair and not busy(connection):
            return connection
    return None


class Rate:
    """A host-wide allowance that refills at ``per_second`` up to ``burst`` (a token bucket):
    what ``profile`` and ``links`` requests may spend, all connections together."""

    def __init__(self, per_second: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_second, self.burst, self.clock = per_second, burst, clock
        self._level, self._at = burst, clock()

    def take(self, amount: float) -> bool:
        """Spend ``amount`` if the allowance covers it now (False: spend nothing)."""
        now = self.clock()
        self._level = min(self.burst, self._level + (now - self._at) * self.per_second)
        self._at = now
        if amount > self._level:
            return False
        self._level -= amount
        return True

    def refund(self, amount: float) -> None:
        """Give back what was taken and not spent."""
        self._level = min(self.burst, self._level + amount)


class CostlyWork:
    """What ``profile`` and ``links`` requests may spend beyond their own frame: each op's host-wide
    :class:`Rate` (all connections together), and one such request in progress per connection."""

    def __init__(self, rates: dict[str, Rate]) -> None:
        self.rates = rates  # op -> what its requests may spend
        self.running: dict[Any, str] = {}  # connection -> the op of its request in progress

    def admit(self, connection: Any, op: str, cost: float, request_id: Any = None) -> None:
        """Take an ``op`` request of ``connection`` if it has none in progress and the host's rate
        for ``op`` covers ``cost`` now; else raise ``overloaded`` (retry later)."""
        running = self.running.get(connection)
        if running is not None:
            reason = f"a {running} request of this connection is in progress; one at a time per connection"
        elif not self.rates[op].take(cost):
            reason = f"this host's rate for {op} requests is spent (all connections together); retry in a few seconds"
        else:
            self.running[connection] = op
            return
        raise ProtocolError(reason, ErrorCode.OVERLOADED, request_id)

    def holds(self, connection: Any) -> bool:
        """``connection`` has a request of this kind in progress."""
        return connection in self.running

    def done(self, connection: Any) -> None:
        """``connection``'s request in progress ended (answered, refused or stopped)."""
        self.running.pop(connection, None)

    def refund(self, op: str, amount: float) -> None:
        """Give back to ``op``'s rate what was taken and not spent."""
        self.rates[op].refund(amount)


@dataclass
class Activity:
    """When a connection opened and last read, and since when it has a frame unfinished (loop time)."""

    last_read: float
    frame_since: float | None = None
    opened: float = 0.0

    def read(self, now: float, frame_open: bool, frames_completed: bool) -> None:
        """Bytes were read; ``frame_open``: a frame is unfinished now; ``frames_completed``: this
        read finished at least one, so the unfinished one began now."""
        self.last_read = now
        if not frame_open:
            self.frame_since = None
        elif self.frame_since is None or frames_completed:
            self.frame_since = now

    def resumed(self, now: float) -> None:
        """Reading starts again after the host paused it: the time paused is the host's, not the peer's."""
        self.last_read = now
        if self.frame_since is not None:
            self.frame_since = now

    def expired(self, now: float, idle_timeout: float, frame_timeout: float, busy: bool,
                first_frame_timeout: float | None = None) -> tuple[str, str] | None:
        """Why the connection should be closed now, as a metric label and a sentence for the log
        (None: it should not). ``busy``: requests of it in flight, which it may wait for in silence;
        ``first_frame_timeout``: the connection has not proven itself, and must within this long of opening."""
        if first_frame_timeout is not None and now - self.opened > first_frame_timeout:
            return "first_frame_timeout", (f"no complete frame {now - self.opened:.1f} s after connecting "
                                           f"(--first-frame-timeout {first_frame_timeout:g})")
        if self.frame_since is not None and now - self.frame_since > frame_timeout:
            return "frame_timeout", (f"a frame begun {now - self.frame_since:.1f} s ago is unfinished "
                                     f"(--frame-timeout {frame_timeout:g})")
        if self.frame_since is None and not busy and now - self.last_read > idle_timeout:
            return "idle_timeout", f"idle for {now - self.last_read:.1f} s (--idle-timeout {idle_timeout:g})"
        return None


def fit_fd_limit(max_connections: int) -> tuple[int, str | None]:
    """Raise this process's soft descriptor limit towards what ``max_connections`` needs.

    Returns the connections the limit allows (``max_connections`` or fewer) and, if fewer, a
    warning: past the limit accept() fails and a new board is reset without a word, so the
    cap is lowered to where the host still refuses with a log line.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max_connections + FD_HEADROOM
    if soft != resource.RLIM_INFINITY and soft < wanted:
        raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError):
            pass
    allowed = max_connections if soft == resource.RLIM_INFINITY else min(max_connections, soft - FD_HEADROOM)
    if allowed >= max_connections:
        return max_connections, None
    allowed = max(allowed, 1)
    return allowed, (f"warning: the file-descriptor limit ({soft}) allows {allowed} connections, not "
                     f"--max-connections {max_connections}; raise it (ulimit -n {wanted}) or lower --max-connections")


class AcceptFailures:
    """A loop exception handler that turns asyncio's "socket.accept() out of system resource"
    (logged once per failed accept, hundreds a second) into one warning per period that says
    what to do; anything else goes to the handler that was there before."""

    MESSAGE = "socket.accept() out of system resource"

    def __init__(self, previous: Callable[[Any, dict[str, Any]], None] | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.previous = previous
        self.clock = clock
        self.failed = 0  # accept() failures since the last warning
        self._warned = -ACCEPT_WARNING_PERIOD_S

    def __call__(self, loop: Any, context: dict[str, Any]) -> None:
        if context.get("message") != self.MESSAGE:
            if self.previous is not None:
                self.previous(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        self.failed += 1
        now = self.clock()
        if now - self._warned >= ACCEPT_WARNING_PERIOD_S:
            log.warning("cannot accept connections: %s (%d failed accepts); new boards are refused until "
                        "connections close: raise the descriptor limit (ulimit -n) or lower --max-connections",
                        context.get("exception"), self.failed)
            self._warned, self.failed = now, 0
