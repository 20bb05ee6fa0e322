"""HTTP with walls, for observers: one thread, one selector, every connection bounded.

The live pages (:mod:`device_runtime.live._server`) and the host's Prometheus endpoint
(``host_runtime._metrics_http``) are observation, never the data path, and are served alike
(issue 45: ``http.server``'s thread per connection let 12 pollers take a board from 23 to
3.3 fps, 16 slow senders lock a page out, and every reset log a traceback):

- **one thread** serves every connection from a selector; a connection costs a socket and a few
  bytes, never a thread;
- **at most** ``max_connections`` are open; a new one past that sheds the oldest still sending its
  request (a flood of idle sockets cannot lock an observer out), or is closed if none is;
- **one deadline per request**, ``request_timeout`` from accept to the last byte answered,
  whatever arrives meanwhile (a header byte every few seconds does not extend it); a stream
  (Server-Sent Events) is dropped once its client has read nothing of what it was sent for
  ``stall_timeout``;
- a request (line and headers) of at most ``max_request_bytes``, else 431; no body is read;
- the thread takes at most ``max_duty`` of the time (it rests after each turn in proportion to the
  time the turn took, by the wall clock: on a core it shares, a turn's CPU time understates how
  long it held the GIL, and a board left half a core lost twice its duty to its own page), so
  observers in a loop cannot take the GIL from the data path;
- a reset, a refused or a shed connection is one debug line at most, never a traceback;
- tokens are compared in constant time as bytes (:meth:`WalledServer.token_matches`): a token of any bytes is
  one more mismatch, not an error.

A server subclasses :class:`WalledServer` and answers each whole request in :meth:`~WalledServer.handle`
with :meth:`~WalledServer.answer` (then the connection closes) or :meth:`~WalledServer.open_stream`
and :meth:`~WalledServer.push`; :meth:`~WalledServer.tick` runs once per turn for what streams need.
"""

from __future__ import annotations

import hmac
import logging
import math
import select
import selectors
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

__all__ = ["HttpConnection", "HttpRequest", "WalledServer", "Walls"]

MAX_REQUEST_BYTES = 8192  # request line and headers
_POLL_S = 0.25  # the longest the thread sleeps with connections open (an injected clock is read this often)
_ACCEPTS_PER_WAKE = 64
_MAX_REST_S = 2.0
_MAX_STREAM_READ = 65536  # what a stream's client sends is read and dropped, at most this a turn
REASONS = {200: "OK", 204: "No Content", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
           404: "Not Found", 405: "Method Not Allowed", 431: "Request Header Fields Too Large",
           500: "Internal Server Error", 503: "Service Unavailable"}


class HttpConnection:
    """One client: its deadline (accept + the request timeout; for a stream, while what it was
    sent is unread), what it sent so far, what it is still to be sent."""

    __slots__ = ("sock", "deadline", "inbox", "outbox", "answered", "stream", "cursor", "sent_at")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.inbox = bytearray()
        self.outbox = memoryview(b"")
        self.answered = False
        self.stream = False  # kept open after its answer's head, fed by push()
        self.cursor: int | None = None  # a stream's: where its next event starts
        self.sent_at = -math.inf  # a stream's: when it was last pushed an event


@dataclass(frozen=True)
class HttpRequest:
    """A whole request's head, as bytes: nothing in it is decoded, so nothing in it can fail to."""

    method: bytes
    path: bytes
    query: bytes
    headers: tuple[tuple[bytes, bytes], ...]  # (name lower-cased, value stripped), in order

    def header(self, name: bytes) -> bytes | None:
        return next((value for key, value in self.headers if key == name), None)

    def params(self, name: bytes) -> list[bytes]:
        """Every value of query parameter ``name``, percent-decoded to bytes."""
        values = []
        for part in self.query.split(b"&"):
            key, _, value = part.partition(b"=")
            if key == name:
                values.append(unquote_to_bytes(value.replace(b"+", b" ")))
        return values


@dataclass(frozen=True)
class Walls:
    """What a walled server holds to, all in one value (each server's constants are its defaults)."""

    max_connections: int  # open at once; past it the oldest unanswered is shed, else the new one closed
    request_timeout: float  # s from accept to the answer's last byte, whatever the client sends meanwhile
    max_duty: float  # the share of the time (and of the GIL) the thread may take
    stall_timeout: float = math.inf  # s a stream may read nothing before it is dropped
    max_request_bytes: int = MAX_REQUEST_BYTES  # request line and headers
    max_streams: int = 0  # event streams open at once
    events_hz: float = 10.0  # events a second a stream is sent at most

    def __post_init__(self) -> None:
        assert self.max_connections >= 1 and self.request_timeout > 0 and self.stall_timeout > 0
        assert self.max_request_bytes > 0 and 0 < self.max_duty <= 1 and self.max_streams >= 0 and self.events_hz > 0


class WalledServer:
    """Serves ``address:port`` (port 0 picks a free one) from one thread until :meth:`close`, held
    to ``walls``. ``clock`` (seconds) times the deadlines (tests inject one); rests are on the real clock."""

    def __init__(self, address: str, port: int, *, name: str, log: logging.Logger, walls: Walls,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name, self.log = name, log
        self.walls = walls
        self.max_connections = walls.max_connections
        self.request_timeout = walls.request_timeout
        self.stall_timeout = walls.stall_timeout
        self.max_request_bytes = walls.max_request_bytes
        self.max_duty = walls.max_duty
        self.busy_s = 0.0  # time the thread spent in its turns (its rests are 1 / max_duty - 1 times this)
        self.clock = clock
        # What it did, for tests and logs: connections shed for a new one, refused (the table full
        # of answers being written), closed at their deadline, streams dropped for not reading.
        self.shed = self.refused = self.timed_out = self.stalled = 0
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((address.strip("[]"), port))
            self._listener.listen(128)
        except BaseException:
            self._listener.close()
            raise
        self._listener.setblocking(False)
        self.server_address: tuple[str, int] = self._listener.getsockname()[:2]
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._accept_paused_until: float | None = None
        self._connections: OrderedDict[socket.socket, HttpConnection] = OrderedDict()  # in accept order
        self._closing = False
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    @staticmethod
    def token_matches(candidates: Iterable[bytes], token: bytes) -> bool:
        """Whether any of the first eight candidates is ``token``, each compared in constant time
        as bytes (a non-ASCII candidate is one more mismatch, never an error)."""
        good = False
        for n, candidate in enumerate(candidates):
            if n == 8:
                break
            good |= hmac.compare_digest(candidate, token)
        return good

    def start(self) -> None:
        """Start serving (a subclass calls it once it is ready to answer)."""
        self.thread.start()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    @property
    def streams(self) -> list[HttpConnection]:
        return [c for c in self._connections.values() if c.stream]

    def close(self) -> None:
        """Stop: every connection closes, then the listening socket; the thread ends within a turn."""
        self._closing = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self.thread.is_alive() and self.thread is not threading.current_thread():
            self.thread.join(5.0)
        elif not self.thread.is_alive() and self.thread.ident is None:
            self._shut()

    # -- what a subclass gives ----------------------------------------------------------------------

    def handle(self, connection: HttpConnection, request: HttpRequest, now: float) -> None:
        """Answer one whole request: :meth:`answer`, or :meth:`open_stream`."""
        raise NotImplementedError

    def tick(self, now: float) -> float | None:
        """Once a turn, after the events: push to streams. Returns the seconds until it wants the
        next turn (None: only when something happens)."""
        return None

    # -- what a subclass uses -----------------------------------------------------------------------

    def answer(self, connection: HttpConnection, status: int, body: bytes, *, content_type: bytes = b"text/plain; "
               b"charset=utf-8", headers: bytes = b"", head_only: bool = False) -> None:
        """The whole answer, then the connection closes (no keep-alive: one request per connection)."""
        head = (f"HTTP/1.1 {status} {REASONS[status]}\r\n".encode() + b"Content-Type: " + content_type + b"\r\n"
                + f"Content-Length: {len(body)}\r\n".encode() + headers + b"Connection: close\r\n\r\n")
        connection.answered = True
        connection.inbox = bytearray()
        connection.outbox = memoryview(head if head_only else head + body)
        self._selector.modify(connection.sock, selectors.EVENT_WRITE, connection)
        self._send(connection, self.clock())

    def open_stream(self, connection: HttpConnection, content_type: bytes, headers: bytes, now: float) -> None:
        """Answer with a head and keep the connection for :meth:`push`, with no deadline but
        ``stall_timeout`` for each push to be read."""
        connection.answered = connection.stream = True
        connection.inbox = bytearray()
        self.push(connection, b"HTTP/1.1 200 OK\r\nContent-Type: " + content_type + b"\r\n" + headers
                  + b"Connection: close\r\n\r\n", now)

    def push(self, connection: HttpConnection, data: bytes, now: float) -> bool:
        """Send ``data`` on a stream; False (nothing sent) while what it was sent before is unread."""
        if connection.outbox:
            return False
        connection.outbox = memoryview(data)
        connection.deadline = now + self.stall_timeout
        self._selector.modify(connection.sock, selectors.EVENT_WRITE, connection)
        self._send(connection, now)
        return True

    # -- the thread ---------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            wanted: float | None = None
            while not self._closing:
                events = self._selector.select(self._timeout(wanted))
                turn = time.monotonic()
                now = self.clock()
                # The connections first, the new ones last: a request already here is answered
                # before a newcomer can shed it.
                events.sort(key=lambda event: event[0].fileobj is self._listener)
                for key, mask in events:
                    if key.fileobj is self._listener:
                        self._accept(now)
                    elif key.fileobj is self._wake_r:
                        try:
                            self._wake_r.recv(64)
                        except OSError:
                            pass
                    elif mask & selectors.EVENT_WRITE:
                        self._send(key.data, now)
                    else:
                        self._receive(key.data, now)
                now = self.clock()
                self._expire(now)
                if self._accept_paused_until is not None and now >= self._accept_paused_until:
                    self._accept_paused_until = None
                    self._selector.register(self._listener, selectors.EVENT_READ)
                wanted = self.tick(now) if self._connections else None
                busy = time.monotonic() - turn
                self.busy_s += busy
                self._rest(busy * (1 / self.max_duty - 1))
        except Exception as exc:  # a bug here must not take the run down with it: said in one line
            self.log.error("%s stopped: %s: %s", self.name, type(exc).__name__, exc)
        finally:
            self._shut()

    def _shut(self) -> None:
        for connection in list(self._connections.values()):
            self._drop(connection)
        self._selector.close()
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()

    def _rest(self, seconds: float) -> None:
        """Sleep ``seconds`` (at most :data:`_MAX_REST_S`), woken early only by :meth:`close`."""
        if seconds <= 0 or self._closing:
            return
        end = time.monotonic() + min(seconds, _MAX_REST_S)
        while not self._closing and (left := end - time.monotonic()) > 0:
            select.select([self._wake_r], [], [], left)

    def _timeout(self, wanted: float | None) -> float | None:
        if not self._connections and self._accept_paused_until is None:
            return None  # nothing to time out: sleep until a connection or close()
        now = self.clock()
        left = min((c.deadline for c in self._connections.values()), default=math.inf) - now
        return max(min(left, _POLL_S, math.inf if wanted is None else wanted), 0.0)

    def _accept(self, now: float) -> None:
        for _ in range(_ACCEPTS_PER_WAKE):  # the rest at the next wake: reads and deadlines go on meanwhile
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors: stop accepting a moment, not spin on a readable listener
                self.log.warning("%s: accept failed (%s); pausing accepts for 0.1 s", self.name, exc.strerror)
                self._selector.unregister(self._listener)
                self._accept_paused_until = now + 0.1
                return
            if len(self._connections) >= self.max_connections and not self._shed_one():
                self.refused += 1
                sock.close()
                continue
            sock.setblocking(False)
            connection = HttpConnection(sock, now + self.request_timeout)
            self._connections[sock] = connection
            self._selector.register(sock, selectors.EVENT_READ, connection)

    def _shed_one(self) -> bool:
        """Close the oldest connection still sending its request, for a new one; False if none is."""
        for connection in self._connections.values():
            if not connection.answered:
                self.shed += 1
                self._drop(connection)
                return True
        return False

    def _expire(self, now: float) -> None:
        for connection in [c for c in self._connections.values() if c.deadline <= now]:
            if connection.stream:
                self.stalled += 1
            else:
                self.timed_out += 1
            self._drop(connection)

    def _drop(self, connection: HttpConnection) -> None:
        if self._connections.pop(connection.sock, None) is None:
            return
        try:
            self._selector.unregister(connection.sock)
        except (KeyError, ValueError):
            pass
        connection.sock.close()

    def _gone(self, connection: HttpConnection, exc: OSError) -> None:
        """A client reset or went: one debug line, no traceback."""
        self.log.debug("%s: a client went (%s)", self.name, exc.strerror or type(exc).__name__)
        self._drop(connection)

    def _receive(self, connection: HttpConnection, now: float) -> None:
        room = _MAX_STREAM_READ if connection.answered else self.max_request_bytes + 1 - len(connection.inbox)
        try:
            data = connection.sock.recv(room)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._gone(connection, exc)
            return
        if not data:
            self._drop(connection)
            return
        if connection.answered:  # a stream's client has nothing to say: what it sends is dropped
            return
        connection.inbox += data
        head, sep, _ = bytes(connection.inbox).partition(b"\r\n\r\n")
        if not sep:
            head, sep, _ = bytes(connection.inbox).partition(b"\n\n")
        if not sep:
            if len(connection.inbox) > self.max_request_bytes:
                self.answer(connection, 431, b"request headers too large\n")
            return
        lines = head.replace(b"\r\n", b"\n").split(b"\n")
        request = lines[0].split()
        if len(request) != 3 or not request[2].startswith(b"HTTP/1."):
            self.answer(connection, 400, b"expected GET PATH HTTP/1.1\n")
            return
        path, _, query = request[1].partition(b"?")
        headers = []
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers.append((name.strip().lower(), value.strip()))
        try:
            self.handle(connection, HttpRequest(request[0], path, query, tuple(headers)), now)
        except Exception as exc:  # one request's failure is its own: one line, and the others go on
            self.log.warning("%s: a request failed: %s: %s", self.name, type(exc).__name__, exc)
            self._drop(connection)

    def _send(self, connection: HttpConnection, now: float) -> None:
        try:
            sent = connection.sock.send(connection.outbox)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._gone(connection, exc)
            return
        connection.outbox = connection.outbox[sent:]
        if connection.stream:  # a stream's client reads: its stall deadline starts again
            connection.deadline = now + self.stall_timeout if connection.outbox else math.inf
        if connection.outbox:
            return
        if connection.stream:  # all read: no deadline until the next push
            self._selector.modify(connection.sock, selectors.EVENT_READ, connection)
            return
        _discard_unread(connection.sock)
        self._drop(connection)  # out of the table before the close: a client that sees EOF sees it gone


def _discard_unread(sock: socket.socket) -> None:
    """Read what already arrived past the request (a body, the rest of a refused header): closing
    with it unread would reset the connection, and the client could lose the answer."""
    for _ in range(16):  # at most 1 MiB: a client still sending more is reset, as it deserves
        try:
            if not sock.recv(65536):
                return
        except OSError:  # nothing more waiting (BlockingIOError), or the client is gone
            return
