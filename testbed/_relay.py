"""The user-space relay: one-way latency for a TCP connection, and optionally a rate limit.

The kernel we run on has no ``netem``, so latency is added here; the token bucket per
direction is the fallback for machines where the kernel link is unavailable.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import socket
import time
from types import TracebackType

from testbed._kernel_link import _COMMAND_TIMEOUT_S, FRAME_BYTES, _checked_rate

#: Stop reading a direction while this many bytes wait for their release time.
MAX_BUFFERED_BYTES = 8 << 20
_READ_BYTES = 1 << 16
#: The user-space bucket holds this long of bytes: enough to absorb event-loop wake-up jitter.
_BUCKET_S = 0.01


class _TokenBucket:
    """Rate limit for one direction of a :class:`DelayRelay`; reads the relay's current rate.

    The time the event loop oversleeps a chunk's debt is credited to the next chunks: the link
    was sending the bytes that waited meanwhile, it was not idle. Without the credit a starved
    loop moved about one 10 ms bucket a wake-up: with the loop blocked 100 ms a turn a 0.5 Mbit/s
    link carried 0.08 Mbit/s, and beside busy processes an upload through it timed out at 10 s.
    """

    def __init__(self, relay: DelayRelay) -> None:
        self._relay = relay
        self._tokens = 0.0
        self._stamp = time.monotonic()
        self._late = 0.0  # seconds the last debt's sleep overran

    def _available(self, rate: float, now: float) -> float:
        """Bytes the link may carry now: the bucket, refilled since the last chunk, holds at most
        ``_BUCKET_S`` of bytes beyond what an overslept debt owes."""
        capacity = max(rate * _BUCKET_S, FRAME_BYTES) + self._late * rate
        return min(capacity, self._tokens + (now - self._stamp) * rate)

    def read_size(self) -> int:
        rate = self._relay._bytes_per_s
        if rate is None:
            return _READ_BYTES
        return max(FRAME_BYTES, min(_READ_BYTES, int(self._available(rate, time.monotonic()))))

    async def take(self, nbytes: int) -> None:
        """Spend ``nbytes`` of tokens, sleeping off any debt: the chunk's serialisation time."""
        rate = self._relay._bytes_per_s
        now = time.monotonic()
        if rate is None:
            self._tokens, self._stamp, self._late = 0.0, now, 0.0
            return
        self._tokens = self._available(rate, now) - nbytes
        self._stamp, self._late = now, 0.0
        if self._tokens < 0:
            debt_s = -self._tokens / rate
            await asyncio.sleep(debt_s)
            self._late = max(0.0, time.monotonic() - now - debt_s)


class _Direction:
    """One direction of one relayed connection: read, rate-limit, hold until due, write.

    Reading and writing are two tasks joined by a queue of ``(due time, chunk)``, so while
    one chunk waits out its delay the next ones are already being read: a pipeline whose
    throughput does not depend on the delay. An empty chunk is the peer's close, delayed too.
    """

    def __init__(self, relay: DelayRelay, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._relay = relay
        self._reader = reader
        self._writer = writer
        self._queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self._queued = 0
        self._arrived = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._bucket = _TokenBucket(relay)

    async def run(self) -> None:
        """Relay until the source closes (after delivering its last byte) or a socket fails."""
        reading = asyncio.create_task(self._read())
        try:
            await self._write()
        finally:
            reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reading
            self._relay._buffered -= self._queued
            self._queued = 0

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                await self._room.wait()
                chunk = await self._reader.read(self._bucket.read_size())
                if chunk:
                    await self._bucket.take(len(chunk))
                self._queue.append((loop.time() + self._relay._delay_s, chunk))
                self._queued += len(chunk)
                self._relay._buffered += len(chunk)
                if self._queued >= self._relay.max_buffered_bytes:
                    self._room.clear()
                self._arrived.set()
                if not chunk:
                    return
        except OSError:  # the source's socket failed: deliver what we have, then close
            self._queue.append((loop.time(), b""))
            self._arrived.set()

    async def _write(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._queue:
                self._arrived.clear()
                await self._arrived.wait()
            due, chunk = self._queue[0]
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            self._queue.popleft()
            if not chunk:
                return
            self._writer.write(chunk)
            await self._writer.drain()
            self._queued -= len(chunk)
            self._relay._buffered -= len(chunk)
            if self._queued < self._relay.max_buffered_bytes:
                self._room.set()


def _no_delay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:  # small messages must not wait for Nagle: we add the latency, TCP must not
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def _close(writer: asyncio.StreamWriter) -> None:
    """Close, letting written bytes drain for a second; a peer that reads nothing gets a reset."""
    writer.close()
    try:
        await asyncio.wait_for(writer.wait_closed(), 1.0)
    except asyncio.TimeoutError:
        writer.transport.abort()
    except OSError:
        pass  # the socket had failed already: it is closed all the same


class DelayRelay:
    """A TCP relay adding ``delay_ms`` of one-way latency each way, optionally rate-limited.

    Clients connect to the address :meth:`start` returns; each connection is relayed to
    ``target``. Bytes read at time t are written at t + delay, in order, while more are read
    (throughput is not one message per round trip). A direction stops reading while
    :attr:`max_buffered_bytes` wait, so a stalled receiver pushes back on the sender as TCP
    would. When either side closes, the other is closed once the data before the close has
    been delivered (half-close is not forwarded). :meth:`set_delay` and :meth:`set_rate`
    apply to data read from then on.

    ``rate_mbit`` is a user-space token bucket per direction, applied when data is read (its
    serialisation) before the delay (its propagation): the fallback for machines where
    :class:`EmulatedLink` is unavailable. It counts payload bytes only, not TCP/IP headers,
    and never drops, so prefer the kernel's tbf when it is available.
    """

    def __init__(self, target: tuple[str, int], delay_ms: float, listen: tuple[str, int] = ("127.0.0.1", 0),
                 rate_mbit: float | None = None, max_buffered_bytes: int = MAX_BUFFERED_BYTES) -> None:
        self.target = target
        self.listen = listen
        self.max_buffered_bytes = max_buffered_bytes
        self._delay_s = 0.0
        self._bytes_per_s: float | None = None
        self.set_delay(delay_ms)
        self.set_rate(rate_mbit)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._buffered = 0

    @property
    def delay_ms(self) -> float:
        return self._delay_s * 1000

    @property
    def rate_mbit(self) -> float | None:
        return None if self._bytes_per_s is None else self._bytes_per_s * 8 / 1e6

    @property
    def buffered_bytes(self) -> int:
        """Bytes read and not yet written, over every connection: bounded by the back-pressure."""
        return self._buffered

    def set_delay(self, delay_ms: float) -> None:
        """One-way delay for data read from now on (data already waiting keeps its time, order is kept)."""
        if not math.isfinite(delay_ms) or delay_ms < 0:
            raise ValueError(f"delay_ms must be a finite number >= 0, not {delay_ms!r}")
        self._delay_s = delay_ms / 1000

    def set_rate(self, rate_mbit: float | None) -> None:
        """Per-direction user-space rate limit for data read from now on; ``None`` removes it."""
        rate = _checked_rate(rate_mbit)
        self._bytes_per_s = None if rate is None else rate * 1e6 / 8

    async def start(self) -> tuple[str, int]:
        """Listen and return the address clients should connect to."""
        if self._server is not None:
            raise RuntimeError("the relay is already started")
        self._server = await asyncio.start_server(self._handle, *self.listen)
        host, port = self._server.sockets[0].getsockname()[:2]
        return host, port

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None, "asyncio runs connection callbacks in a task"
        self._connections.add(task)
        try:
            try:
                upstream_reader, upstream_writer = await asyncio.wait_for(
                    asyncio.open_connection(*self.target), _COMMAND_TIMEOUT_S)
            except (OSError, asyncio.TimeoutError):  # target down: the client sees its connection closed
                await _close(client_writer)
                return
            _no_delay(client_writer)
            _no_delay(upstream_writer)
            directions = [asyncio.create_task(_Direction(self, client_reader, upstream_writer).run()),
                          asyncio.create_task(_Direction(self, upstream_reader, client_writer).run())]
            try:
                await asyncio.wait(directions, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for direction in directions:
                    direction.cancel()
                # A socket that failed in a write ends its direction with OSError: the link broke,
                # which closing both sides already reports to each peer.
                await asyncio.gather(*directions, return_exceptions=True)
                await asyncio.gather(_close(client_writer), _close(upstream_writer))
        except asyncio.CancelledError:
            # close() ends the connection: the handler returns, since Python 3.11's streams log a
            # connection handler that ends cancelled as an error ("Exception in callback ...").
            return
        finally:
            self._connections.discard(task)

    async def close(self) -> None:
        """Stop listening and close every relayed connection, bounded in time."""
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            self._server = None
        connections = list(self._connections)
        for task in connections:
            task.cancel()
        if connections:
            await asyncio.wait(connections, timeout=2.0)

    async def __aenter__(self) -> DelayRelay:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    @property
    def address(self) -> tuple[str, int]:
        """Where clients connect (after :meth:`start`)."""
        if self._server is None:
            raise RuntimeError("the relay is not started")
        host, port = self._server.sockets[0].getsockname()[:2]
        return host, port
