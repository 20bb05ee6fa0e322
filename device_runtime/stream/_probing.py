"""Probing the link to the connected host: the rate estimate the split policy chooses with.

The stream's own transfers keep the estimate (:class:`~device_runtime.hosts.LinkMeter`) fresh
while it offloads; while nothing is offloaded it ages, and probes refresh it so the policy can
come back to a remote split.
"""

from __future__ import annotations

import asyncio

from device_runtime.hosts import HostLink, LinkMeter, probe_bytes
from device_runtime.stream._config import PipelineConfig
from device_runtime.stream._handoff import InFlight
from device_runtime.link import HostClient
from splitedge.errors import HostUnavailableError, RemoteError

__all__ = ["LinkProber"]


class LinkProber:
    """Measures the link to the connected host into ``meter``: at the start, and while it idles."""

    def __init__(self, hosts: HostLink | None, meter: LinkMeter, config: PipelineConfig, in_flight: InFlight) -> None:
        self.hosts, self.meter, self.config, self.in_flight = hosts, meter, config, in_flight

    async def when_idle(self) -> None:
        """While nothing is offloaded the estimate ages: refresh it so the policy can come back."""
        while True:
            await asyncio.sleep(self.config.probe_every_s)
            client = self.hosts.client if self.hosts is not None else None
            if client is not None and self.in_flight.count == 0 and self.meter.stale(self.config.probe_every_s):
                await self.probe(client)

    async def probe(self, client: HostClient) -> None:
        """A small ping (round trip) and a payload ping (rate), sized for the current estimate.

        A payload crossing much faster than the estimate said is too short to measure the link
        (fixed costs dominate it), so one longer payload follows when the first one's own rate
        asks for a probe twice its size: on a 1 Gbit/s link the first, 64 KB, probe read
        ~300 Mbit/s from the board. Its own rate, not the estimate after it: a short sample
        barely moves the estimate (or none, crossing within a bare ping's time), and after a
        link that was 0.5 Mbit/s came back, 16 KB probes alone held the estimate there for
        seconds on end.
        """
        try:
            self.meter.observe_probe(0, await client.ping(0, timeout=self.config.request_timeout_s))
            size = probe_bytes(self.meter.rate_bps)
            measured = await self._payload_probe(client, size)
            longer = probe_bytes(measured)
            if longer >= 2 * size:
                await self._payload_probe(client, longer)
        except HostUnavailableError as exc:
            if self.hosts is not None:
                await self.hosts.lost(client, exc)
        except RemoteError:
            return

    async def _payload_probe(self, client: HostClient, size: int) -> float | None:
        """One payload probe into the estimate; returns its own rate (:meth:`LinkMeter.observe_probe`).

        While it crosses it holds the link as an upload does: a frame sent meanwhile waits
        behind it in the socket, so an overdue probe caps the estimate too. Unseen by the meter,
        a 1 MB probe sized for loopback that went up as the link dropped to 0.5 Mbit/s (17 s to
        cross) let the next frames go remote on the stale estimate, to wait behind it until their
        10 s timeout (issue 28). One that times out bounds the link as a failed upload does
        (:meth:`LinkMeter.failed`).
        """
        ticket = self.meter.sending(size)
        try:
            probe = await client.probe(size, timeout=self.config.request_timeout_s)
        except (HostUnavailableError, RemoteError) as exc:
            self.meter.failed(ticket, exc)
            raise
        finally:
            self.meter.settled(ticket)
        return self.meter.observe_probe(size, probe.round_trip_ms, probe.upload)
