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
  thread takes at most :data:`MAX_DUTY` of the time (it rests after each turn in proportion to the
  time the turn took), so scrapers in a loop cannot take the GIL from the host's event loop;
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
import stat
import time
from typing import Callable

from device_runtime.live import HttpConnection, HttpRequest, WalledServer, Walls
from splitedge import SplitEdgeError

log = logging.getLogger("splitedge.host.metrics")

MAX_CONNECTIONS = 64  # scrapers are a Prometheus or two; past this the oldest unanswered is shed
REQUEST_TIMEOUT_S = 5.0  # accept to the answer's last byte, whatever the client sends meanwhile
MAX_REQUEST_BYTES = 8192  # request line and headers
CACHE_S = 1.0  # scrapes within this of a render get its text
#: The share of the time (and of the GIL, which the host's event loop needs) the endpoint, and the
#: host's live page, may take: after each turn it rests 1 / MAX_DUTY - 1 times the time the turn
#: took. Scrapers in a loop wait in the kernel's queue meanwhile; a Prometheus scraping every few
#: seconds never notices. A board's page may take 5 %; the host, which every board's frames wait
#: on, gives its watchers 2 % (at 5 %, 20 scrapers raised its infer p99 by a median 17 % on a
#: loaded 2-core machine; at 2 %, 1-10 % in four runs: docs/benchmarks.md, issue 45).
MAX_DUTY = 0.02
#: The endpoint's walls, from the constants above.
METRICS_WALLS = Walls(max_connections=MAX_CONNECTIONS, request_timeout=REQUEST_TIMEOUT_S, max_duty=MAX_DUTY,
                      max_request_bytes=MAX_REQUEST_BYTES)
MAX_TOKEN_FILE_BYTES = 4096
#: Domain separation: the token is this label's HMAC under the pre-shared key, so the key never
#: appears in a scrape config and the token is good for nothing else (not the live page's, not frames').
TOKEN_LABEL = b"splitedge-metrics-v1"
CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"


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


class MetricsEndpoint(WalledServer):
    """Prometheus text from ``render()`` on ``address:port`` (port 0 picks a free one), served by
    one thread (:class:`device_runtime.live.WalledServer`) until :meth:`close`. ``clock``
    (seconds) times the deadlines and the cache."""

    def __init__(self, render: Callable[[], bytes], address: str, port: int, *, token: bytes | None = None,
                 note: str = "", walls: Walls = METRICS_WALLS, cache_s: float = CACHE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        assert cache_s >= 0
        super().__init__(address, port, name="splitedge-metrics", log=log, walls=walls, clock=clock)
        self._render = render
        self.token = token
        self.note = note  # what the start line adds (the token asked for)
        self.cache_s = cache_s
        self.renders = 0  # renders made, for tests and logs
        self._cached: tuple[float, bytes] | None = None
        self.start()

    @property
    def url(self) -> str:
        host = self.server_address[0]
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}/metrics"

    def handle(self, connection: HttpConnection, request: HttpRequest, now: float) -> None:
        if request.method not in (b"GET", b"HEAD"):
            self.answer(connection, 405, b"only GET and HEAD\n", headers=b"Allow: GET, HEAD\r\n")
            return
        if self.token is not None and not self._authorized(request):
            self.answer(connection, 401, b"a token is needed: Authorization: Bearer TOKEN, or ?token=TOKEN\n",
                        headers=b'WWW-Authenticate: Bearer realm="splitedge-metrics"\r\n')
            return
        if request.path not in (b"/metrics", b"/"):
            self.answer(connection, 404, b"the metrics are at /metrics\n")
            return
        body = self._rendered(now)
        if body is None:
            self.answer(connection, 500, b"rendering the metrics failed; see the host's log\n")
            return
        self.answer(connection, 200, body, content_type=CONTENT_TYPE, head_only=request.method == b"HEAD")

    def _authorized(self, request: HttpRequest) -> bool:
        """Any bearer header or ``token`` parameter equal to the token (:meth:`~WalledServer.token_matches`)."""
        assert self.token is not None
        candidates = []
        for name, value in request.headers:
            if name == b"authorization":
                scheme, _, credentials = value.partition(b" ")
                if scheme.lower() == b"bearer":
                    candidates.append(credentials.strip())
        return self.token_matches(candidates + request.params(b"token"), self.token)

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
