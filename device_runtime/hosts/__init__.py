"""The board's side of its hosts: zeroconf discovery, connecting and failing over, and the link
meter that turns replies into a rate estimate. The protocol's client itself is ``wire``'s."""

from device_runtime.hosts._connect import connect_host, host_address
from device_runtime.hosts._discovery import HostAdvert, discover
from device_runtime.hosts._host_link import HostLink
from device_runtime.hosts._link_meter import LinkMeter, probe_bytes

__all__ = [
    "HostAdvert",
    "HostLink",
    "LinkMeter",
    "connect_host",
    "discover",
    "host_address",
    "probe_bytes",
]
