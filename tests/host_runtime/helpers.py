"""What the host-under-load tests share: cut tensors, the tails run directly, raw infer replies,
and ``split-host serve`` in a process of its own."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from device_runtime.bundle import Bundle
from device_runtime.engine._backend import OnnxBackend
from device_runtime.link import HostClient
from splitedge.errors import RemoteError
from tests.conftest import RunningHost


class Held:
    """A real tail that, once started, holds its worker until the test lets it go: how long a batch
    runs, or how long requests stay queued, is then the test's to say, not the machine's (a busy
    machine once let a host read a frame only after a fast batch had ended)."""

    def __init__(self, tail) -> None:
        self.tail, self.started, self.go = tail, threading.Event(), threading.Event()

    def run(self, x: np.ndarray) -> np.ndarray:
        self.started.set()
        assert self.go.wait(30), "the test never let the batch finish"
        return self.tail.run(x)

    def __getattr__(self, name: str):
        return getattr(self.tail, name)


def cut(bundle: Bundle, split_id: str, batch: int, seed: int = 0) -> np.ndarray:
    """Seeded noise of the split's cut shape (B, ...): a tail computes on any float32."""
    shape = (batch, *bundle.manifest.split(split_id).tensor.shape)
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def unbatched(bundle: Bundle, split_id: str, tensors: list[np.ndarray]) -> list[np.ndarray]:
    """Each tensor through the tail alone, in a session of this process: the reference for batching."""
    tail = OnnxBackend(bundle.artifact(split_id, "tail"), threads=1)
    return [tail.run(t) for t in tensors]


async def infer(client: HostClient, bundle_id: str, split_id: str, tensor: np.ndarray, **fields: Any) -> dict[str, Any]:
    """The whole infer reply (with ``batch``), or ``{"error": code}`` for a typed error reply."""
    try:
        return await client.request({"op": "infer", "bundle": bundle_id, "split": split_id, **fields}, 30.0, tensor)
    except RemoteError as exc:
        return {"error": exc.code, "message": exc.message}


def run_with_client(host: RunningHost, session) -> Any:
    """``asyncio.run(session(client))`` with a client connected to ``host``, closed afterwards."""

    async def go() -> Any:
        client = await HostClient.connect(host.host, host.port)
        try:
            return await session(client)
        finally:
            await client.close()

    return asyncio.run(go())


def serve_process(bundle_dir: Path, log: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``split-host serve`` on 127.0.0.1, a free port, no zeroconf, its output in ``log``: a file,
    not a pipe, which nobody would read and which would block the host once full."""
    command = [sys.executable, "-m", "host_runtime.cli", "serve", str(bundle_dir), "--interface", "127.0.0.1",
               "--port", "0", "--no-zeroconf", *args]
    with log.open("wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **(env or {})})


def port_from_log(process: subprocess.Popen, log: Path, timeout: float = 60.0) -> int:
    """The port the host printed it listens on (``listening on 127.0.0.1:PORT; ...``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("listening on "):
                return int(line.split()[2].rstrip(";").rsplit(":", 1)[1])
        assert process.poll() is None, f"split-host serve exited ({process.returncode}):\n{log.read_text()}"
        time.sleep(0.05)
    raise AssertionError(f"split-host serve did not listen within {timeout:g} s:\n{log.read_text()}")
