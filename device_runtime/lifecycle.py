"""Signals become a flag: SIGINT and SIGTERM set an event the main loop awaits (as uvicorn does).

Shutdown is then ordinary code — withdraw the zeroconf record, close sockets, finish or fail
what is in flight — bounded in time, instead of a KeyboardInterrupt landing anywhere.
"""

from __future__ import annotations

import asyncio
import signal
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
