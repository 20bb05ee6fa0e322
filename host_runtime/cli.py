"""``split-host``: serve the tails of one or more bundles to boards on the network."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Sequence

from device_runtime.discovery import local_address_for
from device_runtime.lifecycle import run_command, stop_on_signals
from device_runtime.protocol import DEFAULT_MAX_FRAME_BYTES
from host_runtime.advertise import Advertiser
from host_runtime.server import HostServer, ServerConfig
from host_runtime.tails import TailRegistry

EXAMPLES = """\
examples:
  split-host serve bundle/                         # all interfaces, port 7767, advertised by zeroconf
  split-host serve bundle/ --interface 127.0.0.1   # this machine only
  split-host serve a/ b/ --port 9000 --no-zeroconf # two bundles, no discovery
"""


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
    serve.add_argument("bundles", nargs="+", help="bundle directories written by split-export build")
    serve.add_argument("--port", type=int, default=7767, help="TCP port (0 picks a free one; default 7767)")
    serve.add_argument("--interface", default="0.0.0.0", help="address to listen and advertise on (default: all)")
    serve.add_argument("--no-zeroconf", action="store_true", help="do not advertise the host")
    serve.add_argument("--workers", type=int, default=ServerConfig.workers, help="tail worker threads")
    serve.add_argument("--threads", type=int, default=None, help="onnxruntime intra-op threads per tail")
    serve.add_argument(
        "--max-frame-mb", type=float, default=DEFAULT_MAX_FRAME_BYTES / 2**20,
        help="refuse frames larger than this (MiB)",
    )
    serve.add_argument("-v", "--verbose", action="store_true", help="log every error reply")
    return parser


async def serve(args: argparse.Namespace) -> None:
    registry = TailRegistry.from_paths(args.bundles, threads=args.threads)
    config = ServerConfig(
        host=args.interface, port=args.port, workers=args.workers, max_frame_bytes=int(args.max_frame_mb * 2**20)
    )
    server = HostServer(registry, config)
    stop = asyncio.Event()
    stop_on_signals(stop)
    host, port = await server.start()
    for bundle_id, splits in registry.served().items():
        print(f"bundle {bundle_id}: {len(splits)} tails ({', '.join(splits)})", flush=True)
    print(f"listening on {host}:{port}; authentication off (frames are not authenticated)", flush=True)
    try:
        if args.no_zeroconf:
            await stop.wait()
        else:
            interfaces = None if args.interface == "0.0.0.0" else [args.interface]
            async with Advertiser(local_address_for(args.interface), port, list(registry.served()), interfaces) as ad:
                print(f"advertised as {ad.info.name}", flush=True)
                await stop.wait()
            print("zeroconf record withdrawn", flush=True)
    finally:
        await server.close()
        print("host stopped", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    return run_command("split-host", serve(args))


if __name__ == "__main__":
    sys.exit(main())
