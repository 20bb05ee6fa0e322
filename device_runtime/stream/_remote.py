"""A finished head answered on the connected host: the cut sent, the tail's reply read, a failure answered here.

Each request carries the frame's budget as its deadline (a live camera's frame interval): a host
whose queue would answer later refuses it at once, and the batch runs on the board; only a host
silent for ``request_timeout_s`` is taken for gone, and the host link looks for it again.

A chain (several cuts, its stages on a row of hosts) is sent to the connected host as stage 1 with
the route of the stages after it (``PipelineConfig.routes``); the host passes it on and the reply
says where the time went; a chain that breaks anywhere is answered on the board, like any split. A
host that refuses a chain's route (``unauthorized``: a next hop it may not dial) is configured so,
which no retry changes: the chain is left out while that host is the one connected.
"""

from __future__ import annotations

import logging

from device_runtime.hosts import HostLink, LinkMeter
from device_runtime.stream._board_engine import BoardEngine
from device_runtime.stream._config import PipelineConfig
from device_runtime.stream._handoff import HeadDone, InFlight
from device_runtime.stream._policy import SplitPolicy
from device_runtime.stream._results import FrameResult
from device_runtime.link import Deadline, HostClient, InferResult, Leg
from device_runtime.wire import ErrorCode
from device_runtime.wire.ops import Hop
from splitedge.errors import HostUnavailableError, RemoteError

__all__ = ["HostAnswers"]

log = logging.getLogger("splitedge.device")


class HostAnswers:
    """Answers heads on the connected host, a chain's with its route, and remembers the routes refused."""

    def __init__(
        self, engine: BoardEngine, policy: SplitPolicy, hosts: HostLink | None, meter: LinkMeter,
        config: PipelineConfig, in_flight: InFlight,
    ) -> None:
        self.engine, self.policy, self.hosts, self.meter, self.config = engine, policy, hosts, meter, config
        self.in_flight = in_flight
        # (chain, host) pairs whose host refused the chain's route: left out while that host is connected.
        self._refused: set[tuple[str, str]] = set()

    def refused(self, chain: str, address: str) -> bool:
        """Whether the host at ``address`` refused ``chain``'s route in this run."""
        return (chain, address) in self._refused

    async def answer(self, done: HeadDone, client: HostClient) -> list[FrameResult]:
        """Send the cut and wait for the tail; on any failure answer the batch here instead."""
        try:
            result = await self._send(done, client)
        except (HostUnavailableError, RemoteError) as exc:
            if isinstance(exc, HostUnavailableError) and self.hosts is not None:
                await self.hosts.lost(client, exc)
            elif isinstance(exc, RemoteError) and exc.code == ErrorCode.UNAUTHORIZED and done.split in self.config.routes:
                self._refuse(done.split, client.address, exc)
            return await self.engine.fallback(done, exc)
        self.meter.observe_reply(done.tensor.nbytes, result)
        hops = result.hops  # a chain's later hosts: their stages, queues and links are the tail's too
        tail_ms = result.compute_ms + sum(h.compute_ms for h in hops)
        self.policy.observe_tail(done.split, len(done.batch), tail_ms)
        return done.answered(
            " > ".join((client.address, *(h.address for h in hops))),
            transfer_ms=result.transfer_ms + sum(h.link_ms for h in hops), tail_ms=tail_ms,
            host_queue_ms=result.queue_ms + sum(h.queue_ms for h in hops),
        ).results(done.batch, result.output, self.engine.runner.labels)

    def _refuse(self, chain: str, address: str, exc: Exception) -> None:
        """Leave ``chain`` out while ``address`` is the connected host, saying so once."""
        if (chain, address) not in self._refused:
            self._refused.add((chain, address))
            log.warning("chain %s left out of this run while host %s is the one connected: %s", chain, address, exc)

    async def _send(self, done: HeadDone, client: HostClient) -> InferResult:
        """One remote request, holding one of the ``in_flight`` slots and known to the meter until it
        settles. One that fails or is refused tells the meter how (:meth:`LinkMeter.failed`): an
        overdue upload that never got its reply bounds the link, or the field trial's board sent
        150 KB frames into a link collapsed to 0.5 Mbit/s on an estimate still at 49."""
        tensor, deadline = done.tensor, done.deadline
        ticket = self.meter.sending(tensor.nbytes)
        route = self._route(done.split, client.address)
        # What the board would do instead, and its time: the host holds the request to the later of the
        # two (InferRequest.give_up_ms), and so may have held a refused one that long.
        alternative = None if deadline is None else self.policy.alternative(len(done.batch))
        try:
            return await client.infer(  # a coded option's split: its coding travels in the tensor's fields
                self.engine.runner.bundle.id, self.engine.runner.option(done.split)[0], tensor, self.config.request_timeout_s,
                None if deadline is None else Deadline(deadline, alternative),
                None if route is None else Leg(1, route), **done.fields,
            )
        except (HostUnavailableError, RemoteError) as exc:
            held_ms = deadline if deadline is None or alternative is None else max(deadline, alternative[1])
            self.meter.failed(ticket, exc, held_ms)
            raise
        finally:
            self.meter.settled(ticket)
            self.in_flight.give_back()

    def _route(self, split: str, first: str) -> tuple[Hop, ...] | None:
        """A chain's hops after its first host ``first`` (None: ``split`` is no chain)."""
        addresses = self.config.routes.get(split)
        if addresses is None:
            return None
        stages = self.engine.runner.bundle.manifest.split(split).stages[1:]
        return tuple(Hop(address, split, stage.index) for address, stage in zip(addresses or (first,) * len(stages), stages))
