"""The live pages' HTTP server: one page, its state as Server-Sent Events (or one JSON poll), a picture.

Standard library only (``http.server`` in threads of its own), so a board serves its page with
nothing it does not already install, and the stream's event loop never waits on a browser. What
a page shows comes from a :class:`LiveSource` (the board's :class:`~device_runtime.live.board.LiveBoard`,
the host's ``host_runtime.live.HostLive``); the server only carries it:

- ``GET /``: the page (inline script and style, no external resource: the board may be offline);
- ``GET /events``: the source's state every ``1 / rate_hz`` s as Server-Sent Events, each event
  carrying the source's cursor as its id, so a browser that reconnects (``Last-Event-ID``)
  gets only what it missed;
- ``GET /state.json?since=N``: the same state once, for scripts and for polling;
- ``GET /frame.jpg``: the source's picture (the board's latest answered frame), 204 without one.

A page bound to anything but loopback is for whoever can reach that address: with a key
(``--key-file``) every request must carry ``?token=`` :func:`live_token` of it, else 403.
Everything is bounded: concurrent connections (:data:`MAX_CONNECTIONS`, more are closed at once),
event streams (:data:`MAX_STREAMS`, more are answered 503), each socket's silence (a client that
stops reading is dropped after :data:`SOCKET_TIMEOUT_S`), and what a source keeps (rings).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import socket
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

from splitedge import SplitEdgeError

__all__ = [
    "DEFAULT_ADDRESS",
    "MAX_CONNECTIONS",
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
MAX_STREAMS = 4  # concurrent event streams (each a thread sending 10 events a second)
SOCKET_TIMEOUT_S = 10.0  # a client silent or not reading this long is dropped
QUIET_EVENT_S = 1.0  # with nothing new, an event this often still (the page shows it is alive)
#: Every answer forbids loading anything from elsewhere: the page works offline, and a label
#: or a host name shown on it can never pull in a script.
SECURITY_HEADERS = (
    ("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                                "img-src 'self' blob:; connect-src 'self'"),
    ("X-Content-Type-Options", "nosniff"),
    ("Cache-Control", "no-store"),
    ("Referrer-Policy", "no-referrer"),
)


class LiveSource(Protocol):
    """What a live page shows: its state after a cursor, and optionally a picture."""

    def state(self, since: int | None) -> tuple[dict[str, Any], int]:
        """The state to send (JSON-able) and the cursor to send next time; ``since`` None: a new
        client, which gets the whole of what is kept."""
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


class _Server(ThreadingHTTPServer):
    """Threads per connection, at most :data:`MAX_CONNECTIONS` of them; past that a connection is closed unread."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], live: LiveServer) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.live = live
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.streams = threading.BoundedSemaphore(MAX_STREAMS)
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    timeout = SOCKET_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a page polled ten times a second would fill the journal."""

    def do_GET(self) -> None:
        live = self.server.live
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        if url.path == "/favicon.ico":  # asked for by every browser, with no token: nothing to give
            self._send(HTTPStatus.NO_CONTENT, b"", "image/x-icon")
            return
        if live.token is not None and not hmac.compare_digest(query.get("token", [""])[0], live.token):
            self._send(HTTPStatus.FORBIDDEN, b"this page needs its token: open the URL the run printed, with "
                       b"?token=...\n", "text/plain; charset=utf-8")
            return
        if url.path == "/":
            self._send(HTTPStatus.OK, live.page, "text/html; charset=utf-8")
        elif url.path == "/state.json":
            state, _ = live.source.state(_cursor(query.get("since", [""])[0]))
            self._send(HTTPStatus.OK, _json(state), "application/json")
        elif url.path == "/events":
            self._events(_cursor(self.headers.get("Last-Event-ID") or query.get("since", [""])[0]))
        elif url.path == "/frame.jpg":
            picture = live.source.picture()
            if picture is None:
                self._send(HTTPStatus.NO_CONTENT, b"", "image/jpeg")
            else:
                self._send(HTTPStatus.OK, picture[0], "image/jpeg", picture[1])
        else:
            self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain; charset=utf-8")

    def _send(self, status: HTTPStatus, body: bytes, kind: str, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (*SECURITY_HEADERS, *(extra or {}).items()):
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _events(self, since: int | None) -> None:
        """State after state until the client goes or the server stops; one thread per stream, bounded."""
        live = self.server.live
        if not self.server.streams.acquire(blocking=False):
            self._send(HTTPStatus.SERVICE_UNAVAILABLE, b"too many pages open on this live server\n",
                       "text/plain; charset=utf-8")
            return
        try:
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", "text/event-stream")
            for name, value in SECURITY_HEADERS:
                self.send_header(name, value)
            self.end_headers()
            self.close_connection = True
            quiet = 0.0
            while not live.stopped.is_set():
                state, cursor = live.source.state(since)
                if cursor != since or quiet >= QUIET_EVENT_S:
                    self.wfile.write(b"id: %d\ndata: %s\n\n" % (cursor, _json(state)))
                    self.wfile.flush()
                    since, quiet = cursor, 0.0
                live.stopped.wait(live.period_s)
                quiet += live.period_s
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            pass  # the page was closed, or stopped reading
        finally:
            self.server.streams.release()


def _cursor(text: str) -> int | None:
    try:
        return max(int(text), 0)
    except ValueError:
        return None


def _json(state: dict[str, Any]) -> bytes:
    return json.dumps(state, separators=(",", ":"), allow_nan=False, default=str).encode()


class LiveServer:
    """A live page served from threads of its own until :meth:`close`; a context manager."""

    def __init__(self, source: LiveSource, page: str, address: str = DEFAULT_ADDRESS, port: int = 0,
                 key: bytes | None = None, rate_hz: float = 10.0) -> None:
        self.source, self.page = source, page.encode()
        self.token = live_token(key) if key is not None else None
        self.period_s = 1.0 / rate_hz
        self.stopped = threading.Event()
        try:
            self._server = _Server((address, port), self)
        except OSError as exc:
            raise SplitEdgeError(f"--live {address}:{port}: cannot listen there ({exc.strerror or exc}); give a free "
                                 "port (0 picks one) or an address of this machine") from exc
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.25},
                                        name="live-page", daemon=True)
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
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
        """Stop serving: event streams end within one period, the listening socket closes."""
        self.stopped.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5.0)

    def __enter__(self) -> LiveServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
