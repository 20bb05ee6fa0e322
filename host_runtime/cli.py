"""``split-host``: serve the tails of one or more bundles to boards on the network."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from typing import Any, Callable, Sequence

from splitedge.lifecycle import run_command
from device_runtime.live import live_flag
from device_runtime.wire import DEFAULT_MAX_FRAME_BYTES, load_key, server_context
from device_runtime.wire.ops import split_address
from host_runtime._advertise import Advertiser, local_address_for
from host_runtime._batcher import BatchConfig
from host_runtime._event_loop import LOOPS, loop_runner
from host_runtime._flags import BOUNDS, flag, procs_flag, sizes_flag
from host_runtime._limits import fit_fd_limit
from host_runtime._live import serve_live
from host_runtime._metrics import MetricsEndpoint
from host_runtime._metrics_http import endpoint_token, read_token_file
from host_runtime._procs import (AUTO, CPU_CORES_PER_PROC, MAX_CUDA_PROCS, Child, Supervisor, auto_procs, child_setup,
                                serve_summed_metrics, supervise, usable_cores)
from host_runtime._server import HostServer, ServerConfig
from host_runtime._service import SERVICE_EXAMPLES, ServiceOptions, install_service, service_arguments
from host_runtime._settings import LIVE_ONE_PROCESS, SHARE_QUEUE, HostSettings
from host_runtime._tails import (BUCKETS_AUTO, BUCKETS_OFF, DEVICES, TF32_ERROR_H100, TailRegistry, bucket_sizes,
                                on_cuda)
from splitedge import SettingError, SplitEdgeError

EXAMPLES = """\
examples:
  split-host serve bundle/                         # all interfaces, port 7767, advertised by zeroconf
  split-host serve bundle/ --interface 127.0.0.1   # this machine only
  split-host serve a/ b/ --port 9000 --no-zeroconf # two bundles, no discovery
  split-host serve bundle/ --metrics-port 9100     # Prometheus text at http://127.0.0.1:9100/metrics
  split-host serve bundle/ --live 8080             # a live page of the boards at http://127.0.0.1:8080/
  split-host serve bundle/ --live 0.0.0.0:8080 --key-file host.key   # for the network: the page asks for a token
  split-host serve bundle/ --max-batch 32 --max-wait-ms 5   # bigger batches for a busy fleet
  split-host serve bundle/ --max-batch 1 --max-queue 64     # no batching, refuse sooner
  split-host serve bundle/ --share-queue off       # a free worker takes all the queue it may, not its share
  split-host serve bundle/ --device cpu            # keep the tails off the GPU
  split-host serve bundle/ --device cuda --max-batch 32 --procs 4   # a GPU host for a large fleet
  split-host serve bundle/ --max-batch 32 --procs auto   # as many processes as the cores call for (said at start)
  split-host serve bundle/ --device cuda --tf32    # faster on the GPU, answers up to ~2e-2 off the CPU's
  split-host serve bundle/ --max-batch 32 --buckets 1,8,32   # pad batches to these sizes only
  split-host serve bundle/ --max-connections 256 --idle-timeout 60   # a smaller host, stricter
  split-host serve bundle/ --loop asyncio          # asyncio's own event loop even where uvloop is installed
  openssl rand -hex 32 > host.key && chmod 600 host.key   # a pre-shared key; copy it to the boards
  split-host serve bundle/ --key-file host.key     # every frame authenticated (HMAC-SHA256), replays refused
  split-host serve bundle/ --key-file host.key --tls-cert host.pem --tls-key host-key.pem   # and encrypted (TLS)
  split-host serve bundle/ --peer 192.168.1.21:7767   # an edge host that passes chains on to the cloud host
"""

NO_KEY_WARNING = "warning: no --key-file: frames are not authenticated; anyone on this network can use this host"
#: Tail worker threads on CUDA: one GPU runs one kernel stream at a time, and on an H100 2 workers
#: served more than 16 (issue 19), where threads queued on the GPU.
CUDA_WORKERS = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="split-host", description="Serve split-network tails to boards.", epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve", help="serve the tails of bundles over TCP", epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _serve_arguments(serve)
    install = commands.add_parser(
        "install-service", help="write and enable a hardened systemd unit that runs serve with these flags",
        epilog=SERVICE_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _serve_arguments(install)
    service_arguments(install)
    return parser


def _serve_arguments(serve: argparse.ArgumentParser) -> None:
    """serve's flags, which install-service takes too (and writes into the unit's ExecStart)."""
    serve.add_argument("bundles", nargs="+", help="bundle directories written by split-export build")
    serve.add_argument("--port", type=flag("port"), default=7767, help="TCP port (0 picks a free one; default 7767)")
    serve.add_argument("--interface", default="0.0.0.0", help="address to listen and advertise on (default: all)")
    serve.add_argument("--no-zeroconf", action="store_true", help="do not advertise the host")
    serve.add_argument("--workers", type=flag("workers"), default=None,
                       help=f"tail worker threads: the tail runs at once on this many (default: {CUDA_WORKERS} when the "
                       f"tails run on CUDA, else one per CPU, {ServerConfig.workers}, shared among the --procs processes)")
    serve.add_argument("--threads", type=flag("threads"), default=None,
                       help=f"onnxruntime intra-op threads per tail, at most {BOUNDS['threads'].high:g} (default: "
                       "onnxruntime's)")
    serve.add_argument(
        "--max-frame-mb", type=flag("max_frame_mb"), default=DEFAULT_MAX_FRAME_BYTES / 2**20,
        help=f"refuse frames larger than this (MiB; default {DEFAULT_MAX_FRAME_BYTES / 2**20:g})",
    )
    serve.add_argument(
        "--max-partial-mb", type=flag("max_partial_mb"), default=None,
        help="memory all connections together may hold in frames still arriving (MiB); a connection whose "
        "frame does not fit is not read until it does (default: 4 x --max-frame-mb, 256)",
    )
    config = ServerConfig()
    serve.add_argument(
        "--max-connections", type=flag("max_connections"), default=config.max_connections,
        help="connections kept in all; more are refused with a log line (a fleet is tens of boards, one "
        f"connection each; default {config.max_connections})",
    )
    serve.add_argument(
        "--max-connections-per-address", type=flag("max_connections_per_address"), default=config.max_connections_per_address,
        help="connections kept from one IP address (boards behind one NAT share it; default "
        f"{config.max_connections_per_address})",
    )
    serve.add_argument(
        "--idle-timeout", type=flag("idle_timeout"), default=config.idle_timeout,
        help="close a connection that sent nothing and waits for nothing this long, s (boards reconnect "
        f"by themselves; default {config.idle_timeout:g})",
    )
    serve.add_argument(
        "--frame-timeout", type=flag("frame_timeout"), default=config.frame_timeout,
        help="close a connection whose frame stays unfinished this long, s (a 64 MiB frame at 10 Mbit/s "
        f"takes 54; default {config.frame_timeout:g})",
    )
    serve.add_argument(
        "--first-frame-timeout", type=flag("first_frame_timeout"), default=config.first_frame_timeout,
        help="close a connection that has sent no complete frame (with --key-file: not authenticated) this long "
        f"after connecting, s; when the connection table is full the oldest such one is closed first (default "
        f"{config.first_frame_timeout:g})",
    )
    serve.add_argument(
        "--drain-timeout", type=flag("drain_timeout"), default=config.shutdown_timeout,
        help="on SIGTERM or Ctrl-C, how long the host lets what is pending finish, all of it together (queued "
        f"batches, chain hops, links, profiles), s (default {config.shutdown_timeout:g})",
    )
    serve.add_argument(
        "--profile-budget-ms", type=flag("profile_budget_ms"),
        default=config.profile_budget_s * 1000,
        help="tail-run time one profile request may spend here, ms: repeats are trimmed to fit, a request that "
        f"cannot fit is refused (default {config.profile_budget_s * 1000:g}; hello announces it, and a board's "
        "calibration fits its requests to it and leaves out what one run cannot time within it)",
    )
    serve.add_argument(
        "--device", choices=DEVICES, default="auto",
        help="where tails run: auto takes onnxruntime's CUDA provider when available (default: auto); on CUDA "
        "the answers are the CPU's within 1e-4 (TF32 off, see --tf32)",
    )
    serve.add_argument(
        "--tf32", action="store_true",
        help="let CUDA compute in TF32 (Ampere and later): faster matrix products, but answers no longer the "
        "CPU's: MobileNetV2's logits moved by up to 1.5e-2 on its tails and 2.2e-2 on the full model (measured on an "
        f"H200; {TF32_ERROR_H100:g} on an H100's tails; 1.2e-5 without); no effect on the CPU",
    )
    serve.add_argument(
        "--buckets", type=sizes_flag((BUCKETS_AUTO, BUCKETS_OFF)), default=BUCKETS_AUTO, metavar="auto|off|SIZES",
        help="pad each batch with zeros up to the next of a few fixed sizes, each warmed up at start, so a GPU "
        "sees few shapes and chooses its algorithms before the first request (the padded rows are computed and "
        "dropped); on CUDA each size has an onnxruntime session of its own, which never sees another shape "
        "(a change of shape within one session costs 30-130 ms there); auto: powers of two up to --max-batch on "
        "CUDA, off on the CPU, where padding costs compute; or sizes such as 1,2,4,8 (--max-batch is always one; "
        "default: auto)",
    )
    defaults = BatchConfig()
    serve.add_argument(
        "--max-batch", type=flag("max_batch"), default=defaults.max_batch,
        help=f"samples per tail run; requests for the same split are batched up to this (1: off; default {defaults.max_batch})",
    )
    serve.add_argument(
        "--max-wait-ms", type=flag("max_wait_ms"), default=defaults.max_wait_ms,
        help=f"how long a request waits for others to batch with (default {defaults.max_wait_ms:g})",
    )
    serve.add_argument(
        "--share-queue", choices=tuple(SHARE_QUEUE), default="auto",
        help="on: a worker takes at most its share of its tail's queue, ceil(queued / workers), so that the next "
        "worker free finds work waiting rather than idling while the boards answered last send again (2-7 %% "
        "more throughput at 32 boards on 2 cores, p99 a quarter lower); off: a free worker takes all it may, up to "
        "--max-batch; auto: on the CPU, off on CUDA, where a launch costs about as much whatever its batch; never "
        "while requests wait for company (--max-wait-ms); default: auto",
    )
    serve.add_argument(
        "--max-queue", type=flag("max_queue"), default=defaults.max_queue,
        help=f"samples waiting across the host before requests are answered 'overloaded' (default {defaults.max_queue})",
    )
    serve.add_argument(
        "--metrics-port", type=flag("metrics_port"), default=None,
        help="serve Prometheus text metrics on this port, on the --metrics-interface address (default: off)",
    )
    serve.add_argument(
        "--metrics-interface", metavar="ADDRESS", default="127.0.0.1",
        help="address the metrics listen on (default: 127.0.0.1, this machine only); any other asks scrapers for "
        "a token (Authorization: Bearer TOKEN or ?token=TOKEN): --metrics-token-file's, else one derived from "
        "--key-file and printed at start; without either it is refused",
    )
    serve.add_argument(
        "--metrics-token-file", metavar="FILE",
        help="a token (16 bytes or more, its first line) the metrics ask for wherever they listen; Prometheus "
        "sends it with authorization: {credentials_file: FILE} (default: none on loopback)",
    )
    serve.add_argument(
        "--live", metavar="[ADDRESS:]PORT", type=live_flag,
        help="serve a live page of this host (the boards connected and their splits, queue, batches, deadlines "
        "missed) on PORT, on 127.0.0.1 unless ADDRESS is given; with --key-file the page asks for a token, and "
        "the URL printed at start carries it (default: off; not with --procs above 1)",
    )
    serve.add_argument(
        "--key-file", metavar="FILE",
        help="pre-shared key (at least 16 bytes, not readable by other users): every frame must carry its "
        "HMAC; boards use the same file with split-device --key-file (default: no authentication)",
    )
    serve.add_argument("--tls-cert", metavar="FILE", help="serve TLS (1.2+) with this certificate chain (PEM)")
    serve.add_argument("--tls-key", metavar="FILE", help="the private key of --tls-cert (PEM)")
    serve.add_argument(
        "--loop", choices=LOOPS, default="auto",
        help="event loop: auto takes uvloop when installed (the host extra installs it), else asyncio's (default: auto)",
    )
    serve.add_argument(
        "--peer", action="append", default=[], type=_address, metavar="HOST:PORT",
        help="a host this one may pass a chain's requests on to (repeat for each); a host with --key-file "
        "passes authenticated requests on to any host, one without only to these",
    )
    serve.add_argument(
        "--procs", type=procs_flag(AUTO), default=1, metavar="N|auto",
        help="serve from this many processes on one port (SO_REUSEPORT, Linux; the kernel spreads the connections): "
        "each its own event loop, framing, auth, tails and batches; one zeroconf record, one --metrics-port "
        "summing them, one shutdown; a process that dies stops the host, exit status 2. auto: from the cores, "
        "said at start: on CUDA a process per --workers + 2 cores (its event loop, its tail workers, room for the "
        f"kernel: {CUDA_WORKERS + 2} by default; at most {MAX_CUDA_PROCS}), on the CPU one per {CPU_CORES_PER_PROC} "
        "cores (default: 1)",
    )
    serve.add_argument("-v", "--verbose", action="store_true", help="log every error reply")



def _address(text: str) -> str:
    try:
        split_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}, e.g. 192.168.1.20:7767") from None
    return text


class _Stop(asyncio.Event):
    """Set on SIGINT or SIGTERM, and when (loop time): the drain deadline counts from the signal,
    not from when the host got round to stopping (a zeroconf record withdrawn, a page closed)."""

    at: float | None = None

    def set(self) -> None:
        if self.at is None:
            self.at = asyncio.get_running_loop().time()
        super().set()

    def deadline(self, drain_timeout: float) -> float:
        """When the host must be stopped: the signal's time (now, without one) plus ``drain_timeout``."""
        return (asyncio.get_running_loop().time() if self.at is None else self.at) + drain_timeout


def _stop_on_signals(stop: asyncio.Event, caught: list[signal.Signals]) -> None:
    """Set ``stop`` on SIGINT or SIGTERM and note which (the host exits 128 + it: 130, 143); a
    second signal falls back to the default (hard) action."""
    loop = asyncio.get_running_loop()

    def handle(sig: signal.Signals) -> None:
        caught.append(sig)
        stop.set()
        loop.remove_signal_handler(sig)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, handle, sig)


def _stopped(caught: Sequence[signal.Signals]) -> str:
    return f"host stopped ({caught[0].name})" if caught else "host stopped"


async def serve(settings: HostSettings, child: Child | None = None, caught: list[signal.Signals] | None = None) -> None:
    """One host process: the whole host, or (``child``) one of ``--procs`` on a shared port, which
    reports to the parent instead of printing, and leaves zeroconf to it. ``caught``: the signal
    that stopped it, for the exit status."""
    caught = [] if caught is None else caught
    stop = _Stop()
    if child is None:
        _stop_on_signals(stop, caught)  # from the start: a Ctrl-C while the tails load is one line too
    else:  # SIGINT is ignored (child_setup): the parent stops its children with SIGTERM
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    key = load_key(settings.key_file) if settings.key_file else None  # checked before the bundles load
    tls = server_context(settings.tls_cert, settings.tls_key) if settings.tls_cert else None
    # On CUDA every bucket size gets a session of its own in each tail (one shape per session, issue 32).
    cuda_buckets = bucket_sizes(settings.buckets, settings.max_batch, cuda=True) if on_cuda(settings.device) else ()
    registry = TailRegistry.from_paths(list(settings.bundles), threads=settings.threads, device=settings.device,
                                       tf32=settings.tf32, buckets=cuda_buckets)
    cuda = registry.device == "cuda"
    buckets = bucket_sizes(settings.buckets, settings.max_batch, cuda)
    # On the CPU the cores are shared among the processes: each takes its part of them for its workers.
    procs = int(settings.procs)
    workers = settings.workers or (CUDA_WORKERS if cuda else max(ServerConfig.workers // procs, 1))
    notes: list[tuple[Any, str]] = []  # (stream, line): printed, or sent to the parent by a child
    max_connections, fd_warning = fit_fd_limit(settings.max_connections)
    if fd_warning is not None:
        notes.append((sys.stderr, fd_warning))
    config = settings.server_config(workers=workers, max_connections=max_connections, buckets=buckets, key=key, tls=tls,
                                    child_port=None if child is None else child.port)
    server = HostServer(registry, config)
    host, port = await server.start()
    live = None
    for bundle_id, splits in registry.served().items():
        coded = [s for s in splits if (bundle_id, s) in registry.coded]
        tails = [s for s in splits if (bundle_id, s) not in registry.coded]
        notes.append((sys.stdout, f"bundle {bundle_id}: {len(tails)} tails ({', '.join(tails)})"
                      + (f"; decodes {', '.join(coded)}" if coded else "")))
    if key is None:
        notes.append((sys.stderr, NO_KEY_WARNING))
    frames = "frames authenticated (HMAC-SHA256)" if key is not None else "frames not authenticated"
    listening = f"listening on {host}:{port}; {frames}, {'TLS' if tls is not None else 'no TLS'}"
    event_loop = type(asyncio.get_running_loop()).__module__.partition(".")[0]  # "uvloop" or "asyncio"
    padding = f"padded to {','.join(map(str, buckets))} (warmed up)" if buckets else "not padded"
    share = " (a worker takes its share of the queue)" if server.batcher.config.shares else ""
    after = [(sys.stdout, f"tails run on {registry.device} ({workers} workers{', TF32' if cuda and settings.tf32 else ''}); "
                              f"batches of up to {settings.max_batch} samples{share}, "
                              f"{padding}, waiting at most "
                              f"{settings.max_wait_ms:g} ms; queue of {settings.max_queue} samples; {event_loop} event loop"),
             *([(sys.stdout, f"sessions: {registry.sessions()}")] if cuda else []),
             (sys.stdout, f"limits: {config.max_connections} connections ({config.max_connections_per_address} "
                              f"per address), idle {config.idle_timeout:g} s, frames finished within "
                              f"{config.frame_timeout:g} s, {config.max_partial_bytes / 2**20:g} MiB of frames arriving")]
    try:
        if settings.live is not None and child is None:  # a port in use is one line, the host closed after it
            live = serve_live(server, settings.live, key)
        if child is not None:
            child.reports.put(("ready", child.index, {
                "pid": os.getpid(), "metrics_port": None if server.metrics is None else server.metrics.port,
                "served": registry.served(), "listening": listening,
                "notes": [("stderr" if stream is sys.stderr else "stdout", line) for stream, line in notes],
                "after": [line for _, line in after],
            }))
            await _report_load(server, child, stop)
        else:
            _print_notes(notes)
            print(listening, flush=True)
            _print_notes(after)
            if server.metrics is not None:
                print(f"metrics on {server.metrics.url}{server.metrics.note}", flush=True)
            if live is not None:
                print(f"live page on {live.url}", flush=True)
            await _advertise(settings, port, registry.served(), server.load, key is not None, stop.wait)
    finally:
        deadline = stop.deadline(settings.drain_timeout)
        if live is not None:
            live.close()
        await server.close(deadline)
        if child is None:
            print(_stopped(caught), flush=True)


def _print_notes(notes: Sequence[tuple[Any, str]]) -> None:
    for stream, line in notes:
        print(line, file=stream, flush=True)


async def _report_load(server: HostServer, child: Child, stop: asyncio.Event) -> None:
    """A child's load into the parent's shared array once a second (for its zeroconf record), until ``stop``."""
    while not stop.is_set():
        child.loads[child.index] = server.load()
        try:
            await asyncio.wait_for(stop.wait(), 1.0)
        except asyncio.TimeoutError:
            pass


async def _advertise(settings: HostSettings, port: int, served: dict[str, list[str]], load: Callable[[], float],
                     auth: bool, until: Callable[[], Any]) -> None:
    """The zeroconf record, registered until ``until()`` returns (unless ``--no-zeroconf``)."""
    if not settings.zeroconf:
        await until()
        return
    interfaces = None if settings.interface == "0.0.0.0" else [settings.interface]
    async with Advertiser(local_address_for(settings.interface), port, list(served), interfaces, load=load,
                          auth=auth) as ad:
        print(f"advertised as {ad.info.name}", flush=True)
        await until()
    print("zeroconf record withdrawn", flush=True)


def _serve_child(settings: HostSettings, child: Child) -> None:
    """A ``--procs`` child process's entry (spawned): one host on the shared port until SIGTERM."""
    child_setup(child)
    logging.basicConfig(level=logging.DEBUG if settings.verbose else logging.WARNING,
                        format=f"%(name)s[{child.index}]: %(message)s")
    try:
        loop_runner(settings.loop)(serve(settings, child))
    except SplitEdgeError as exc:
        child.reports.put(("failed", child.index, str(exc)))
        sys.exit(2)


async def serve_procs(settings: HostSettings, caught: list[signal.Signals]) -> None:
    """``--procs N``: the parent, which supervises N children on one port (:mod:`host_runtime._procs`)."""
    if settings.key_file:
        load_key(settings.key_file)  # a bad key is one line from the parent, before any child starts
    stop = asyncio.Event()
    _stop_on_signals(stop, caught)

    async def parent(supervisor: Supervisor, ready: list[dict[str, Any]], stop: asyncio.Event) -> None:
        first = ready[0]
        _print_notes([(sys.stderr if stream == "stderr" else sys.stdout, line) for stream, line in first["notes"]])
        print(first["listening"], flush=True)
        _print_notes([(sys.stdout, line) for line in first["after"]])
        print(f"{settings.procs} processes on port {supervisor.port} (SO_REUSEPORT): pids "
              f"{', '.join(str(r['pid']) for r in ready)}", flush=True)
        metrics: MetricsEndpoint | None = None
        if settings.metrics_port is not None:
            token, note = endpoint_token(settings.metrics_interface, load_key(settings.key_file) if settings.key_file else None,
                                         read_token_file(settings.metrics_token_file) if settings.metrics_token_file else None)
            metrics = serve_summed_metrics(settings.metrics_interface, settings.metrics_port, [r["metrics_port"] for r in ready],
                                           token=token, note=note)
            print(f"metrics on {metrics.url} (the {settings.procs} processes summed){note}", flush=True)
        try:
            await _advertise(settings, supervisor.port, first["served"], supervisor.load, bool(settings.key_file),
                             lambda: supervisor.watch(stop))
        finally:
            if metrics is not None:
                await asyncio.get_running_loop().run_in_executor(None, metrics.close)

    try:
        await supervise(int(settings.procs), settings.interface, settings.port, _serve_child, settings, parent, stop,
                        settings.drain_timeout)
    finally:
        print(_stopped(caught), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = HostSettings.from_args(args)
    except SettingError as exc:
        parser.error(str(exc))
    if args.command == "install-service":
        defaults = HostSettings.from_args(parser.parse_args(["serve", *args.bundles]))
        return install_service(settings, defaults, ServiceOptions.from_args(args))
    try:
        runner = loop_runner(settings.loop)
    except SplitEdgeError as exc:
        parser.error(str(exc))
    logging.basicConfig(level=logging.DEBUG if settings.verbose else logging.WARNING, format="%(name)s: %(message)s")
    if settings.procs == AUTO:
        cuda = on_cuda(settings.device)
        procs, why = auto_procs(usable_cores(), cuda, settings.workers or (CUDA_WORKERS if cuda else 1))
        print(f"--procs auto: {procs} process{'es' if procs > 1 else ''} ({why})", flush=True)
        if settings.live is not None and procs != 1:
            parser.error(f"{LIVE_ONE_PROCESS} (--procs auto chose {procs} here)")
        settings = settings.with_procs(procs)
    caught: list[signal.Signals] = []
    status = run_command("split-host", serve(settings, None, caught) if settings.procs == 1 else serve_procs(settings, caught),
                         runner)
    if status == 0 and caught:
        # Past the drain deadline a tail run may still hold a worker thread, which the interpreter
        # would join at exit (seconds, for a large batch): the deadline is the host's, so exit now.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(128 + caught[0])
    return status


if __name__ == "__main__":
    sys.exit(main())
