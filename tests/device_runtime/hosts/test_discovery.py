"""Zeroconf on 127.0.0.1 only: a host is found, filtered by bundle, and gone once withdrawn."""

from __future__ import annotations

import asyncio

from device_runtime.hosts._discovery import discover
from host_runtime._advertise import Advertiser

LOOPBACK = ["127.0.0.1"]


def test_advertised_host_is_found_and_withdrawn() -> None:
    async def go():
        async with Advertiser("127.0.0.1", 45678, ["bundle-a", "bundle-b"], LOOPBACK, name="test-host-a") as ad:
            found = await discover("bundle-b", LOOPBACK, timeout=3)
            other = await discover("bundle-z", LOOPBACK, timeout=0.5)
            name = ad.info.name
        after = await discover(None, LOOPBACK, timeout=1.0)
        return found, other, name, after

    found, other, name, after = asyncio.run(go())
    assert [(h.address, h.port, h.bundles, h.auth) for h in found] == [("127.0.0.1", 45678, ("bundle-a", "bundle-b"), False)]
    assert other == []  # a host that does not serve the bundle is not offered
    assert name not in {h.name for h in after}  # the record was withdrawn on exit


def test_two_hosts_least_loaded_first() -> None:
    async def go():
        async with Advertiser("127.0.0.1", 45001, ["b"], LOOPBACK, name="test-busy", load=0.9):
            async with Advertiser("127.0.0.1", 45002, ["b"], LOOPBACK, name="test-idle", load=0.1):
                return await discover("b", LOOPBACK, timeout=3)

    found = asyncio.run(go())
    assert [(h.port, h.load) for h in found] == [(45002, 0.1), (45001, 0.9)]
