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

from splitedge import HostUnavailableError
from testbed.kernel_link import EmulatedLink

__all__ = ["running_host", "serve_in", "wait_listening"]

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
