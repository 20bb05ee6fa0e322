"""Connections to several hosts by address, made on first use, kept, bounded, and made again after a failure.

Whoever talks to more than one host at once needs this: a host passing a chain's stage on to the
next hop (:mod:`host_runtime._peers`), and a board scattering a semantic split's fragments over a
fleet (:mod:`device_runtime.stream._fragments`). One connection per host, shared by every request
to it, never one per request; two callers asking for the same host at once share one connect.

A host is known by its *resolved* address, not by how a request spelled it: ``127.0.0.1:07767``,
``127.0.0.1:7767`` and ``localhost:7767`` are one connection (34 spellings of one host once
filled a host's 32 kept connections, and chains to any other host failed for more than a
minute). When the pool is full, the least recently used connection with no request waiting is
closed to make room; only when every one is busy is a new host refused.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections import OrderedDict

from device_runtime.link._client import Credentials, HostClient
from device_runtime.wire.ops import split_address
from splitedge.errors import HostUnavailableError

__all__ = ["MAX_CONNECTIONS", "ClientPool"]

#: Connections one pool keeps at most: a fleet's hosts.
MAX_CONNECTIONS = 32

Key = tuple[str, int]  # (IP address, port)


async def resolve(address: str) -> Key:
    """``host:port`` as the (IP address, port) it reaches: one key however the address is spelled."""
    try:
        host, port = split_address(address)
    except ValueError as exc:
        raise HostUnavailableError(str(exc)) from None
    try:
        return str(ipaddress.ip_address(host)), port
    except ValueError:
        pass
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise HostUnavailableError(f"{address}: cannot resolve {host} ({exc})") from None
    return str(ipaddress.ip_address(infos[0][4][0])), port


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
        self._clients: OrderedDict[Key, HostClient] = OrderedDict()  # least recently used first
        self._connecting: dict[Key, asyncio.Future[HostClient]] = {}

    def connected(self, address: str) -> HostClient | None:
        """The live connection to ``address`` as last connected (no connect, no lookup)."""
        for client in self._clients.values():
            if client.address == address and client.alive:
                return client
        return None

    async def client(self, address: str) -> HostClient:
        """The connection to ``address``, made (once, whoever asks at the same time) when there is none."""
        key = await resolve(address)
        client = self._clients.get(key)
        if client is not None and client.alive:
            self._clients.move_to_end(key)
            return client
        pending = self._connecting.get(key)
        if pending is None:
            await self._make_room(key, address)
            pending = asyncio.ensure_future(self._connect(key, address))
            self._connecting[key] = pending
            pending.add_done_callback(lambda _: self._connecting.pop(key, None))
        return await asyncio.shield(pending)

    async def _make_room(self, key: Key, address: str) -> None:
        """Close the least recently used idle (or dead) connection if the pool is full."""
        if key in self._clients or len(self._clients) + len(self._connecting) < self.limit:
            return
        for old, client in self._clients.items():
            if client.idle or not client.alive:
                del self._clients[old]
                await client.close()
                return
        raise HostUnavailableError(f"{self.what} {address}: already {self.limit} connections kept, each busy")

    async def _connect(self, key: Key, address: str) -> HostClient:
        host, port = split_address(address)
        client = await HostClient.connect(host, port, self.connect_timeout, credentials=self.credentials)
        old = self._clients.pop(key, None)
        if old is not None:
            await old.close()
        self._clients[key] = client
        return client

    async def drop(self, address: str) -> None:
        """Forget a connection that failed: the next request to ``address`` makes a new one."""
        try:
            key = await resolve(address)
        except HostUnavailableError:
            return
        client = self._clients.pop(key, None)
        if client is not None:
            await client.close()

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), OrderedDict()
        for client in clients:
            await client.close()
