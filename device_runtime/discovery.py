"""Zeroconf discovery: hosts advertise ``_splitedge._tcp.local.``, devices browse for them.

The TXT record is the contract between the two: protocol version, the bundle ids served,
the current load and whether frames must be authenticated. It is defined here, in the
lightest package, and the host builds its record with :func:`txt_record`.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from typing import Sequence

from zeroconf import IPVersion, ServiceStateChange, Zeroconf
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

from device_runtime.protocol import PROTOCOL_VERSION

SERVICE_TYPE = "_splitedge._tcp.local."


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


def txt_record(bundles: Sequence[str], load: float = 0.0, auth: bool = False) -> dict[str, str]:
    return {
        "proto": str(PROTOCOL_VERSION),
        "bundles": ",".join(bundles),
        "load": f"{load:.3f}",
        "auth": "1" if auth else "0",
    }


def parse_advert(info: AsyncServiceInfo) -> HostAdvert | None:
    """None for a record that is not ours to use (other protocol version, no address)."""
    props = {k.decode(): (v or b"").decode() for k, v in info.properties.items()}
    addresses = info.parsed_addresses(IPVersion.V4Only)
    try:
        protocol = int(props.get("proto", "0"))
        load = float(props.get("load", "0"))
    except ValueError:
        return None
    if protocol != PROTOCOL_VERSION or not addresses or info.port is None:
        return None
    return HostAdvert(
        name=info.name,
        address=addresses[0],
        port=info.port,
        protocol=protocol,
        bundles=tuple(b for b in props.get("bundles", "").split(",") if b),
        load=load,
        auth=props.get("auth") == "1",
    )


def open_zeroconf(interfaces: Sequence[str] | None) -> AsyncZeroconf:
    """Zeroconf on the given interface addresses only (tests pass ``["127.0.0.1"]``)."""
    if interfaces:
        return AsyncZeroconf(interfaces=list(interfaces), ip_version=IPVersion.V4Only)
    return AsyncZeroconf(ip_version=IPVersion.V4Only)


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


def local_address_for(interface: str | None) -> str:
    """The IPv4 address a host advertises: the interface given, or the one routing outward."""
    if interface and interface not in ("0.0.0.0", ""):
        return interface
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent, only a route looked up
            return probe.getsockname()[0]
        except OSError:
            return "127.0.0.1"
