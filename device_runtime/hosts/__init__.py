"""The board's side of its hosts: the client, zeroconf discovery, connecting and failing over,
and the link meter that turns replies into a rate estimate."""

from device_runtime.hosts.client import Credentials, HostClient, InferResult
from device_runtime.hosts.connect import connect_host
from device_runtime.hosts.discovery import HostAdvert, discover
from device_runtime.hosts.host_link import HostLink
from device_runtime.hosts.link_meter import LinkMeter
from device_runtime.hosts.pool import ClientPool

__all__ = [
    "ClientPool",
    "Credentials",
    "HostAdvert",
    "HostClient",
    "HostLink",
    "InferResult",
    "LinkMeter",
    "connect_host",
    "discover",
]
