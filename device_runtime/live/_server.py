"""The live pages' HTTP server: one page, its state as Server-Sent Events (or one JSON poll), a picture.

Standard library only, one thread of its own (:class:`~device_runtime.live._http.WalledServer`: a
selector, no thread per connection), so a board serves its page with nothing it does not already
install, and the stream never waits on a browser. What a page shows comes from a
:class:`LiveSource` (the board's :class:`~device_runtime.live._board_state.LiveBoard`, the host's
``host_runtime._live.HostLive``); the server only carries it:

- ``GET /``: the page (inline script and style, no external resource: the board may be offline);
- ``GET /events``: the source's state every ``1 / walls.events_hz`` s as Server-Sent Events, each event
  carrying the source's cursor as its id, so a browser that reconnects (``Last-Event-ID``)
  gets only what it missed;
- ``GET /state.json?since=N``: the same state once, for scripts and for polling;
- ``GET /frame.jpg``: the source's picture (the board's latest answered frame), 204 without one.

A page bound to anything but loopback is for whoever can reach that address: with a key
(``--key-file``) every request must carry ``?token=`` :func:`live_token` of it, else 403 (compared
as bytes in constant time: a token of any bytes is a 403, never an error).

Watching never costs the run its frames (issue 45: 12 pollers took a board from 23 to 3.3 fps,
16 slow senders locked the page out, each reset logged a traceback). Everything is bounded:

- concurrent connections (:data:`MAX_CONNECTIONS`): past it the oldest still sending its request
  is shed for the new one, so idle sockets cannot lock a page out;
- each request's time (:data:`REQUEST_TIMEOUT_S` from accept to its answer's last byte, however
  slowly it trickles in), and its size (8 KiB of request line and headers);
- event streams (:data:`MAX_STREAMS`, more are answered 503); a stream whose client has read
  nothing of an event for :data:`SOCKET_TIMEOUT_S` is dropped, and while an event is unread no
  new one is made (the next one carries all it missed);
- the work: the state after a given cursor is asked of the source and encoded **at most once a
  period** (``1 / walls.events_hz``) whatever the number of pages and pollers, and the thread takes at
  most :data:`MAX_DUTY` of the time (it rests in proportion to the time its turns took);
- what is sent: the source caps a state (the board's: :data:`~device_runtime.live._board_state.FRAMES_SENT`
  records and :data:`~device_runtime.live._board_state.FRAMES_SENT_BYTES` of them, the newest);
- the log: a client that resets or goes is one debug line, never a traceback.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from device_runtime.live._http import HttpConnection, HttpRequest, WalledServer, Walls
from splitedge import SplitEdgeError

__all__ = [
    "DEFAULT_ADDRESS",
    "MAX_CONNECTIONS",
    "LIVE_WALLS",
    "MAX_STREAMS",
    "LiveServer",
    "LiveSource",
    "live_token",
    "parse_live_address",
]

#: Where a page listens unless an address is given: this machine only.
DEFAULT_ADDRESS = "127.0.0.1"
#: Domain separation: the page's token is this label's HMAC under the pre-shared key, so the key
#: itself never appears in a URL and the token is good for nothing on the wire protocol.
TOKEN_LABEL = b"splitedge-live-page-v1"
MAX_CONNECTIONS = 16  # concurrent HTTP connections; a board's page is watched by a person or two
MAX_STREAMS = 4  # concurrent event streams (each sent at most events_hz events a second)
REQUEST_TIMEOUT_S = 10.0  # accept to the answer's last byte, whatever the client sends meanwhile
SOCKET_TIMEOUT_S = 10.0  # an event stream whose client has not read an event this long is dropped
QUIET_EVENT_S = 1.0  # with nothing new, an event this often still (the page shows it is alive)
#: The share of the time (and of the GIL, which the board's stream and the host's event loop
#: need) the page server may take: after each turn it rests 1 / MAX_DUTY - 1 times the turn's time.
MAX_DUTY = 0.05
#: A new page's whole window (the board's: up to 600 records, 256 KiB) is built at most this often:
#: a page needs it once, then polls or streams with its cursor; a script polling without one gets
#: the same window for a second (20 such pollers cost a loaded board a quarter of its frames when
#: each period built it again, issue 45).
WHOLE_STATE_S = 1.0
#: The page's walls, from the constants above.
LIVE_WALLS = Walls(max_connections=MAX_CONNECTIONS, request_timeout=REQUEST_TIMEOUT_S, max_duty=MAX_DUTY,
                   stall_timeout=SOCKET_TIMEOUT_S, max_streams=MAX_STREAMS)
log = logging.getLogger("splitedge.live")
#: Every answer forbids loading anything from elsewhere: the page works offline, and a label
#: or a host name shown on it can never pull in a script.
SECURITY_HEADERS = (
    ("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                                "img-src 'self' blob:; connect-src 'self'"),
    ("X-Content-Type-Options", "nosniff"),
    ("Cache-Control", "no-store"),
    ("Referrer-Policy", "no-referrer"),
)
_HEADERS = b"".join(f"{name}: {value}\r\n".encode() for name, value in SECURITY_HEADERS)
_TEXT = b"text/plain; charset=utf-8"
_WARN_EVERY_S = 60.0  # a source that fails says so in the log at most this often


class LiveSource(Protocol):
    """What a live page shows: its state after a cursor, and optionally a picture."""

    def state(self, since: int | None) -> tuple[dict[str, Any], int]:
        """The state to send (JSON-able, capped by the source) and the cursor to send next time;
        ``since`` None: a new client, which gets a capped window of what is kept."""
        ...

    def picture(self) -> tuple[bytes, dict[str, str]] | None:
        """A JPEG and headers to send with it (``X-Frame-Index``), or None for none."""
        ...


def live_token(key: bytes) -> str:
    """The token a page asks for when the run has ``--key-file``: HMAC-SHA256 of a fixed label
    under the key (hex). Anyone holding the key can derive it; nobody else can."""
    return hmac.new(key, TOKEN_LABEL, hashlib.sha256).hexdigest()


def parse_live_address(text: str) -> tuple[str, int]:
    """``[ADDRESS:]PORT`` -> (address, port): ``8080`` is 127.0.0.1:8080, ``0.0.0.0:8080`` every
    interface, ``[::1]:8080`` an IPv6 address; port 0 picks a free one."""
    address, sep, port_text = text.rpartition(":")
    address = address.strip("[]") if sep else DEFAULT_ADDRESS
    try:
        port = int(port_text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535 or (sep and not address):
        raise SplitEdgeError(f"--live {text!r}: expected [ADDRESS:]PORT, like 8080 (this machine only) or "
                             f"0.0.0.0:8080 (every interface); port 0 picks a free one")
    return address, port


def live_flag(text: str) -> str:
    """``--live``'s argparse type (``split-device run``, ``split-host serve``): ``text`` when
    :func:`parse_live_address` takes it, else the usage error saying what it expects."""
    try:
        parse_live_address(text)
    except SplitEdgeError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix(f"--live {text!r}: ")) from None
    return text


class LiveServer(WalledServer):
    """A live page served from one thread of its own until :meth:`close`; a context manager.

    ``walls`` are what it holds to (:data:`LIVE_WALLS`, this module's constants), and ``clock``
    (seconds) times deadlines, periods and the state's cache: tests inject them."""

    def __init__(self, source: LiveSource, page: str, address: str = DEFAULT_ADDRESS, port: int = 0,
                 key: bytes | None = None, *, clock: Callable[[], float] = time.monotonic,
                 walls: Walls = LIVE_WALLS) -> None:
        self.source, self.page = source, page.encode()
        self.token = live_token(key) if key is not None else None
        self._token = None if self.token is None else self.token.encode()
        self.period_s = 1.0 / walls.events_hz
        self.max_streams = walls.max_streams
        self.stopped = threading.Event()
        self.states = 0  # states asked of the source (at most one per cursor and period)
        self._states: dict[int | None, tuple[float, int, bytes]] = {}  # since -> (when, cursor, JSON)
        self._next_tick = -float("inf")
        self._warned_at = -float("inf")
        try:
            super().__init__(address, port, name="live-page", log=log, walls=walls, clock=clock)
        except OSError as exc:
            raise SplitEdgeError(f"--live {address}:{port}: cannot listen there ({exc.strerror or exc}); give a free "
                                 "port (0 picks one) or an address of this machine") from exc
        self.start()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        """The page's URL, with its token where one is needed (what the run prints at start);
        for every interface, this machine's name."""
        host, port = self.address
        if host in ("0.0.0.0", "::"):
            host = socket.gethostname()
        elif ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{port}/" + (f"?token={self.token}" if self.token else "")

    def close(self) -> None:
        """Stop serving: event streams end, the listening socket closes."""
        self.stopped.set()
        super().close()

    def __enter__(self) -> LiveServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- in the server's thread ---------------------------------------------------------------------

    def handle(self, connection: HttpConnection, request: HttpRequest, now: float) -> None:
        if request.method not in (b"GET", b"HEAD"):
            self.answer(connection, 405, b"only GET and HEAD\n", headers=_HEADERS + b"Allow: GET, HEAD\r\n")
            return
        head_only, path = request.method == b"HEAD", request.path
        if path == b"/favicon.ico":  # asked for by every browser, with no token: nothing to give
            self.answer(connection, 204, b"", content_type=b"image/x-icon", headers=_HEADERS)
            return
        if self._token is not None and not self.token_matches(request.params(b"token"), self._token):
            self.answer(connection, 403, b"this page needs its token: open the URL the run printed, with "
                        b"?token=...\n", headers=_HEADERS)
            return
        if path == b"/":
            self.answer(connection, 200, self.page, content_type=b"text/html; charset=utf-8", headers=_HEADERS,
                        head_only=head_only)
        elif path == b"/state.json":
            state = self._state(_cursor(next(iter(request.params(b"since")), b"")), now)
            if state is None:
                self.answer(connection, 500, b"the state could not be read; see the log\n", headers=_HEADERS)
            else:
                self.answer(connection, 200, state[1], content_type=b"application/json", headers=_HEADERS,
                            head_only=head_only)
        elif path == b"/events":
            if head_only:
                self.answer(connection, 405, b"an event stream is GET only\n", headers=_HEADERS + b"Allow: GET\r\n")
                return
            if len(self.streams) >= self.max_streams:
                self.answer(connection, 503, b"too many pages open on this live server\n", headers=_HEADERS)
                return
            self.open_stream(connection, b"text/event-stream", _HEADERS, now)
            connection.cursor = _cursor(request.header(b"last-event-id") or next(iter(request.params(b"since")), b""))
            self._next_tick = min(self._next_tick, now)  # its first event at once
        elif path == b"/frame.jpg":
            self._picture(connection, head_only, now)
        else:
            self.answer(connection, 404, b"not found\n", headers=_HEADERS)

    def tick(self, now: float) -> float | None:
        """Each stream whose last event was read gets what is new (or, after :data:`QUIET_EVENT_S`
        of nothing new, the same again), once a period."""
        streams = self.streams
        if not streams:
            return None
        if now < self._next_tick:
            return self._next_tick - now
        self._next_tick = now + self.period_s
        for connection in streams:
            if connection.outbox:
                continue  # the last event is unread: nothing new until it is (or the stream is dropped)
            state = self._state(connection.cursor, now)
            if state is None:
                continue
            cursor, body = state
            if (cursor != connection.cursor or now - connection.sent_at >= QUIET_EVENT_S) and \
                    self.push(connection, b"id: %d\ndata: %s\n\n" % (cursor, body), now):
                connection.cursor, connection.sent_at = cursor, now
        return self.period_s

    def _state(self, since: int | None, now: float) -> tuple[int, bytes] | None:
        """The source's state after ``since`` as JSON, asked of it at most once a period per
        cursor whatever the number of pages, and the whole window a new page gets (``since``
        None, the costliest: hundreds of records) at most every :data:`WHOLE_STATE_S`; None when
        the source failed (said in the log)."""
        cached = self._states.get(since)
        fresh_s = self.period_s if since is not None else max(self.period_s, WHOLE_STATE_S)
        if cached is not None and 0 <= now - cached[0] < fresh_s:
            return cached[1], cached[2]
        self.states += 1
        try:
            state, cursor = self.source.state(since)
            body = _json(state)
        except Exception as exc:  # a source that fails must not stop the page
            self._failed("state", exc, now)
            return None
        if len(self._states) >= 2 * self.max_connections:  # bounded: the stale go, or all
            self._states = {k: v for k, v in self._states.items() if 0 <= now - v[0] < self.period_s}
            if len(self._states) >= 2 * self.max_connections:
                self._states.clear()
        self._states[since] = (now, cursor, body)
        return cursor, body

    def _picture(self, connection: HttpConnection, head_only: bool, now: float) -> None:
        try:
            picture = self.source.picture()
        except Exception as exc:
            self._failed("picture", exc, now)
            picture = None
        if picture is None:
            self.answer(connection, 204, b"", content_type=b"image/jpeg", headers=_HEADERS)
            return
        extra = b"".join(f"{name}: {value}\r\n".encode() for name, value in picture[1].items())
        self.answer(connection, 200, picture[0], content_type=b"image/jpeg", headers=_HEADERS + extra,
                    head_only=head_only)

    def _failed(self, what: str, exc: Exception, now: float) -> None:
        if now - self._warned_at >= _WARN_EVERY_S:
            self._warned_at = now
            log.warning("live page: the %s could not be read: %s: %s", what, type(exc).__name__, exc)


def _cursor(text: bytes) -> int | None:
    try:
        return max(int(text), 0)
    except ValueError:
        return None


def _json(state: dict[str, Any]) -> bytes:
    return json.dumps(state, separators=(",", ":"), allow_nan=False, default=str).encode()
