"""``split-host serve --procs N``: N processes serving one port, as uvicorn's and gunicorn's workers do.

One event loop does every frame's work (reads, msgpack, auth, replies) on one core; a GPU host
for thousands of boards needs more (issue 19: the loop was at 1.3–2 cores when the GPU was at
0.08 of its rate). Each child process is a whole host of its own: its event loop, framing, auth,
sessions and batches, listening on the same port with ``SO_REUSEPORT``, so the kernel spreads
new connections across the children (by a hash of each connection's addresses). What a fleet
sees stays one host:

- **one port**: the parent binds it first (``SO_REUSEPORT``, not listening: the kernel sends
  connections only to listening sockets), so ``--port 0`` names one free port for all, and a
  port in use is refused before any child starts;
- **one zeroconf record**, registered by the parent; its load is the mean of the children's,
  which each writes once a second into shared memory;
- **one metrics endpoint**: each child serves its registry on a private 127.0.0.1 port and the
  parent's ``--metrics-port`` sums their scrapes (:func:`sum_scrapes`, at most once a second), with
  ``splitedge_host_process_requests`` per child beside the sums (is one front end idle?);
- **one shutdown**: SIGINT or SIGTERM to the parent sends SIGTERM to every child, which drains
  as a lone host does; the children ignore SIGINT (a terminal's Ctrl-C reaches the whole process
  group) and get SIGTERM if the parent dies (``PR_SET_PDEATHSIG``). A child that dies is
  reported and the parent stops the others and exits with status 2: a supervisor (systemd's
  ``Restart=on-failure``) restarts the host whole, rather than the parent hiding a crash loop.

The ``stats`` op answers for the child that took the connection.
"""

from __future__ import annotations

import asyncio
import ctypes
import multiprocessing as mp
import os
import signal
import socket
import sys
import time
import urllib.request
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any, Callable, Iterable, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from host_runtime._metrics import PREFIX, MetricsEndpoint
from splitedge import SplitEdgeError

__all__ = ["AUTO", "Child", "auto_procs", "child_setup", "reserve_port", "sum_scrapes", "supervise"]

#: ``--procs auto``: as many processes as :func:`auto_procs` finds the cores call for.
AUTO = "auto"
#: On CUDA, at most this many processes: each holds its own sessions in GPU memory (1.6 GB per tail
#: with --max-batch 32 on an H200), and 4 already served 0.50 of bare onnxruntime at 512 boards.
MAX_CUDA_PROCS = 8
#: On the CPU, one front end per this many cores: a front end costs about 80 µs of its loop's core
#: per request, a sample of MobileNetV2's cheapest usual tail about 1.5 ms of a core (issue 32), so
#: 16 cores of tails answer ~10,700 requests/s, 0.85 of one loop's core.
CPU_CORES_PER_PROC = 16

#: How long the children may take to load their bundles and listen.
START_TIMEOUT_S = 300.0
#: Seconds a child has to drain after SIGTERM beyond its own shutdown bound, before it is killed.
STOP_GRACE_S = 10.0
_PR_SET_PDEATHSIG = 1


@dataclass
class Child:
    """What a child process is told: which one it is, where to report, where to write its load."""

    index: int
    port: int
    parent: int  # the parent's pid: a child whose parent is gone stops
    reports: Any  # multiprocessing queue: ("ready", index, details) or ("failed", index, message)
    loads: Any  # multiprocessing array of doubles, one per child


def auto_procs(cores: int, cuda: bool, workers: int) -> tuple[int, str]:
    """``--procs auto``: how many front-end processes ``cores`` call for, and why, in a sentence.

    On CUDA the GPU answers far faster than one event loop can frame requests (a loop at 0.9 of a
    core stopped one process at 7-9k requests/s where the H200 does 65k; issue 32), so the host
    runs as many processes as the cores hold, each needing one core for its loop and one per tail
    worker (they spin while the GPU runs), with one core in every ``workers + 2`` left to the
    kernel's network work: 16 cores and 2 workers make 4, the best measured on an H200. At most
    :data:`MAX_CUDA_PROCS`. On the CPU the tail workers take the cores and one loop keeps up with
    the tails of :data:`CPU_CORES_PER_PROC` of them, so one process per that many cores (one
    below it). A pure function of its arguments: no timing, so the same machine always gets the
    same answer.
    """
    assert cores >= 1 and workers >= 1, f"cores and workers must be positive, got {cores}, {workers}"
    if cuda:
        procs = max(1, min(cores // (workers + 2), MAX_CUDA_PROCS))
        return procs, (f"the tails run on CUDA: {cores} cores hold {procs} processes of an event loop and "
                       f"{workers} tail workers each, with a core in {workers + 2} left to the kernel")
    procs = max(1, cores // CPU_CORES_PER_PROC)
    return procs, (f"the tails run on the CPU: their workers take the {cores} cores, and one event loop keeps up "
                   f"with the tails of {CPU_CORES_PER_PROC} cores")


def usable_cores() -> int:
    """The cores this process may run on (its affinity, as taskset and cgroups' cpusets set it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def reserve_port(host: str, port: int) -> socket.socket:
    """Bind ``host:port`` for the children (``SO_REUSEPORT``, not listening); the socket holds the port.

    A port another program holds is refused first, with a plain bind: a socket of another
    ``SO_REUSEPORT`` server of this user would otherwise let us join its group silently.
    """
    if not hasattr(socket, "SO_REUSEPORT"):
        raise SplitEdgeError("--procs needs SO_REUSEPORT, which this system lacks; run one process (--procs 1)")
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the children's listeners do
        probe.bind((host, port))
        if port == 0:
            port = probe.getsockname()[1]
    except OSError as exc:
        raise SplitEdgeError(f"port {port} on {host} is in use; stop the other host or pass --port 0 for a free one") from exc
    finally:
        probe.close()
    reservation = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    reservation.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    reservation.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        reservation.bind((host, port))
    except OSError as exc:
        reservation.close()
        raise SplitEdgeError(f"port {port} on {host} was taken meanwhile; try again") from exc
    return reservation


def child_setup(child: Child) -> None:
    """In a child, first thing: SIGINT ignored (the parent stops us with SIGTERM), SIGTERM when the
    parent dies (Linux), and an exit if it is already gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):  # no prctl: the parent's SIGTERM alone stops us
            pass
    if os.getppid() != child.parent:
        sys.exit(1)


# -- the summed metrics ----------------------------------------------------------------------------


def sum_scrapes(scrapes: Sequence[str | None]) -> list[Metric]:
    """The metric families of the children's scrapes (Prometheus text; None for one that did not
    answer), each sample summed over the children: counters, histograms' buckets, sums and counts,
    and gauges (every gauge here is a count: connections, queued samples, bytes held). ``_created``
    timestamps are dropped (a sum of them means nothing). Beside them: ``processes_up`` (children
    that answered) and ``process_requests`` (requests by op, per child)."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    per_process = Metric(PREFIX + "process_requests", "Requests received, by op, per --procs process.", "counter")
    up = 0
    for index, text in enumerate(scrapes):
        if text is None:
            continue
        up += 1
        for family in text_string_to_metric_families(text):
            if not family.name.startswith(PREFIX):
                continue
            if family.name not in families:
                families[family.name] = Metric(family.name, family.documentation, family.type)
                values[family.name] = {}
            summed = values[family.name]
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                key = (sample.name, tuple(sorted(sample.labels.items())))
                summed[key] = summed.get(key, 0.0) + sample.value
                if family.name == PREFIX + "requests":
                    per_process.add_sample(sample.name.replace(PREFIX, PREFIX + "process_", 1),
                                           {"process": str(index), **sample.labels}, sample.value)
    for name, family in families.items():
        for (sample_name, labels), value in values[name].items():
            family.add_sample(sample_name, dict(labels), value)
    processes = Metric(PREFIX + "processes_up", "--procs processes whose metrics answered this scrape.", "gauge")
    processes.add_sample(PREFIX + "processes_up", {}, float(up))
    return [*families.values(), per_process, processes]


def scrape(port: int, timeout: float = 2.0) -> str | None:
    """A child's metrics as Prometheus text, or None if it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as response:
            return response.read().decode()
    except OSError:
        return None


class _SummedCollector:
    """A prometheus_client collector: every collect scrapes the children and sums them."""

    def __init__(self, ports: Sequence[int]) -> None:
        self.ports = list(ports)

    def collect(self) -> Iterable[Metric]:
        return sum_scrapes([scrape(port) for port in self.ports])


def serve_summed_metrics(address: str, port: int, child_ports: Sequence[int], **options: Any) -> MetricsEndpoint:
    """The parent's ``--metrics-port``: the children's scrapes summed, on ``address:port``;
    ``options``: :class:`~host_runtime._metrics_http.MetricsEndpoint`'s (``token``, ``note``, bounds).
    Rendered at most once a second, so scrapers in a loop do not make the children render each time."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SummedCollector(child_ports))  # type: ignore[arg-type]  # a collector is anything with collect()
    return MetricsEndpoint(lambda: generate_latest(registry), address, port, **options)


# -- the parent ------------------------------------------------------------------------------------


class Supervisor:
    """Start the children, wait for them to listen, watch them, stop them."""

    def __init__(self, procs: int, host: str, port: int, target: Callable[..., None], args: Any) -> None:
        self.procs = procs
        self.reservation = reserve_port(host, port)
        self.port = self.reservation.getsockname()[1]
        context = mp.get_context("spawn")  # no fork of a process holding threads; each child builds its own sessions
        self.reports = context.Queue()
        self.loads = context.Array("d", procs, lock=False)
        self.children: list[BaseProcess] = [
            context.Process(
                target=target, name=f"split-host-{index}",
                args=(args, Child(index, self.port, os.getpid(), self.reports, self.loads)),
            )
            for index in range(procs)
        ]

    def start(self) -> None:
        for child in self.children:
            child.start()

    async def ready(self, stop: asyncio.Event) -> list[dict[str, Any]]:
        """Each child's report once all listen, in child order; a child that failed or died is an error."""
        loop = asyncio.get_running_loop()
        found: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + START_TIMEOUT_S
        while len(found) < self.procs:
            if stop.is_set():
                raise SplitEdgeError("stopped before every process was listening")
            if time.monotonic() > deadline:
                raise SplitEdgeError(f"not every process listened within {START_TIMEOUT_S:g} s")
            report = await loop.run_in_executor(None, self._next_report, 0.2)
            if report is None:
                self.check_alive()
                continue
            kind, index, details = report
            if kind == "failed":
                raise SplitEdgeError(details)
            found[index] = details
        return [found[index] for index in range(self.procs)]

    def _next_report(self, timeout: float) -> tuple[str, int, Any] | None:
        try:
            return self.reports.get(timeout=timeout)
        except Exception:  # queue.Empty; anything else is seen as a dead child next
            return None

    def check_alive(self) -> None:
        """Raise if a child has exited (a child stops only when told to)."""
        for index, child in enumerate(self.children):
            if child.exitcode is not None:
                raise SplitEdgeError(f"process {index} (pid {child.pid}) exited with status {child.exitcode}; "
                                     "the host stopped its other processes")

    async def watch(self, stop: asyncio.Event, period: float = 0.2) -> None:
        """Until ``stop`` is set; raises as soon as a child dies."""
        while not stop.is_set():
            self.check_alive()
            try:
                await asyncio.wait_for(stop.wait(), period)
            except asyncio.TimeoutError:
                pass

    def load(self) -> float:
        """The children's mean load (each: samples queued or running per worker, the last second)."""
        return sum(self.loads) / self.procs

    async def stop(self, timeout: float) -> None:
        """SIGTERM to every child still running; each drains (bounded), the rest are killed."""
        for child in self.children:
            if child.exitcode is None and child.pid is not None:
                child.terminate()  # SIGTERM
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + timeout
        for child in self.children:
            if child.pid is None:
                continue
            await loop.run_in_executor(None, child.join, max(deadline - time.monotonic(), 0.1))
            if child.exitcode is None:
                print(f"process {child.name} (pid {child.pid}) did not stop within {timeout:g} s; killed",
                      file=sys.stderr, flush=True)
                child.kill()
                await loop.run_in_executor(None, child.join, 5.0)
        self.reservation.close()
        self.reports.close()


async def supervise(
    procs: int, host: str, port: int, target: Callable[..., None], args: Any,
    serve_parent: Callable[[Supervisor, list[dict[str, Any]], asyncio.Event], Any], stop: asyncio.Event,
    shutdown_timeout: float,
) -> None:
    """Run ``procs`` children of ``target(args, child)`` on one port; ``serve_parent`` does the
    parent's part (print, metrics, zeroconf) once every child listens, until ``stop``."""
    supervisor = Supervisor(procs, host, port, target, args)
    try:
        supervisor.start()
        ready = await supervisor.ready(stop)
        await serve_parent(supervisor, ready, stop)
    finally:
        await supervisor.stop(shutdown_timeout + STOP_GRACE_S)
