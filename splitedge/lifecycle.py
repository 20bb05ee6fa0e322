"""Signals become a flag: SIGINT and SIGTERM set an event the main loop awaits (as uvicorn does).

Shutdown is then ordinary code — withdraw the zeroconf record, close sockets, finish or fail
what is in flight — bounded in time, instead of a KeyboardInterrupt landing anywhere. And a
service tells systemd how it is (:func:`notify`): ready once it has answered a frame, stopping.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from typing import Callable, Coroutine

from splitedge.errors import SplitEdgeError


def stop_on_signals(stop: asyncio.Event) -> None:
    """Set ``stop`` on SIGINT or SIGTERM; a second signal falls back to the default (hard) action."""
    loop = asyncio.get_running_loop()

    def handle(sig: signal.Signals) -> None:
        stop.set()
        loop.remove_signal_handler(sig)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, handle, sig)


Runner = Callable[[Coroutine[object, object, object]], object]


def run_command(prog: str, main: Coroutine[object, object, object], runner: Runner = asyncio.run) -> int:
    """Run a CLI's coroutine with ``runner`` (``asyncio.run``; the host may pass uvloop's); a
    :class:`SplitEdgeError` (a bad calibration included) is one line on stderr and exit status 2."""
    try:
        runner(main)
    except SplitEdgeError as exc:
        main.close()  # a no-op once it ran; never awaited when no loop could be had, and must not warn so
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    return 0


def notify(state: str) -> bool:
    """``sd_notify(3)``: one datagram of ``NAME=VALUE`` lines to ``$NOTIFY_SOCKET``, as systemd's
    ``Type=notify`` units do (``READY=1``, ``STATUS=…``, ``STOPPING=1``). A ``Type=notify`` unit is
    "active" only once ``READY=1`` arrives, so ``systemctl restart`` returns when the service
    really works, and fails when it never does. Outside such a unit (no ``NOTIFY_SOCKET``) it
    does nothing and returns False; a socket that cannot be reached is a warning, never an error."""
    path = os.environ.get("NOTIFY_SOCKET")
    if not path:
        return False
    address = "\0" + path[1:] if path.startswith("@") else path  # '@': the abstract namespace
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError as exc:
        print(f"warning: could not tell systemd {state.splitlines()[0]!r} at {path}: {exc}", file=sys.stderr)
        return False
    return True
