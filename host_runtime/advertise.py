"""Zeroconf registration of a host: announced at start, withdrawn on shutdown.

Withdrawing matters: a record left behind makes devices try a host that is gone until the
record's TTL expires. :class:`Advertiser` is an async context manager so the record is
removed on every exit path.
"""

from __future__ import annotations

import socket
from typing import Sequence

from zeroconf.asyncio import AsyncServiceInfo

from device_runtime.discovery import SERVICE_TYPE, open_zeroconf, txt_record


class Advertiser:
    """Register ``<name>._splitedge._tcp.local.`` for a host at ``address:port``."""

    def __init__(
        self,
        address: str,
        port: int,
        bundles: Sequence[str],
        interfaces: Sequence[str] | None = None,
        name: str | None = None,
        auth: bool = False,
        load: float = 0.0,
    ) -> None:
        self.name = name or f"splitedge-{socket.gethostname()}-{port}"
        self.interfaces = interfaces
        self.info = AsyncServiceInfo(
            SERVICE_TYPE,
            f"{self.name}.{SERVICE_TYPE}",
            addresses=[socket.inet_aton(address)],
            port=port,
            properties=txt_record(bundles, load=load, auth=auth),
            server=f"{self.name}.local.",
        )
        self._zeroconf = None

    async def __aenter__(self) -> "Advertiser":
        self._zeroconf = open_zeroconf(self.interfaces)
        # allow_name_change: two hosts on one machine (tests, a fleet box) must not collide.
        await (await self._zeroconf.async_register_service(self.info, allow_name_change=True))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._zeroconf is not None:
            await (await self._zeroconf.async_unregister_service(self.info))
            await self._zeroconf.async_close()
            self._zeroconf = None
