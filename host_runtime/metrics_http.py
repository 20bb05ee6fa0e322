"""The host's Prometheus endpoint (``--metrics-port``): one thread, one selector, every connection bounded.

prometheus_client's own server gave each connection a thread that never timed out: 2,000 half-sent
requests held 986 threads after 20 s, and 12 scrapers in a loop rendered the registry for each
request, raising the host's infer p99 9.3x (issue 45). Here:

- **one thread** serves every connection from a selector (the render may block it, a ``--procs``
  parent's render scrapes its children, so it is not the host's event loop);
- **at most** :data:`MAX_CONNECTIONS` are open; a new one past that sheds the oldest still sending
  its request (a flood of idle sockets cannot lock a scraper out), or is closed if none is;
- **one deadline per request**, :data:`REQUEST_TIMEOUT_S` from accept to the last byte answered,
  whatever arrives meanwhile (a header byte every few seconds does not extend it);
- a request (line and headers) of at most :data:`MAX_REQUEST_BYTES`, else 431; no body is read;
- the text is **rendered once per** :data:`CACHE_S` whatever the number of scrapers, and the
  thread takes at most :data:`MAX_DUTY` of a core (it rests after each turn in proportion to the
  CPU time the turn took), so scrapers in a loop cannot take the GIL from the host's event loop;
- bound anywhere but loopback it **asks for a token** (``Authorization: Bearer TOKEN`` or
  ``?token=TOKEN``, compared in constant time as bytes, so a token of any bytes is a 401, not an
  error): ``--metrics-token-file``'s, else :func:`metrics_token` of ``--key-file``'s key.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import os
import select
import selectors
import socket
import stat
import threading
import time
from collections import OrderedDict
from typing import Callable
from urllib.parse import unquote_to_bytes

from splitedge import SplitEdgeError

log = logging.getLogger("splitedge.host.metrics")

MAX_CONNECTIONS = 64  # scrapers are a Prometheus or two; past this the oldest unanswered is shed
REQUEST_TIMEOUT_S = 5.0  # accept to the answer's last byte, whatever the client sends meanwhile
MAX_REQUEST_BYTES = 8192  # request line and headers
CACHE_S = 1.0  # scrapes within this of a render get its text
#: The share of one core (and of the GIL, which the host's event loop needs) the endpoint may take:
#: after each turn it rests 1 / MAX_DUTY - 1 times the CPU time the turn took. Scrapers in a loop
#: wait in the kernel's queue meanwhile; a Prometheus scraping every few seconds never notices.
MAX_DUTY = 0.05
_MAX_REST_S = 2.0
MAX_TOKEN_FILE_BYTES = 4096
#: Domain separation: the token is this label's HMAC under the pre-shared key, so the key never
#: appears in a scrape config and the token is good for nothing else (not the live page's, not frames').
TOKEN_LABEL = b"splitedge-metrics-v1"
CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
_POLL_S = 0.25  # the longest the thread sleeps with connections open (an injected clock is read this often)
_ACCEPTS_PER_WAKE = 64


def metrics_token(key: bytes) -> str:
    """The token the endpoint asks for when bound off loopback with ``--key-file`` and no
    ``--metrics-token-file``: HMAC-SHA256 of a fixed label under the key (hex)."""
    return hmac.new(key, TOKEN_LABEL, hashlib.sha256).hexdigest()


def is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:  # a host name: whatever it resolves to, it is not known to be this machine only
        return False


def read_token_file(path: str) -> bytes:
    """``--metrics-token-file``: a regular file of at most 4 KiB that not every user can read, its first line the token
    (what Prometheus's ``authorization: credentials_file`` sends, surrounding whitespace stripped)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO neither blocks the open nor is read
    except OSError as exc:
        raise SplitEdgeError(f"--metrics-token-file {path}: {exc.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise SplitEdgeError(f"--metrics-token-file {path}: not a regular file")
        if mode & stat.S_IROTH:  # as --key-file: a token every user can read guards nothing
            raise SplitEdgeError(f"--metrics-token-file {path} is readable by every user (mode "
                                 f"{stat.S_IMODE(mode):o}); run chmod 600 {path}")
        data = os.read(fd, MAX_TOKEN_FILE_BYTES + 1)
    finally:
        os.close(fd)
    lines = data.strip().splitlines()
    if len(data) > MAX_TOKEN_FILE_BYTES or not lines or len(lines[0].strip()) < 16:
        raise SplitEdgeError(f"--metrics-token-file {path}: expected a token of 16 to {MAX_TOKEN_FILE_BYTES} bytes "
                             "on its first line")
    return lines[0].strip()


_NEEDS_TOKEN = ("--metrics-interface {address} is not loopback: the metrics need a token there; pass --key-file or "
                "--metrics-token-file, or leave --metrics-interface at 127.0.0.1")


def check_metrics_flags(address: str, key_file: str | None, token_file: str | None) -> None:
    """``--metrics-interface`` and ``--metrics-token-file`` refused in one line before anything
    loads or starts (not once the tails are loaded, or a ``--procs`` parent's children run)."""
    if token_file is not None:
        read_token_file(token_file)
    elif key_file is None and not is_loopback(address):
        raise SplitEdgeError(_NEEDS_TOKEN.format(address=address))


def endpoint_token(address: str, key: bytes | None, token: bytes | None) -> tuple[bytes | None, str]:
    """The token the endpoint on ``address`` asks for, and what the start line says about it.

    A token given (``--metrics-token-file``) is asked for wherever the endpoint is bound; else
    loopback asks for none, and any other address asks for :func:`metrics_token` of the key, or
    is refused in one line when there is no key."""
    how = "send it as 'Authorization: Bearer TOKEN' or ?token=TOKEN"
    if token is not None:
        return token, f" (asks for the token of --metrics-token-file: {how})"
    if is_loopback(address):
        return None, ""
    if key is None:
        raise SplitEdgeError(_NEEDS_TOKEN.format(address=address))
    derived = metrics_token(key)
    return derived.encode(), f" (asks for token {derived}, from --key-file: {how})"


class _Connection:
    __slots__ = ("sock", "deadline", "inbox", "outbox", "answered")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline = deadline
        self.inbox = bytearray()
        self.outbox = memoryview(b"")
        self.answered = False


_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
            431: "Request Header Fields Too Large", 500: "Internal Server Error"}


class MetricsEndpoint:
    """Prometheus text from ``render()`` on ``address:port`` (port 0 picks a free one), served by
    one thread until :meth:`close`. ``clock`` (seconds) times the deadlines and the cache."""

    def __init__(self, render: Callable[[], bytes], address: str, port: int, *, token: bytes | None = None,
                 note: str = "", max_connections: int = MAX_CONNECTIONS, request_timeout: float = REQUEST_TIMEOUT_S,
                 max_request_bytes: int = MAX_REQUEST_BYTES, cache_s: float = CACHE_S, max_duty: float = MAX_DUTY,
                 clock: Callable[[], float] = time.monotonic) -> None:
        assert max_connections >= 1 and request_timeout > 0 and max_request_bytes > 0 and cache_s >= 0
        assert 0 < max_duty <= 1
        self._render = render
        self.token = token
        self.note = note  # what the start line adds (the token asked for)
        self.max_connections = max_connections
        self.request_timeout = request_timeout
        self.max_request_bytes = max_request_bytes
        self.cache_s = cache_s
        self.max_duty = max_duty
        self.busy_s = 0.0  # CPU time the thread spent serving (its rests are 1 / max_duty - 1 times this)
        self._clock = clock
        # What it did, for tests and logs: renders made, connections shed for a new one, refused
        # (the table full of answers being written), closed at their deadline.
        self.renders = self.shed = self.refused = self.timed_out = 0
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
        self._connections: OrderedDict[socket.socket, _Connection] = OrderedDict()  # in accept order
        self._cached: tuple[float, bytes] | None = None
        self._closing = False
        self.thread = threading.Thread(target=self._run, name="splitedge-metrics", daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    @property
    def url(self) -> str:
        host = self.server_address[0]
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}/metrics"

    @property
    def open_connections(self) -> int:
        return len(self._connections)

    def close(self) -> None:
        self._closing = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self.thread.join(5.0)

    # -- the thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._closing:
                events = self._selector.select(self._timeout())
                turn = time.thread_time()
                now = self._clock()
                for key, mask in events:
                    if key.fileobj is self._listener:
                        self._accept(now)
                    elif key.fileobj is self._wake_r:
                        try:
                            self._wake_r.recv(64)
                        except OSError:
                            pass
                    elif mask & selectors.EVENT_WRITE:
                        self._send(key.data)
                    else:
                        self._receive(key.data, now)
                now = self._clock()
                self._expire(now)
                if self._accept_paused_until is not None and now >= self._accept_paused_until:
                    self._accept_paused_until = None
                    self._selector.register(self._listener, selectors.EVENT_READ)
                busy = time.thread_time() - turn
                self.busy_s += busy
                self._rest(busy * (1 / self.max_duty - 1))
        finally:
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
            if self._closing:
                return

    def _timeout(self) -> float | None:
        if not self._connections and self._accept_paused_until is None:
            return None  # nothing to time out: sleep until a connection or close()
        oldest = next(iter(self._connections.values()), None)  # deadlines are in accept order
        left = _POLL_S if oldest is None else oldest.deadline - self._clock()
        return min(max(left, 0.0), _POLL_S)

    def _accept(self, now: float) -> None:
        for _ in range(_ACCEPTS_PER_WAKE):  # the rest at the next wake: reads and deadlines go on meanwhile
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors: stop accepting a moment, not spin on a readable listener
                log.warning("metrics endpoint: accept failed (%s); pausing accepts for 0.1 s", exc.strerror)
                self._selector.unregister(self._listener)
                self._accept_paused_until = now + 0.1
                return
            if len(self._connections) >= self.max_connections and not self._shed_one():
                self.refused += 1
                sock.close()
                continue
            sock.setblocking(False)
            connection = _Connection(sock, now + self.request_timeout)
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
        while self._connections:
            connection = next(iter(self._connections.values()))
            if connection.deadline > now:
                return
            self.timed_out += 1
            self._drop(connection)

    def _drop(self, connection: _Connection) -> None:
        if self._connections.pop(connection.sock, None) is None:
            return
        try:
            self._selector.unregister(connection.sock)
        except (KeyError, ValueError):
            pass
        connection.sock.close()

    def _receive(self, connection: _Connection, now: float) -> None:
        try:
            data = connection.sock.recv(self.max_request_bytes + 1 - len(connection.inbox))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # reset: nothing to log, nothing to answer
            self._drop(connection)
            return
        if not data:
            self._drop(connection)
            return
        connection.inbox += data
        head, sep, _ = bytes(connection.inbox).partition(b"\r\n\r\n")
        if not sep:
            head, sep, _ = bytes(connection.inbox).partition(b"\n\n")
        if not sep:
            if len(connection.inbox) > self.max_request_bytes:
                self._answer(connection, 431, b"request headers too large\n")
            return
        self._respond(connection, head, now)

    def _respond(self, connection: _Connection, head: bytes, now: float) -> None:
        lines = head.replace(b"\r\n", b"\n").split(b"\n")
        request = lines[0].split()
        if len(request) != 3 or not request[2].startswith(b"HTTP/1."):
            self._answer(connection, 400, b"expected GET /metrics HTTP/1.1\n")
            return
        method, target = request[0], request[1]
        if method not in (b"GET", b"HEAD"):
            self._answer(connection, 405, b"only GET and HEAD\n", extra=b"Allow: GET, HEAD\r\n")
            return
        path, _, query = target.partition(b"?")
        if self.token is not None and not self._authorized(lines[1:], query):
            self._answer(connection, 401, b"a token is needed: Authorization: Bearer TOKEN, or ?token=TOKEN\n",
                         extra=b'WWW-Authenticate: Bearer realm="splitedge-metrics"\r\n')
            return
        if path not in (b"/metrics", b"/"):
            self._answer(connection, 404, b"the metrics are at /metrics\n")
            return
        body = self._rendered(now)
        if body is None:
            self._answer(connection, 500, b"rendering the metrics failed; see the host's log\n")
            return
        self._answer(connection, 200, body, content_type=CONTENT_TYPE, head_only=method == b"HEAD")

    def _authorized(self, headers: list[bytes], query: bytes) -> bool:
        """Any bearer header or ``token`` parameter equal to the token, each compared in constant
        time as bytes (a non-ASCII token is one more mismatch)."""
        assert self.token is not None
        candidates = []
        for line in headers:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"authorization":
                scheme, _, credentials = value.strip().partition(b" ")
                if scheme.lower() == b"bearer":
                    candidates.append(credentials.strip())
        for part in query.split(b"&"):
            name, _, value = part.partition(b"=")
            if name == b"token":
                candidates.append(unquote_to_bytes(value.replace(b"+", b" ")))
        good = False
        for candidate in candidates[:8]:  # bounded: the request is at most max_request_bytes anyway
            good |= hmac.compare_digest(candidate, self.token)
        return good

    def _rendered(self, now: float) -> bytes | None:
        cached = self._cached
        if cached is not None and 0 <= now - cached[0] < self.cache_s:
            return cached[1]
        self.renders += 1
        try:
            body = self._render()
        except Exception as exc:  # a collector that fails must not stop the endpoint; said in the log
            log.warning("metrics endpoint: rendering failed: %s: %s", type(exc).__name__, exc)
            return None
        self._cached = (now, body)
        return body

    def _answer(self, connection: _Connection, status: int, body: bytes, *, content_type: bytes = b"text/plain; "
                b"charset=utf-8", extra: bytes = b"", head_only: bool = False) -> None:
        head = (f"HTTP/1.1 {status} {_REASONS[status]}\r\n".encode() + b"Content-Type: " + content_type + b"\r\n"
                + f"Content-Length: {len(body)}\r\n".encode() + extra + b"Connection: close\r\n\r\n")
        connection.answered = True
        connection.inbox = bytearray()
        connection.outbox = memoryview(head if head_only else head + body)
        self._selector.modify(connection.sock, selectors.EVENT_WRITE, connection)
        self._send(connection)

    def _send(self, connection: _Connection) -> None:
        try:
            sent = connection.sock.send(connection.outbox)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(connection)
            return
        connection.outbox = connection.outbox[sent:]
        if not connection.outbox:
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
