"""Rehearse a field trial on one Linux workstation (as root): emulated links and hosts behind them.

Tests, benchmarks and field-trial rehearsals need a link whose rate we choose and change,
before the real Wi-Fi. No board needs this package, and nothing of the runtimes imports it.
The pieces, standard library only:

* :class:`EmulatedLink` — the real thing: a network namespace joined to the root namespace by a
  veth pair, each direction shaped by the kernel's ``tbf``. Needs root, ``ip`` and ``tc``;
  :func:`unavailable_reason` says whether this machine can do it and why not.
* :class:`DelayRelay` — a user-space TCP relay adding one-way latency, because the kernel we
  run on has no ``netem``. It can also rate-limit in user space (a token bucket per direction),
  the fallback for tests that cannot be root; kernel ``tbf`` is more faithful (it shapes
  packets with their headers, drops when its queue is full, and TCP reacts as on a real link).
* :class:`RateSchedule` — "1:10,50:10,5:10": rates and durations, driven onto either of them;
  :func:`trace_steps` writes each rate it applies into the trace of the run beside it.
* :func:`serve_in` — ``split-host`` started inside a link's namespace, behind the shaped veth.
* :func:`own_peer` — the arguments that let such a host pass a chain's later stages on to itself.
* :func:`free_port` — a port for a server that must be told its port before it starts.
* :mod:`testbed.board_box` — the board in a box: an arm64 Debian Bookworm root file system
  (64-bit Raspberry Pi OS's base) under qemu-user-static, where the board's wheel installs from
  real aarch64 wheels (``python -m testbed.board_box``; imported from its module, so that running
  it as a script does not import it twice). Emulated: its timings mean nothing.
"""

from testbed import _kernel_link as kernel_link
from testbed._kernel_link import (
    EmulatedLink,
    LinkEmulationError,
    LinkEmulationUnavailable,
    remove_stale_links,
    tbf_parameters,
    unavailable_reason,
)
from testbed._namespace_host import own_peer, serve_in
from testbed._ports import free_port
from testbed._relay import DelayRelay
from testbed._schedule import RateSchedule, RateStep, trace_steps

__all__ = [
    "DelayRelay",
    "EmulatedLink",
    "LinkEmulationError",
    "LinkEmulationUnavailable",
    "RateSchedule",
    "RateStep",
    "free_port",
    "remove_stale_links",
    "own_peer",
    "serve_in",
    "tbf_parameters",
    "trace_steps",
    "unavailable_reason",
]

#: Importable from here as before the split (the tests use it), but not in ``__all__``.
FRAME_BYTES = kernel_link.FRAME_BYTES
