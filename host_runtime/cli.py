"""``split-host``: serve the tails of one or more bundles to boards on the network."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Callable, Sequence

from device_runtime.lifecycle import run_command, stop_on_signals
from device_runtime.wire.auth import load_key
from device_runtime.wire.ops import split_address
from device_runtime.wire.protocol import DEFAULT_MAX_FRAME_BYTES
from device_runtime.wire.tls import server_context
from host_runtime.advertise import Advertiser, local_address_for
from host_runtime.batcher import BatchConfig
from host_runtime.event_loop import LOOPS, loop_runner
from host_runtime.limits import fit_fd_limit
from host_runtime.server import HostServer, ServerConfig
from host_runtime.service import SERVICE_EXAMPLES, install_service, service_arguments
from host_runtime.tails import DEVICES, TailRegistry
from splitedge.errors import SplitEdgeError

EXAMPLES = """\
examples:
  split-host serve bundle/                         # all interfaces, port 7767, advertised by zeroconf
  split-host serve bundle/ --interface 127.0.0.1   # this machine only
  split-host serve a/ b/ --port 9000 --no-zeroconf # two bundles, no discovery
  split-host serve bundle/ --metrics-port 9100     # Prometheus text at http://HOST:9100/metrics
  split-host serve bundle/ --max-batch 32 --max-wait-ms 5   # bigger batches for a busy fleet
  split-host serve bundle/ --max-batch 1 --max-queue 64     # no batching, refuse sooner
  split-host serve bundle/ --device cpu            # keep the tails off the GPU
  split-host serve bundle/ --max-connections 256 --idle-timeout 60   # a smaller host, stricter
  split-host serve bundle/ --loop asyncio          # asyncio's own event loop even where uvloop is installed
  openssl rand -hex 32 > host.key && chmod 600 host.key   # a pre-shared key; copy it to the boards
  split-host serve bundle/ --key-file host.key     # every frame authenticated (HMAC-SHA256), replays refused
  split-host serve bundle/ --key-file host.key --tls-cert host.pem --tls-key host-key.pem   # and encrypted (TLS)
  split-host serve bundle/ --peer 192.168.1.21:7767   # an edge host that passes chains on to the cloud host
"""

NO_KEY_WARNING = "warning: no --key-file: frames are not authenticated; anyone on this network can use this host"


def _at_least(minimum: float, kind: type[int] | type[float]) -> Callable[[str], int | float]:
    """An argparse type: a number of ``kind`` no smaller than ``minimum`` (a usage error otherwise)."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}") from exc
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum:g}, got {text}")
        return value

    return parse


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
    serve.add_argument("--port", type=int, default=7767, help="TCP port (0 picks a free one; default 7767)")
    serve.add_argument("--interface", default="0.0.0.0", help="address to listen and advertise on (default: all)")
    serve.add_argument("--no-zeroconf", action="store_true", help="do not advertise the host")
    serve.add_argument("--workers", type=int, default=ServerConfig.workers,
                       help=f"tail worker threads (default: one per CPU, {ServerConfig.workers})")
    serve.add_argument("--threads", type=int, default=None, help="onnxruntime intra-op threads per tail")
    serve.add_argument(
        "--max-frame-mb", type=_at_least(0.001, float), default=DEFAULT_MAX_FRAME_BYTES / 2**20,
        help=f"refuse frames larger than this (MiB; default {DEFAULT_MAX_FRAME_BYTES / 2**20:g})",
    )
    serve.add_argument(
        "--max-partial-mb", type=_at_least(0.001, float), default=None,
        help="memory all connections together may hold in frames still arriving (MiB); a connection whose "
        "frame does not fit is not read until it does (default: 4 x --max-frame-mb, 256)",
    )
    config = ServerConfig()
    serve.add_argument(
        "--max-connections", type=_at_least(1, int), default=config.max_connections,
        help="connections kept in all; more are refused with a log line (a fleet is tens of boards, one "
        f"connection each; default {config.max_connections})",
    )
    serve.add_argument(
        "--max-connections-per-address", type=_at_least(1, int), default=config.max_connections_per_address,
        help="connections kept from one IP address (boards behind one NAT share it; default "
        f"{config.max_connections_per_address})",
    )
    serve.add_argument(
        "--idle-timeout", type=_at_least(0.001, float), default=config.idle_timeout,
        help="close a connection that sent nothing and waits for nothing this long, s (boards reconnect "
        f"by themselves; default {config.idle_timeout:g})",
    )
    serve.add_argument(
        "--frame-timeout", type=_at_least(0.001, float), default=config.frame_timeout,
        help="close a connection whose frame stays unfinished this long, s (a 64 MiB frame at 10 Mbit/s "
        f"takes 54; default {config.frame_timeout:g})",
    )
    serve.add_argument(
        "--device", choices=DEVICES, default="auto",
        help="where tails run: auto takes onnxruntime's CUDA provider when available (default: auto)",
    )
    defaults = BatchConfig()
    serve.add_argument(
        "--max-batch", type=_at_least(1, int), default=defaults.max_batch,
        help=f"samples per tail run; requests for the same split are batched up to this (1: off; default {defaults.max_batch})",
    )
    serve.add_argument(
        "--max-wait-ms", type=_at_least(0, float), default=defaults.max_wait_ms,
        help=f"how long a request waits for others to batch with (default {defaults.max_wait_ms:g})",
    )
    serve.add_argument(
        "--max-queue", type=_at_least(1, int), default=defaults.max_queue,
        help=f"samples waiting across the host before requests are answered 'overloaded' (default {defaults.max_queue})",
    )
    serve.add_argument(
        "--metrics-port", type=int, default=None,
        help="serve Prometheus text metrics on this port, on the --interface address (default: off)",
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
    serve.add_argument("-v", "--verbose", action="store_true", help="log every error reply")


def _address(text: str) -> str:
    try:
        split_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}, e.g. 192.168.1.20:7767") from None
    return text


async def serve(args: argparse.Namespace) -> None:
    key = load_key(args.key_file) if args.key_file else None  # checked before the bundles load
    tls = server_context(args.tls_cert, args.tls_key) if args.tls_cert or args.tls_key else None
    registry = TailRegistry.from_paths(args.bundles, threads=args.threads, device=args.device)
    max_connections, fd_warning = fit_fd_limit(args.max_connections)
    if fd_warning is not None:
        print(fd_warning, file=sys.stderr, flush=True)
    max_frame_bytes = int(args.max_frame_mb * 2**20)
    config = ServerConfig(
        host=args.interface, port=args.port, workers=args.workers, max_frame_bytes=max_frame_bytes,
        batching=BatchConfig(max_batch=args.max_batch, max_wait_ms=args.max_wait_ms, max_queue=args.max_queue),
        metrics_port=args.metrics_port, key=key, tls=tls, max_connections=max_connections,
        max_connections_per_address=args.max_connections_per_address, idle_timeout=args.idle_timeout,
        frame_timeout=args.frame_timeout,
        max_partial_bytes=4 * max_frame_bytes if args.max_partial_mb is None else int(args.max_partial_mb * 2**20),
        peers=tuple(args.peer),
    )
    server = HostServer(registry, config)
    stop = asyncio.Event()
    stop_on_signals(stop)
    host, port = await server.start()
    for bundle_id, splits in registry.served().items():
        print(f"bundle {bundle_id}: {len(splits)} tails ({', '.join(splits)})", flush=True)
    if key is None:
        print(NO_KEY_WARNING, file=sys.stderr, flush=True)
    frames = "frames authenticated (HMAC-SHA256)" if key is not None else "frames not authenticated"
    print(f"listening on {host}:{port}; {frames}, {'TLS' if tls is not None else 'no TLS'}", flush=True)
    event_loop = type(asyncio.get_running_loop()).__module__.partition(".")[0]  # "uvloop" or "asyncio"
    print(f"tails run on {registry.device}; batches of up to {args.max_batch} samples, waiting at most "
          f"{args.max_wait_ms:g} ms; queue of {args.max_queue} samples; {event_loop} event loop", flush=True)
    print(f"limits: {config.max_connections} connections ({config.max_connections_per_address} per address), "
          f"idle {config.idle_timeout:g} s, frames finished within {config.frame_timeout:g} s, "
          f"{config.max_partial_bytes / 2**20:g} MiB of frames arriving", flush=True)
    if server.metrics is not None:
        print(f"metrics on http://{host}:{server.metrics.port}/metrics", flush=True)
    try:
        if args.no_zeroconf:
            await stop.wait()
        else:
            interfaces = None if args.interface == "0.0.0.0" else [args.interface]
            async with Advertiser(
                local_address_for(args.interface), port, list(registry.served()), interfaces, load=server.load,
                auth=key is not None,
            ) as ad:
                print(f"advertised as {ad.info.name}", flush=True)
                await stop.wait()
            print("zeroconf record withdrawn", flush=True)
    finally:
        await server.close()
        print("host stopped", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if bool(args.tls_cert) != bool(args.tls_key):
        parser.error("--tls-cert and --tls-key go together")
    if args.max_partial_mb is not None and args.max_partial_mb < args.max_frame_mb:
        parser.error(f"--max-partial-mb {args.max_partial_mb:g} cannot hold one frame of --max-frame-mb {args.max_frame_mb:g}")
    if args.command == "install-service":
        return install_service(args, build_parser)
    try:
        runner = loop_runner(args.loop)
    except SplitEdgeError as exc:
        parser.error(str(exc))
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    return run_command("split-host", serve(args), runner)


if __name__ == "__main__":
    sys.exit(main())
