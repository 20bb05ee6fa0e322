"""A real ``split-host serve`` behind an emulated link: the host side of a field-trial rehearsal.

The host runs in the link's network namespace (so everything it sends and receives crosses
the shaped veth); the caller, in the root namespace, plays the board.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, Sequence

from splitedge.errors import HostUnavailableError
from testbed._kernel_link import EmulatedLink

__all__ = ["relay_in", "running_host", "serve_in", "wait_listening"]

DEFAULT_PORT = 7767


def wait_listening(address: str, port: int, timeout: float = 60.0, process: subprocess.Popen | None = None) -> None:
    """Return once ``address:port`` accepts connections; :class:`HostUnavailableError` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise HostUnavailableError(f"the host exited with status {process.returncode} before listening")
        try:
            socket.create_connection((address, port), timeout=1.0).close()
            return
        except OSError:
            time.sleep(0.2)
    raise HostUnavailableError(f"the host did not listen on {address}:{port} within {timeout:g} s")


@contextlib.contextmanager
def serve_in(
    link: EmulatedLink, bundles: Sequence[str | Path], port: int = DEFAULT_PORT, args: Sequence[str] = ()
) -> Iterator[str]:
    """Serve ``bundles`` inside ``link``'s namespace; yields ``ADDRESS:PORT`` for the board side.
    The host is stopped with SIGINT (a clean shutdown) when the block ends."""
    process = link.popen(
        [sys.executable, "-m", "host_runtime.cli", "serve", *map(str, bundles), "--port", str(port), "--no-zeroconf",
         *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    with running_host(process, link.namespace_address, port) as address:
        yield address


#: ``python -c`` for :func:`relay_in`: a :class:`~testbed.DelayRelay` inside the namespace until killed.
_RELAY = """
import asyncio, sys
from testbed._relay import DelayRelay
async def main():
    relay = DelayRelay((sys.argv[1], int(sys.argv[2])), float(sys.argv[3]), listen=(sys.argv[1], int(sys.argv[4])))
    await relay.start()
    await asyncio.Event().wait()
asyncio.run(main())
"""


@contextlib.contextmanager
def relay_in(link: EmulatedLink, port: int, delay_ms: float, relay_port: int) -> Iterator[str]:
    """A :class:`~testbed.DelayRelay` adding ``delay_ms`` each way in front of the host on ``port``,
    inside ``link``'s namespace; yields ``ADDRESS:PORT`` for the board side.

    Inside, not in front of the veth: the relay's kernel acknowledges what it receives, and a relay
    on the board's side of the shaped link acknowledged every upload at loopback speed, so a board
    timing its uploads by the kernel's acknowledgements (as it does) read a 20 Mbit/s link as
    1-5 Gbit/s. Here the acknowledgements cross the shaped link, as a host's do in the field.
    """
    address = link.namespace_address
    process = link.popen([sys.executable, "-c", _RELAY, address, str(port), f"{delay_ms:g}", str(relay_port)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=Path(__file__).resolve().parents[1])
    try:
        wait_listening(address, relay_port, process=process)
        yield f"{address}:{relay_port}"
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)


def own_peer(link: EmulatedLink, port: int = DEFAULT_PORT) -> list[str]:
    """``split-host serve`` arguments that let the host in ``link``'s namespace pass a chain's later
    stages on to itself: a calibration without routes puts every stage of a chain on the connected
    host, and a host without a key passes stages on only to its ``--peer`` s."""
    return ["--peer", f"{link.namespace_address}:{port}"]


@contextlib.contextmanager
def running_host(process: subprocess.Popen, address: str, port: int) -> Iterator[str]:
    """Yields ``ADDRESS:PORT`` once ``process`` (a ``split-host serve``) listens there; stops it with
    SIGINT when the block ends (a clean shutdown), and kills it if that takes over 10 s."""
    try:
        wait_listening(address, port, process=process)
        yield f"{address}:{port}"
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
