"""Zeroconf discovery: hosts advertise ``_splitedge._tcp.local.``, devices browse for them.

The TXT record is the contract between the two (:mod:`device_runtime.wire.txt`): protocol
version, the bundle ids served, the current load and whether frames must be authenticated.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Sequence

from zeroconf import IPVersion, ServiceStateChange, Zeroconf
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo

from device_runtime.wire.txt import SERVICE_TYPE, open_zeroconf, parse_txt

log = logging.getLogger("splitedge.device")

@dataclass(frozen=True)
class HostAdvert:
    """One host as its zeroconf record describes it."""

    name: str
    address: str
    port: int
    protocol: int
    bundles: tuple[str, ...]
    load: float
    auth: bool

    def serves(self, bundle_id: str) -> bool:
        return bundle_id in self.bundles


def parse_advert(info: AsyncServiceInfo) -> HostAdvert | None:
    """None for a record that is not ours to use (malformed, other protocol version, no address)."""
    record, why = parse_txt(info.properties)
    addresses = info.parsed_addresses(IPVersion.V4Only)
    if record is None or not addresses or info.port is None:
        log.debug("ignoring zeroconf record %s: %s", info.name, why or "no IPv4 address or port")
        return None
    return HostAdvert(
        name=info.name,
        address=addresses[0],
        port=info.port,
        protocol=record.protocol,
        bundles=record.bundles,
        load=record.load,
        auth=record.auth,
    )


async def discover(
    bundle_id: str | None = None, interfaces: Sequence[str] | None = None, timeout: float = 3.0
) -> list[HostAdvert]:
    """Browse for up to ``timeout`` seconds; hosts serving ``bundle_id``, least loaded first.

    Returns as soon as one matching host is resolved and the browser has had a short
    moment to hear the others, so a device does not always wait the full timeout.
    """
    aiozc = open_zeroconf(interfaces)
    names: asyncio.Queue[str] = asyncio.Queue()

    def on_change(zeroconf: Zeroconf, service_type: str, name: str, state_change: ServiceStateChange) -> None:
        if state_change in (ServiceStateChange.Added, ServiceStateChange.Updated):
            names.put_nowait(name)

    browser = AsyncServiceBrowser(aiozc.zeroconf, SERVICE_TYPE, handlers=[on_change])
    found: dict[str, HostAdvert] = {}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        while (remaining := deadline - loop.time()) > 0:
            try:
                name = await asyncio.wait_for(names.get(), remaining)
            except asyncio.TimeoutError:
                break
            info = AsyncServiceInfo(SERVICE_TYPE, name)
            if not await info.async_request(aiozc.zeroconf, int(min(remaining, 3.0) * 1000)):
                continue
            advert = parse_advert(info)
            if advert is not None and (bundle_id is None or advert.serves(bundle_id)):
                found[name] = advert
                deadline = min(deadline, loop.time() + 0.5)  # a moment for other hosts to answer
    finally:
        await browser.async_cancel()
        await aiozc.async_close()
    return sorted(found.values(), key=lambda a: (a.load, a.name))
