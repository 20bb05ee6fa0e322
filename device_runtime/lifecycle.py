"""Signals become a flag: SIGINT and SIGTERM set an event the main loop awaits (as uvicorn does).

Shutdown is then ordinary code — withdraw the zeroconf record, close sockets, finish or fail
what is in flight — bounded in time, instead of a KeyboardInterrupt landing anywhere.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Callable, Coroutine

from calibration import CalibrationError
from device_runtime.errors import SplitEdgeError


def stop_on_signals(stop: asyncio.Event) -> None:
    """Set ``stop`` on SIGINT or SIGTERM; a second signal falls back to the default (hard) action."""
    loop = asyncio.get_running_loop()

    def handle(sig: signal.Signals) -> None:
        stop.set()
        loop.remove_signal_handler(sig)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, handle, sig)


#: ``--loop`` choices: auto takes uvloop where it is installed (as uvicorn does), asyncio's own loop otherwise.
LOOPS = ("auto", "asyncio", "uvloop")


def loop_runner(choice: str = "asyncio") -> Callable[[Coroutine[object, object, object]], object]:
    """``asyncio.run`` or ``uvloop.run``: uvloop's libuv loop does the per-frame work of a server
    with many connections (reads, writes, callbacks) in C (docs/benchmarks.md, "Host under load")."""
    if choice == "asyncio":
        return asyncio.run
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise SplitEdgeError("--loop uvloop: uvloop is not installed (pip install uvloop)") from None
        return asyncio.run
    return uvloop.run


def run_command(prog: str, main: Coroutine[object, object, object], loop: str = "asyncio") -> int:
    """Run a CLI's coroutine on ``loop`` (one of :data:`LOOPS`); a :class:`SplitEdgeError` (or a bad
    calibration) is one line on stderr and exit status 2."""
    try:
        loop_runner(loop)(main)
    except (SplitEdgeError, CalibrationError) as exc:
        main.close()  # a no-op once it ran; never awaited when no loop could be had, and must not warn so
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    return 0
