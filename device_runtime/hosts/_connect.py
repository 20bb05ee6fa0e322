"""Find one host for a bundle and connect to it: an address given, or zeroconf's least loaded."""

from __future__ import annotations

from typing import Sequence

from device_runtime.bundle import Bundle
from device_runtime.link import Credentials, HostClient
from device_runtime.hosts._discovery import discover
from splitedge.errors import HostUnavailableError

__all__ = ["connect_host", "host_address"]


def host_address(spec: str) -> tuple[str, int]:
    """``IP:PORT`` as (address, port); :class:`HostUnavailableError` naming what to write otherwise.

    A bare address has no default port on purpose: a host started with ``--port 0`` (tests, a
    second host on one machine) listens elsewhere, and a wrong guess would be retried for ever.
    """
    address, sep, port_text = spec.rpartition(":")
    if not sep or not address or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise HostUnavailableError(f"{spec}: expected IP:PORT or auto (the host prints its port as it starts)")
    return address, int(port_text)


async def connect_host(
    bundle: Bundle, host: str, interfaces: Sequence[str] | None = None, timeout: float = 5.0,
    credentials: Credentials = Credentials(), without_host: str = "--split local",
) -> HostClient:
    """``host`` is ``IP:PORT`` or ``auto`` (zeroconf: the least loaded host serving the bundle).

    By zeroconf, only hosts whose record matches the device's key are tried: a device with a key
    talks only to hosts that authenticate frames (``auth`` in the TXT record), one without a key
    only to hosts that do not require one. ``without_host`` is the calling command's flag for
    going on without a host, suggested when none is found (``run --split local``,
    ``calibrate --no-host``).
    """
    failures = []
    if host == "auto":
        adverts = await discover(bundle.id, interfaces, timeout=timeout)
        if not adverts:
            raise HostUnavailableError(
                f"no splitedge host serving bundle {bundle.id} found by zeroconf within {timeout:g} s; "
                f"start one with 'split-host serve', pass --host IP:PORT, or run with {without_host}"
            )
        keyed = credentials.key is not None
        for advert in adverts:
            if advert.auth != keyed:
                failures.append(
                    f"host {advert.address}:{advert.port} does not authenticate frames and this device has a key"
                    if keyed else f"host {advert.address}:{advert.port} requires a key (split-device --key-file)"
                )
        candidates = [(a.address, a.port) for a in adverts if a.auth == keyed]
    else:
        candidates = [host_address(host)]
    for address, port in candidates:  # least loaded first; a stale record must not stop us
        try:
            client = await HostClient.connect(address, port, timeout=timeout, credentials=credentials)
        except HostUnavailableError as exc:
            failures.append(str(exc))
            continue
        if bundle.id in client.server_info.get("bundles", {}):
            return client
        await client.close()
        failures.append(f"host {client.address} does not serve bundle {bundle.id}")
    raise HostUnavailableError("; ".join(failures))
