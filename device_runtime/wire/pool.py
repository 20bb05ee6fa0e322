"""Connections to several hosts by address, made on first use, kept, bounded, and made again after a failure.

Whoever talks to more than one host at once needs this: a host passing a chain's stage on to the
next hop (:mod:`host_runtime.peers`), and a board scattering a semantic split's fragments over a
fleet (:mod:`device_runtime.stream.fragments`). One connection per host, shared by every request
to it, never one per request; two callers asking for the same host at once share one connect.
"""

from __future__ import annotations

import asyncio

from device_runtime.wire.client import Credentials, HostClient
from device_runtime.wire.ops import split_address
from splitedge import HostUnavailableError

__all__ = ["MAX_CONNECTIONS", "ClientPool"]

#: Connections one pool keeps at most: a fleet's hosts.
MAX_CONNECTIONS = 32


class ClientPool:
    """Connections to hosts by ``host:port``, made on first use."""

    def __init__(
        self, credentials: Credentials = Credentials(), connect_timeout: float = 5.0, limit: int = MAX_CONNECTIONS,
        what: str = "host",
    ) -> None:
        self.credentials = credentials
        self.connect_timeout = connect_timeout
        self.limit = limit
        self.what = what  # how errors name a connection's far end ("next hop", "fragment host")
        self._clients: dict[str, HostClient] = {}
        self._connecting: dict[str, asyncio.Future[HostClient]] = {}

    def connected(self, address: str) -> HostClient | None:
        """The live connection to ``address``, if there is one (no connect)."""
        client = self._clients.get(address)
        return client if client is not None and client.alive else None

    async def client(self, address: str) -> HostClient:
        """The connection to ``address``, made (once, whoever asks at the same time) when there is none."""
        client = self.connected(address)
        if client is not None:
            return client
        pending = self._connecting.get(address)
        if pending is None:
            if len(self._clients) >= self.limit and address not in self._clients:
                raise HostUnavailableError(f"{self.what} {address}: already {self.limit} connections kept")
            pending = asyncio.ensure_future(self._connect(address))
            self._connecting[address] = pending
            pending.add_done_callback(lambda _: self._connecting.pop(address, None))
        return await asyncio.shield(pending)

    async def _connect(self, address: str) -> HostClient:
        host, port = split_address(address)
        client = await HostClient.connect(host, port, self.connect_timeout, credentials=self.credentials)
        old = self._clients.pop(address, None)
        if old is not None:
            await old.close()
        self._clients[address] = client
        return client

    async def drop(self, address: str) -> None:
        """Forget a connection that failed: the next request to ``address`` makes a new one."""
        client = self._clients.pop(address, None)
        if client is not None:
            await client.close()

    async def close(self) -> None:
        for address in list(self._clients):
            await self.drop(address)
