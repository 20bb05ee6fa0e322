"""The host's event loop: uvloop where installed (as uvicorn does), asyncio's own otherwise.

A board runs one connection and keeps asyncio's loop; a host with many boards does the
per-frame work (reads, writes, callbacks) in C on uvloop's libuv loop.
"""

from __future__ import annotations

import asyncio

from splitedge import SplitEdgeError
from splitedge.lifecycle import Runner

__all__ = ["LOOPS", "loop_runner"]

#: ``--loop`` choices: auto takes uvloop where it is installed (as uvicorn does), asyncio's own loop otherwise.
LOOPS = ("auto", "asyncio", "uvloop")


def loop_runner(choice: str = "asyncio") -> Runner:
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
