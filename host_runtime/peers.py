"""The hosts this host passes a chain's requests on to: one connection per peer, kept and reused.

A request for a chain's stage carries its route (:class:`~device_runtime.wire.ops.Hop`): this
host runs its stage and sends the result to the next hop as any device would, with the protocol's
one client (:class:`~device_runtime.wire.client.HostClient`) and this host's own key, so a hop
that authenticates frames takes it only from hosts of the same fleet.

Who may be a next hop is a wall, not a convenience: a route names addresses, and a host that
dialled whatever a request named would let any peer make it open connections anywhere. A host
with a key forwards only requests that were authenticated with it (every frame it reads is), to
any address; a host without one cannot tell a board of its fleet from anyone, so it forwards
only to the peers it was given (``--peer``), and refuses the route otherwise. Connections are
bounded in number (:data:`MAX_PEERS`); one that fails is dropped and made again on next use.
"""

from __future__ import annotations

from collections.abc import Iterable

from device_runtime.wire import ClientPool, Credentials, ErrorCode
from splitedge import ProtocolError

__all__ = ["MAX_PEERS", "Peers"]

#: Connections to next hops one host keeps at most: a fleet's hosts, never one per request.
MAX_PEERS = 32


class Peers(ClientPool):
    """Connections to next hops, made on first use, to the hosts this host may dial."""

    def __init__(
        self, credentials: Credentials = Credentials(), allowed: Iterable[str] = (), connect_timeout: float = 5.0,
    ) -> None:
        super().__init__(credentials, connect_timeout, MAX_PEERS, what="next hop")
        self.allowed = frozenset(allowed)  # --peer addresses; with a key, any address may be a next hop

    def check(self, address: str) -> None:
        """Refuse a next hop this host may not dial (``unauthorized``, naming it and what to do)."""
        if self.credentials.key is None and address not in self.allowed:
            given = ", ".join(sorted(self.allowed)) or "none"
            raise ProtocolError(
                f"route: next hop {address} is not one of this host's peers ({given}): a host without a key "
                "passes requests on only to the hosts given with --peer (or give the fleet a key, --key-file)",
                code=ErrorCode.UNAUTHORIZED,
            )
