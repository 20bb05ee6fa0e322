"""The board's link to its hosts: the protocol's client, its pool of connections and the kernel's
view of each transfer.

:class:`HostClient` talks to one host (many requests in flight, replies matched by id, every wait
bounded); :class:`ClientPool` keeps connections to several, made on first use. The kernel's
transfer stamps (``TCP_INFO``, ACK and receive stamps: :func:`kernel_timing_support`,
:class:`UploadTiming`) time each upload for the link estimate.

This room sits on the contract (:mod:`device_runtime.wire`) and is no part of it: the board's
rooms use it, and the host imports it only where it dials its peers (``host_runtime/_peers.py``:
a chain's next hops and the links measured to them).
"""

from device_runtime.link._client import Credentials, Deadline, HostClient, InferResult, Leg, Probe
from device_runtime.link._kernel_timing import KernelTimingSupport, UploadTiming, kernel_timing_support
from device_runtime.link._pool import ClientPool

__all__ = [
    "ClientPool",
    "Credentials",
    "Deadline",
    "HostClient",
    "InferResult",
    "KernelTimingSupport",
    "Leg",
    "Probe",
    "UploadTiming",
    "kernel_timing_support",
]
