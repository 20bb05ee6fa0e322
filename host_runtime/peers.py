"""The hosts this host passes a chain's requests on to: one connection per peer, kept and reused.

A request for a chain's stage carries its route (:class:`~device_runtime.wire.ops.Hop`): this
host runs its stage and sends the result to the next hop as any device would, with the protocol's
one client (:class:`~device_runtime.hosts.client.HostClient`) and this host's own key, so a hop
that authenticates frames takes it only from hosts of the same fleet.

Who may be a next hop is a wall, not a convenience: a route names addresses, and a host that
dialled whatever a request named would let any peer make it open connections anywhere. A host
with a key forwards only requests that were authenticated with it (every frame it reads is), to
any address; a host without one cannot tell a board of its fleet from anyone, so it forwards
only to the peers it was given (``--peer``), and refuses the route otherwise. Connections are
bounded in number (:data:`MAX_PEERS`); one that fails is dropped and made again on next use.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from device_runtime.hosts.client import Credentials, HostClient
from device_runtime.wire.ops import split_address
from splitedge.errors import HostUnavailableError, ProtocolError

__all__ = ["MAX_PEERS", "Peers"]

#: Connections to next hops one host keeps at most: a fleet's hosts, never one per request.
MAX_PEERS = 32


class Peers:
    """Connections to next hops, made on first use."""

    def __init__(
        self, credentials: Credentials = Credentials(), allowed: Iterable[str] = (), connect_timeout: float = 5.0,
    ) -> None:
        self.credentials = credentials
        self.allowed = frozenset(allowed)  # --peer addresses; with a key, any address may be a next hop
        self.connect_timeout = connect_timeout
        self._clients: dict[str, HostClient] = {}
        self._connecting: dict[str, asyncio.Future[HostClient]] = {}

    def check(self, address: str) -> None:
        """Refuse a next hop this host may not dial (``unauthorized``, naming it and what to do)."""
        if self.credentials.key is None and address not in self.allowed:
            given = ", ".join(sorted(self.allowed)) or "none"
            raise ProtocolError(
                f"route: next hop {address} is not one of this host's peers ({given}): a host without a key "
                "passes requests on only to the hosts given with --peer (or give the fleet a key, --key-file)",
                code="unauthorized",
            )

    async def client(self, address: str) -> HostClient:
        """The connection to ``address``, made (once, whoever asks at the same time) when there is none."""
        client = self._clients.get(address)
        if client is not None and client.alive:
            return client
        pending = self._connecting.get(address)
        if pending is None:
            if len(self._clients) >= MAX_PEERS and address not in self._clients:
                raise HostUnavailableError(f"next hop {address}: this host already keeps {MAX_PEERS} peer connections")
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
