"""What the host-under-load tests share: cut tensors, the tails run directly, raw infer replies."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from device_runtime.bundle import Bundle
from device_runtime.engine.backend import OnnxBackend
from device_runtime.hosts.client import HostClient
from splitedge.errors import RemoteError
from tests.conftest import RunningHost


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
