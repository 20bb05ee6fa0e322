"""The hosts this host passes a chain's requests on to: one connection per peer, kept and reused.

A request for a chain's stage carries its route (:class:`~device_runtime.wire.ops.Hop`): this
host runs its stage and sends the result to the next hop as any device would, with the protocol's
one client (:class:`~device_runtime.link.HostClient`) and this host's own key, so a hop
that authenticates frames takes it only from hosts of the same fleet.

Who may be a next hop is a wall, not a convenience: a route names addresses, and a host that
dialled whatever a request named would let any peer make it open connections anywhere. A host
with a key forwards only requests that were authenticated with it (every frame it reads is), to
any address; a host without one cannot tell a board of its fleet from anyone, so it forwards
only to the peers it was given (``--peer``), and refuses the route otherwise. Connections are
bounded in number (:data:`MAX_PEERS`); one that fails is dropped and made again on next use.

The same connections measure the links to peers a board asks about (``links``): what was
measured is kept for ``hello``, so boards placing a chain know the links between its hosts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import Any

from device_runtime.link import ClientPool, Credentials, Deadline, Leg
from device_runtime.wire import ErrorCode
from device_runtime.wire.ops import HopTiming, InferRequest, LinksRequest
from splitedge import SplitEdgeError
from splitedge.errors import ProtocolError, RemoteError

__all__ = ["MAX_PEERS", "Peers"]

#: Connections to next hops one host keeps at most: a fleet's hosts, never one per request.
MAX_PEERS = 32

log = logging.getLogger("splitedge.host")


class Peers(ClientPool):
    """Connections to next hops, made on first use, to the hosts this host may dial."""

    def __init__(
        self, key: bytes | None = None, allowed: Iterable[str] = (), connect_timeout: float = 5.0,
        forward_timeout: float = 10.0,
    ) -> None:
        super().__init__(Credentials(key=key), connect_timeout, MAX_PEERS, what="next hop")
        self.allowed = frozenset(allowed)  # --peer addresses; with a key, any address may be a next hop
        self.forward_timeout = forward_timeout  # s to wait for a next hop's answer when the request has no deadline
        self.links: dict[str, tuple[float, float]] = {}  # peer -> (rate bit/s, round trip ms), last measured
        self.measuring = asyncio.Lock()  # one links measurement at a time

    def check(self, address: str) -> None:
        """Refuse a next hop this host may not dial (``unauthorized``, naming it and what to do)."""
        if self.credentials.key is None and address not in self.allowed:
            given = ", ".join(sorted(self.allowed)) or "none"
            raise ProtocolError(
                f"route: next hop {address} is not one of this host's peers ({given}): a host without a key "
                "passes requests on only to the hosts given with --peer (or give the fleet a key, --key-file)",
                code=ErrorCode.UNAUTHORIZED,
            )

    async def forward(self, request: InferRequest, output: Any, deadline: float | None) -> tuple[Any, tuple[HopTiming, ...]]:
        """Send this stage's ``output`` to the next hop with the rest of the route, within what is
        left of ``deadline`` (``time.perf_counter``); returns the last stage's output and the times of
        every hop from the next one on. A hop that fails raises :class:`~splitedge.errors.ProtocolError`
        with its own code (``hop_failed`` where it could not be reached), the message naming the
        hop, so the board knows where the chain broke."""
        hop, rest = request.route[0], request.route[1:]
        where = f"stage {hop.stage} of {request.split} at {hop.address}"
        try:
            left_s = None if deadline is None else deadline - time.perf_counter()
            if left_s is not None and left_s <= 0:
                raise RemoteError(ErrorCode.DEADLINE_EXCEEDED, f"the deadline passed before {where}")
            timeout = self.forward_timeout if left_s is None else min(self.forward_timeout, left_s + 1.0)
            client = await self.client(hop.address)
            reply = await client.infer(request.bundle, hop.split, output, timeout,
                                       None if left_s is None else Deadline(left_s * 1000.0), Leg(hop.stage, rest))
        except RemoteError as exc:
            raise ProtocolError(f"{where}: {exc.message}", exc.code) from None  # the hop's own code, passed on
        except SplitEdgeError as exc:  # unreachable, lost, silent, or refused us
            await self.drop(hop.address)
            raise ProtocolError(f"{where}: {exc}", ErrorCode.HOP_FAILED) from None
        except Exception as exc:
            log.exception("forwarding to %s failed", hop.address)
            raise ProtocolError(f"{where}: {exc}", ErrorCode.INTERNAL) from None
        link_ms = max(reply.round_trip_ms - reply.queue_ms - reply.compute_ms - reply.downstream_ms, 0.0)
        return reply.output, (HopTiming(hop.address, hop.stage, reply.queue_ms, reply.compute_ms, link_ms, reply.batch),
                              *reply.hops)

    async def measure(self, request: LinksRequest) -> tuple[dict[str, tuple[float, float]], dict[str, str]]:
        """Ping each peer asked for, bare and with ``bytes``, one peer and one request at a time
        (a few hundred kB each: no wall needed beyond that); keep what was measured for ``hello``.
        Returns the links measured (rate bit/s, round trip ms) and why the others failed."""
        links: dict[str, tuple[float, float]] = {}
        failed: dict[str, str] = {}
        async with self.measuring:
            for address in request.peers:
                try:
                    self.check(address)
                    client = await self.client(address)
                    rtt_ms = await client.ping(0, timeout=self.forward_timeout)
                    probe = await client.probe(request.bytes, timeout=self.forward_timeout)
                    links[address] = (request.bytes * 8 * 1000.0 / max(probe.round_trip_ms - rtt_ms, 1e-3), rtt_ms)
                except SplitEdgeError as exc:  # not allowed (ProtocolError), unreachable, silent
                    await self.drop(address)
                    failed[address] = str(exc)
        self.links.update(links)
        return links, failed
