"""Zeroconf registration of a host: announced at start, withdrawn on shutdown.

Withdrawing matters: a record left behind makes devices try a host that is gone until the
record's TTL expires. :class:`Advertiser` is an async context manager so the record is
removed on every exit path.

The record's ``load`` is kept current: given a function rather than a number, the
advertiser reads it every ``refresh_s`` (1 s) and re-announces the record when the value
it would publish changed, so devices choosing among hosts see the load of the last second
without a flood of multicast.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Callable, Sequence

import zeroconf
from zeroconf.asyncio import AsyncServiceInfo

from device_runtime.wire.txt import SERVICE_TYPE, open_zeroconf, txt_record

log = logging.getLogger("splitedge.host")


class Advertiser:
    """Register ``<name>._splitedge._tcp.local.`` for a host at ``address:port``.

    ``load`` is a fixed figure or a function read every ``refresh_s`` while registered.
    """

    def __init__(
        self,
        address: str,
        port: int,
        bundles: Sequence[str],
        interfaces: Sequence[str] | None = None,
        name: str | None = None,
        auth: bool = False,
        load: float | Callable[[], float] = 0.0,
        refresh_s: float = 1.0,
    ) -> None:
        self.name = name or f"splitedge-{socket.gethostname()}-{port}"
        self.interfaces = interfaces
        self.bundles = list(bundles)
        self.auth = auth
        self.refresh_s = refresh_s
        self._read_load = load if callable(load) else None
        initial_load = 0.0 if callable(load) else load  # a live load is first read one refresh after registering
        self.info = AsyncServiceInfo(
            SERVICE_TYPE,
            f"{self.name}.{SERVICE_TYPE}",
            addresses=[socket.inet_aton(address)],
            port=port,
            properties=txt_record(self.bundles, load=initial_load, auth=auth),
            server=f"{self.name}.local.",
        )
        self._zeroconf = None
        self._refresher: asyncio.Task[None] | None = None

    async def __aenter__(self) -> "Advertiser":
        self._zeroconf = open_zeroconf(self.interfaces)
        # allow_name_change: two hosts on one machine (tests, a fleet box) must not collide.
        await (await self._zeroconf.async_register_service(self.info, allow_name_change=True))
        if self._read_load is not None:
            self._refresher = asyncio.ensure_future(self._keep_load_current(self._read_load))
        return self

    async def update_load(self, load: float) -> bool:
        """Re-announce the record with ``load``; False (and no multicast) if that is what it says already."""
        assert self._zeroconf is not None, "the advertiser is not registered"
        properties = txt_record(self.bundles, load=load, auth=self.auth)
        if self.info.decoded_properties == properties:
            return False
        info = self.info
        # name and server as registered: allow_name_change may have renamed them.
        self.info = AsyncServiceInfo(SERVICE_TYPE, info.name, addresses=info.addresses, port=info.port,
                                     properties=properties, server=info.server)
        await (await self._zeroconf.async_update_service(self.info))
        return True

    async def _keep_load_current(self, read_load: Callable[[], float]) -> None:
        """Publish the load every ``refresh_s`` when it changed; runs until :meth:`__aexit__` cancels it."""
        while True:
            await asyncio.sleep(self.refresh_s)
            try:
                await self.update_load(read_load())
            except zeroconf.Error as exc:  # a missed refresh is stale for a second; it must not stop the host
                log.warning("zeroconf: could not refresh the load in the record: %r", exc)

    async def __aexit__(self, *exc: object) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
            self._refresher = None
        if self._zeroconf is not None:
            await (await self._zeroconf.async_unregister_service(self.info))
            await self._zeroconf.async_close()
            self._zeroconf = None


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
