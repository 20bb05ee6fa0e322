"""The device's host, or none: connect, notice the loss, find one again in the background.

A board in the field loses its host (a restart, a walk out of Wi-Fi range) and must carry
on locally, then go back to offloading without a restart. :class:`HostLink` holds the
current :class:`HostClient`; the pipeline reports a failure with :meth:`lost`, and a
background task tries again every ``retry_s`` (zeroconf for ``auto``, else the address
given), each attempt bounded by ``timeout``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Sequence

from device_runtime.bundle import Bundle
from device_runtime.link import Credentials, HostClient
from device_runtime.hosts._connect import connect_host, host_address
from splitedge.errors import HostUnavailableError

__all__ = ["HostLink"]

log = logging.getLogger("splitedge.device")


class HostLink:
    """The current host connection for one bundle; ``client`` is None while there is none.

    A malformed ``spec`` is refused here (:class:`HostUnavailableError`): no retry can mend it.
    """

    def __init__(
        self, bundle: Bundle, spec: str, interfaces: Sequence[str] | None = None, timeout: float = 5.0,
        retry_s: float = 1.0, credentials: Credentials = Credentials(),
    ) -> None:
        if spec != "auto":
            host_address(spec)
        self.bundle, self.spec, self.interfaces = bundle, spec, interfaces
        self.credentials = credentials
        self.timeout, self.retry_s = timeout, retry_s
        self.client: HostClient | None = None
        self.last_error: str | None = None
        self.losses = 0
        self._retry: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def address(self) -> str | None:
        return self.client.address if self.client is not None else None

    def served(self) -> frozenset[str]:
        """Split ids the current host has tails for (``offload`` included); empty without a host."""
        if self.client is None:
            return frozenset()
        return frozenset(self.client.server_info.get("bundles", {}).get(self.bundle.id, ()))

    async def connect(self) -> bool:
        """One attempt now; on failure the background retries start. True when connected."""
        try:
            self.client = await connect_host(
                self.bundle, self.spec, self.interfaces, timeout=self.timeout, credentials=self.credentials
            )
        except HostUnavailableError as exc:
            self.last_error = str(exc)
            self._start_retrying()
            return False
        self.last_error = None
        return True

    async def lost(self, client: HostClient, error: Exception) -> None:
        """``client`` failed a request: drop it (if still current) and look for a host again."""
        if client is not self.client:
            return  # already replaced: several requests in flight fail together
        self.losses += 1
        self.last_error = str(error)
        log.warning("host %s lost: %s; running locally until a host answers", client.address, error)
        self.client = None
        await client.close()
        self._start_retrying()

    async def close(self) -> None:
        self._closed = True
        if self._retry is not None:
            self._retry.cancel()
            await asyncio.gather(self._retry, return_exceptions=True)
        if self.client is not None:
            await self.client.close()
            self.client = None

    def _start_retrying(self) -> None:
        if not self._closed and (self._retry is None or self._retry.done()):
            self._retry = asyncio.ensure_future(self._retry_loop())

    async def _retry_loop(self) -> None:
        while not self._closed and self.client is None:
            await asyncio.sleep(self.retry_s)
            try:
                client = await connect_host(
                    self.bundle, self.spec, self.interfaces, timeout=self.timeout, credentials=self.credentials
                )
            except HostUnavailableError as exc:
                self.last_error = str(exc)
                continue
            if self._closed:
                await client.close()
                return
            log.warning("host %s found: offloading again", client.address)
            self.client, self.last_error = client, None
