"""Raw sockets on 127.0.0.1 against the walled HTTP servers (the live pages, the host's metrics).

Nothing here waits on this machine's speed for an assertion: waits poll a condition within
:data:`GENEROUS_S`, many times what the servers need, and deadlines move on an injected clock.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

GENEROUS_S = 30.0  # any wait for a server's thread: many times what it needs
HALF_REQUEST = b"GET / HTTP/1.1\r\nHost: x\r\n"  # no blank line: the request never ends


class Clock:
    """An injected clock: deadlines, periods and caches move only when the test says."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def exchange(port: int, request: bytes) -> tuple[int, bytes]:
    """Send ``request`` as it is, read the answer to its end: (status, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=GENEROUS_S) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def closed_by_peer(sock: socket.socket, within: float) -> bool:
    """Whether the server closes ``sock`` within ``within`` s (EOF or reset)."""
    sock.settimeout(within)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


class Counted:
    """A live source that counts the states asked of it, each ``padding`` bytes of JSON; with
    ``moving``, every state is news (a new cursor)."""

    def __init__(self, padding: int = 0, moving: bool = False) -> None:
        self.calls = 0
        self.padding = "x" * padding
        self.moving = moving

    def state(self, since: int | None) -> tuple[dict, int]:
        self.calls += 1
        return {"since": since, "padding": self.padding}, self.calls if self.moving else 7

    def picture(self) -> None:
        return None


def wait_for(condition: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + GENEROUS_S
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {GENEROUS_S:g} s"
        time.sleep(0.02)


def half_open(port: int, count: int, request: bytes = HALF_REQUEST) -> list[socket.socket]:
    """``count`` connections that each send the start of a request and nothing more."""
    socks = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=GENEROUS_S)
        sock.sendall(request)
        socks.append(sock)
    return socks
