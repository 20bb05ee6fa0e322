"""The kernel link: a network namespace behind a veth pair, each direction shaped by ``tbf``.

Needs root, ``ip`` and ``tc``; :func:`unavailable_reason` says whether this machine can do it
and why not, and :func:`remove_stale_links` clears what killed processes left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import gzip
import ipaddress
import itertools
import math
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import Any

from splitedge import SplitEdgeError

#: Every link takes a /30 of this network: root side .1, namespace side .2.
LINK_NETWORK = ipaddress.IPv4Network("10.213.0.0/16")
#: veth MTU (the default) plus its 14-byte Ethernet header: what tbf counts per full packet.
FRAME_BYTES = 1500 + 14
#: Time worth of bytes tbf may queue before it drops: a Wi-Fi driver's order of magnitude,
#: small enough that TCP sees loss and backs off as on a real link instead of filling a bloat.
TBF_QUEUE_S = 0.08
#: ... but never fewer packets than this, or TCP at 0.1 Mbit/s cannot keep a window in flight.
TBF_MIN_QUEUE_FRAMES = 4
#: The largest packet TCP hands a veth with offloads on (``gso_max_size``), and the device's
#: default segment count: what a link gets when its bucket can hold such a packet.
GSO_MAX_BYTES = 65536
GSO_MAX_SEGS = 65535
#: The largest bucket a link gets (see tbf_parameters): two GSO packets.
BURST_CAP_BYTES = 2 * (GSO_MAX_BYTES + FRAME_BYTES)
_COMMAND_TIMEOUT_S = 10.0
_NAMESPACE_INTERFACE = "veth0"
_OWN_NAME = re.compile(r"^se-?(\d+)-(\d+)$")  # our namespaces "se-PID-N" and root veths "sePID-N"
_LOCK_PATH = "/run/splitedge-link-emulator.lock"


class LinkEmulationError(SplitEdgeError, RuntimeError):
    """An ``ip``/``tc`` command of a link failed; the message has the command and its stderr."""


class LinkEmulationUnavailable(LinkEmulationError):
    """This machine cannot emulate links: not root, no ``ip``/``tc``, namespaces refused, no tbf."""


# --------------------------------------------------------------------------- commands


def _quiet(argv: Sequence[str]) -> subprocess.CompletedProcess[str] | None:
    """Run a clean-up command whose failure must not stop the rest of the clean-up."""
    try:
        return _run(argv, check=False)
    except LinkEmulationError:
        return None


def _run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run one ``ip``/``tc`` command, bounded in time; failures become :class:`LinkEmulationError`."""
    try:
        result = subprocess.run(list(argv), capture_output=True, text=True, timeout=_COMMAND_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LinkEmulationError(f"{' '.join(argv)}: {exc}") from exc
    if check and result.returncode != 0:
        raise LinkEmulationError(f"{' '.join(argv)}: {result.stderr.strip() or f'exit status {result.returncode}'}")
    return result


@functools.lru_cache(maxsize=1)
def unavailable_reason() -> str | None:
    """``None`` when :class:`EmulatedLink` works here, else why not (cached: it runs commands once).

    Checking the tools is not enough — containers often refuse ``ip netns add`` to root, and
    kernels may lack ``sch_tbf`` — so it creates a throwaway namespace with a veth pair, puts
    a tbf on it, and deletes it.
    """
    if os.geteuid() != 0:
        return "network namespaces need root (euid is %d)" % os.geteuid()
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not found on PATH (iproute2)"
    probe = f"se-probe-{os.getpid()}"
    try:
        _run(["ip", "netns", "add", probe])
    except LinkEmulationError as exc:
        return f"cannot create a network namespace: {exc}"
    try:
        _run(["ip", "-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1"])
        rate, burst, limit = tbf_parameters(10.0)
        _run(["tc", "-n", probe, "qdisc", "add", "dev", "p0", "root", "tbf",
              "rate", f"{rate}bit", "burst", str(burst), "limit", str(limit)])
    except LinkEmulationError as exc:
        return f"cannot make a veth pair with a tbf qdisc: {exc}"
    finally:
        _quiet(["ip", "netns", "del", probe])
    return None


@functools.lru_cache(maxsize=1)
def _kernel_hz() -> int:
    """The kernel's timer frequency from /proc/config.gz; 100 (the slowest usual one) if unknown."""
    with contextlib.suppress(OSError, EOFError, ValueError):
        with gzip.open("/proc/config.gz", "rt") as config:
            for line in config:
                if line.startswith("CONFIG_HZ="):
                    return int(line.split("=", 1)[1])
    return 100


def tbf_parameters(rate_mbit: float) -> tuple[int, int, int]:
    """``(rate in bit/s, burst bytes, limit bytes)`` for a tbf shaping at ``rate_mbit``.

    burst: as tc-tbf(8) says, more tokens can arrive per timer tick than a smaller bucket
    holds, so it must hold at least rate / HZ bytes (HZ from the kernel's config: 250 on the
    build machines) or the rate falls short; and at least two full frames, since a packet
    larger than the bucket can never be sent and a bucket of exactly one frame makes each
    frame wait for a completely full bucket. At 5 Mbit/s that is 3028 bytes (two frames),
    at 20 Mbit/s 10 kB, at 1000 Mbit/s 500 kB: one tick of data, let through at wire speed
    after an idle spell. But never more than :data:`BURST_CAP_BYTES` (two 64 KB GSO packets): a
    bucket passes an upload's first burst bytes at the speed of the machine, so a whole tick of
    500 Mbit/s (250 kB) made every upload of a few hundred kB cross at 1.2-1.5 times the rate
    (measured: the rate estimate read 1.21-1.52 of 500 Mbit/s, truthfully); capped, 1.06-1.15,
    and the link still carries 476 Mbit/s (the tick no longer matters: tbf runs on hrtimers).
    limit: burst plus :data:`TBF_QUEUE_S` of bytes at the rate, at least
    :data:`TBF_MIN_QUEUE_FRAMES` frames — a bounded queue, as in a Wi-Fi driver.
    """
    bytes_per_s = rate_mbit * 1e6 / 8
    burst = max(math.ceil(bytes_per_s / _kernel_hz()), 2 * FRAME_BYTES)
    burst = min(burst, max(BURST_CAP_BYTES, 2 * FRAME_BYTES))
    limit = burst + max(math.ceil(bytes_per_s * TBF_QUEUE_S), TBF_MIN_QUEUE_FRAMES * FRAME_BYTES)
    return round(rate_mbit * 1e6), burst, limit


def gso_segments(rate_mbit: float) -> int:
    """``gso_max_segs`` for a link shaped at ``rate_mbit``: offloads on where tbf's bucket
    (:func:`tbf_parameters`) holds a whole 64 KB GSO packet, else one wire packet per skb."""
    burst = tbf_parameters(rate_mbit)[1]
    return GSO_MAX_SEGS if burst >= GSO_MAX_BYTES + FRAME_BYTES else 1


def _checked_rate(rate_mbit: float | None) -> float | None:
    if rate_mbit is None:
        return None
    rate = float(rate_mbit)
    if not math.isfinite(rate) or rate <= 0:
        raise ValueError(f"rate_mbit must be a positive number of Mbit/s or None, not {rate_mbit!r}")
    return rate


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_links() -> list[str]:
    """Delete namespaces and root veths left by dead processes (a test killed mid-way); return their names.

    Only names this module makes (``se-PID-N``, ``sePID-N``) whose PID no longer runs are touched.
    :class:`EmulatedLink` calls it once per process, so leftovers do not pile up.
    """
    removed: list[str] = []
    listing = _run(["ip", "netns", "list"], check=False).stdout.split("\n")
    for name in (line.split()[0] for line in listing if line.strip()):
        match = _OWN_NAME.match(name)
        if match and name.startswith("se-") and not _pid_alive(int(match.group(1))):
            if _run(["ip", "netns", "del", name], check=False).returncode == 0:
                removed.append(name)
    for line in _run(["ip", "-o", "link", "show"], check=False).stdout.splitlines():
        fields = line.split(":")
        if len(fields) < 2:
            continue
        name = fields[1].strip().split("@")[0]
        match = _OWN_NAME.match(name)
        if match and not name.startswith("se-") and not _pid_alive(int(match.group(1))):
            if _run(["ip", "link", "del", name], check=False).returncode == 0:
                removed.append(name)
    return removed


@contextlib.contextmanager
def _allocation_lock() -> Iterator[None]:
    """Serialise address choice across processes: two test workers must not take the same /30."""
    with _THREAD_LOCK:
        try:
            handle = open(_LOCK_PATH, "a")
        except OSError:  # no writable /run: fall back to the per-process lock, still correct in one process
            yield
            return
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield


_THREAD_LOCK = threading.Lock()
_counter = itertools.count()
_swept = False


def _used_subnets() -> set[int]:
    """Indices of the /30s of :data:`LINK_NETWORK` that an address in the root namespace already uses."""
    used: set[int] = set()
    for line in _run(["ip", "-o", "-4", "addr", "show"]).stdout.splitlines():
        for field in line.split():
            if "/" in field and field.count(".") == 3:
                with contextlib.suppress(ValueError):
                    address = ipaddress.IPv4Interface(field).ip
                    if address in LINK_NETWORK:
                        used.add((int(address) - int(LINK_NETWORK.network_address)) // 4)
    return used


# --------------------------------------------------------------------------- kernel link


class EmulatedLink:
    """A namespace behind a tbf-shaped veth pair: a link of chosen rate to code in the namespace.

    The root namespace plays the host, the namespace plays the board (or the reverse): a
    server started with :meth:`popen` listens on :attr:`namespace_address`, the test connects
    to it from the root namespace. Both directions are shaped at the same rate: the root-side
    veth's egress carries traffic into the namespace, the namespace-side veth's egress carries
    traffic out. Latency is not emulated here (no netem): put a :class:`DelayRelay` in front.

    Offloads: TCP hands a veth 64 KB GSO packets; tbf splits one larger than its bucket into
    ~43 frames and enqueues them at once, so at low rates the tail of a single skb overflows
    the queue and TCP waits out a retransmission timeout. Measured at 5 Mbit/s (2.5 s
    transfers): with offloads on, goodput was 4.84 Mbit/s in two runs and 4.32 in two (RTO
    stalls, 200-2000 drops per run); with ``gso_max_segs 1`` set by ``ip link``, 4.78 in every
    run with ~55 drops (slow start overshooting the queue). So a link whose bucket cannot
    hold a 64 KB packet gets ``gso_max_segs 1`` at both ends (see :func:`gso_segments`). At
    high rates the bucket holds several, and one skb per wire packet costs more CPU than this
    machine has: a 64 MB upload at 500 Mbit/s carried 394-420 Mbit/s with ``gso_max_segs 1``
    and 479 (the rate less TCP/IP headers) with offloads on, so there they stay on. A
    connection keeps the packet size of the moment it started: one begun on a fast link and
    slowed below 100 Mbit/s by :meth:`set_rate` keeps its 64 KB packets (and may stall); an
    unshaped link keeps one packet per skb for that reason.
    """

    def __init__(self, rate_mbit: float | None = None, name: str | None = None) -> None:
        n = next(_counter)
        pid = os.getpid()
        self.namespace = name if name is not None else f"se-{pid}-{n}"
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", self.namespace):
            raise ValueError(f"namespace name {self.namespace!r}: use 1-64 letters, digits, '_', '.', '-'")
        self.root_interface = f"se{pid}-{n}"  # an interface name has at most 15 characters
        self.namespace_interface = _NAMESPACE_INTERFACE
        self._rate = _checked_rate(rate_mbit)
        self._addresses: tuple[str, str] | None = None
        self._processes: list[subprocess.Popen[Any]] = []
        self._lock = threading.Lock()
        self._entered = False
        self._owns_namespace = False  # never delete a namespace someone else named and made

    @property
    def rate_mbit(self) -> float | None:
        """The rate both directions are shaped to, ``None`` when unshaped."""
        return self._rate

    @property
    def root_address(self) -> str:
        """The root namespace's end (x.x.x.1 of the link's /30)."""
        return self._require_addresses()[0]

    @property
    def namespace_address(self) -> str:
        """The namespace's end (x.x.x.2 of the link's /30)."""
        return self._require_addresses()[1]

    def _require_addresses(self) -> tuple[str, str]:
        if self._addresses is None:
            raise RuntimeError("the link has addresses only inside its `with` block")
        return self._addresses

    def __enter__(self) -> EmulatedLink:
        global _swept
        reason = unavailable_reason()
        if reason is not None:
            raise LinkEmulationUnavailable(reason)
        if self._entered:
            raise RuntimeError("an EmulatedLink can be entered once")
        self._entered = True
        try:
            if not _swept:
                _swept = True
                remove_stale_links()
            self._create()
        except BaseException:
            self._teardown()
            raise
        return self

    def _create(self) -> None:
        ns, veth = self.namespace, self.root_interface
        with _allocation_lock():
            used = _used_subnets()
            start = (os.getpid() * 7919) % (LINK_NETWORK.num_addresses // 4)  # spread processes apart
            count = LINK_NETWORK.num_addresses // 4
            index = next((i % count for i in range(start, start + count) if i % count not in used), None)
            if index is None:
                raise LinkEmulationUnavailable(f"every /30 of {LINK_NETWORK} is in use")
            base = LINK_NETWORK.network_address + 4 * index
            self._addresses = (str(base + 1), str(base + 2))
            try:
                _run(["ip", "netns", "add", ns])
            except LinkEmulationError as exc:
                raise LinkEmulationUnavailable(str(exc)) from exc
            self._owns_namespace = True
            _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", self.namespace_interface, "netns", ns])
            _run(["ip", "addr", "add", f"{self._addresses[0]}/30", "dev", veth])
        _run(["ip", "-n", ns, "addr", "add", f"{self._addresses[1]}/30", "dev", self.namespace_interface])
        _run(["ip", "link", "set", veth, "up"])
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        _run(["ip", "-n", ns, "link", "set", self.namespace_interface, "up"])
        _run(["ip", "-n", ns, "route", "add", "default", "via", self._addresses[0]])
        self._apply(self._rate)

    def _apply(self, rate: float | None) -> None:
        for netns, dev in ((), self.root_interface), (("-n", self.namespace), self.namespace_interface):
            if rate is None:
                result = _run(["tc", *netns, "qdisc", "del", "dev", dev, "root"], check=False)
                if result.returncode != 0 and "No such file" not in result.stderr and "Cannot delete" not in result.stderr:
                    raise LinkEmulationError(f"tc qdisc del dev {dev}: {result.stderr.strip()}")
            else:
                bits, burst, limit = tbf_parameters(rate)
                _run(["tc", *netns, "qdisc", "replace", "dev", dev, "root", "tbf",
                      "rate", f"{bits}bit", "burst", str(burst), "limit", str(limit)])
            # Packet size to suit the bucket (see the class docstring): best effort, shaping works without.
            # TCP takes a device's GSO size when a connection starts and keeps it, so an unshaped link,
            # which may be slowed later under connections it already carries, keeps one packet per skb.
            segments = 1 if rate is None else gso_segments(rate)
            _run(["ip", *netns, "link", "set", "dev", dev, "gso_max_segs", str(segments)], check=False)

    def set_rate(self, rate_mbit: float | None) -> None:
        """Shape both directions to ``rate_mbit`` (``None``: unshaped), effective for the next packet.

        ``tc qdisc replace`` changes an existing tbf in place: what it has queued stays queued
        and leaves at the new rate. Outside the ``with`` block it only records the rate for
        the next entry.
        """
        rate = _checked_rate(rate_mbit)
        with self._lock:
            if self._addresses is not None:
                self._apply(rate)
            self._rate = rate

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside the namespace (``ip netns exec``).

        On exit it is terminated (killed after 2 s) and its pipes are closed: a process left
        inside would keep the namespace, and with it the veth, alive after ``ip netns del``.
        """
        self._require_addresses()
        process = subprocess.Popen(["ip", "netns", "exec", self.namespace, *argv], **kwargs)
        self._processes.append(process)
        return process

    def _teardown(self) -> list[str]:
        """Stop our processes, delete the veth and the namespace; return what could not be deleted."""
        with self._lock:
            for process in self._processes:
                if process.poll() is None:
                    process.terminate()
                    try:
                        process.wait(timeout=2)
                    except subprocess.TimeoutExpired:
                        process.kill()
                        process.wait(timeout=2)
                for pipe in (process.stdin, process.stdout, process.stderr):
                    if pipe is not None:
                        pipe.close()
            self._processes.clear()
            # Deleting the root end first is synchronous; a namespace's own destruction is not
            # (the kernel finishes it later), and it waits for every process inside to exit.
            _quiet(["ip", "link", "del", self.root_interface])
            left = []
            if self._owns_namespace:
                _quiet(["ip", "netns", "del", self.namespace])
                listing = _quiet(["ip", "netns", "list"])
                if listing is None or self.namespace in listing.stdout.split():
                    left.append(f"namespace {self.namespace}")
                self._owns_namespace = False
            self._addresses = None
            shown = _quiet(["ip", "link", "show", self.root_interface])
            if shown is None or shown.returncode == 0:
                left.append(f"veth {self.root_interface}")
            return left

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        left = self._teardown()
        if left and exc_type is None:
            raise LinkEmulationError(f"could not delete {', '.join(left)}")

    async def __aenter__(self) -> EmulatedLink:
        return await asyncio.to_thread(self.__enter__)  # a dozen commands: keep them off the loop

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await asyncio.to_thread(self.__exit__, exc_type, exc, tb)
