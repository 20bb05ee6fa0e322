"""``split-device``: run a bundle's head on the board's camera stream, the tail on a host."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import asdict
from typing import Sequence

from device_runtime.board import DetectedBoard, InstalledBackend, detect_board, installed_backends, resolve_backend
from device_runtime.bundle import LOCAL_SPLIT, Bundle
from device_runtime.camera import open_source
from device_runtime.lifecycle import run_command, stop_on_signals
from device_runtime.runner import PRECISIONS, DeviceRunner, connect_host, default_split

EXAMPLES = """\
examples:
  split-device run bundle/ --camera 0                       # Pi camera via OpenCV, host found by zeroconf
  split-device run bundle/ --camera photos/ --host 192.168.1.20:7767 --split features_14
  split-device run bundle/ --camera clip.mp4 --split local  # full model on the board, no host
  split-device run bundle/ --camera synthetic --frames 100 --interface 127.0.0.1
"""

INFO_EXAMPLES = """\
examples:
  split-device info                               # board, installed backends, recommended backend and threads
  split-device info --json | jq .profile.threads  # the same, for scripts
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="split-device", description="Run split networks on a board.", epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "run", help="classify a camera stream, head here and tail on a host", epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("bundle", help="bundle directory written by split-export build")
    run.add_argument(
        "--camera", default="0", help="OpenCV camera index, video file, folder of images, or 'synthetic' (default 0)"
    )
    run.add_argument("--host", default="auto", help="IP:PORT of the host, or 'auto' for zeroconf (default)")
    run.add_argument(
        "--split", default=None,
        help="split id, or 'local' for the full model on the board (default: the most compressive split)",
    )
    run.add_argument("--frames", type=int, default=None, help="stop after N frames (default: the whole source)")
    run.add_argument("--loop", action="store_true", help="repeat a folder of images forever")
    run.add_argument("--interface", action="append", help="interface address for zeroconf (repeatable)")
    run.add_argument("--threads", type=int, default=None,
                     help="inference threads (default: the board profile's, else the runtime's)")
    run.add_argument("--transmit", choices=("auto", "float32", "uint8"), default="auto",
                     help="cut tensor on the link (default auto: uint8 where the bundle has its quantization)")
    run.add_argument("--precision", choices=PRECISIONS, default="auto",
                     help="head and full-model precision (default auto: int8 where the bundle has it)")
    run.add_argument("--backend", choices=("auto", "onnx", "tflite"), default="auto",
                     help="artifact format to run here (default auto: the board profile's, if the bundle has it)")
    run.add_argument("--timeout", type=float, default=5.0, help="seconds to find and connect to a host")
    info_parser = commands.add_parser(
        "info", help="show the detected board, the installed backends and the profile in force",
        epilog=INFO_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    info_parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    return parser


async def run(args: argparse.Namespace) -> None:
    bundle = Bundle.load(args.bundle, roles=("head", "full"))
    split_id = args.split or default_split(bundle)
    board = detect_board()
    backend = resolve_backend(args.backend, bundle, split_id, board)
    threads = args.threads or (board.profile.threads if board.profile else None)
    runner = DeviceRunner(bundle, threads=threads, backend=backend, transmit=args.transmit, precision=args.precision)
    role = "full" if split_id == LOCAL_SPLIT else "head"
    print(f"{board.describe()}: {backend} backend, {runner.artifact_precision(split_id, role)}, "
          f"{threads or 'default'} threads", flush=True)
    stop = asyncio.Event()
    stop_on_signals(stop)
    client = None
    if split_id != LOCAL_SPLIT:
        bundle.manifest.split(split_id)  # refuse an unknown split before looking for a host
        client = await connect_host(bundle, args.host, args.interface, timeout=args.timeout)
        print(f"host {client.address}: bundle {bundle.id}, split {split_id}", flush=True)
    else:
        print(f"local: full model of bundle {bundle.id} on this board", flush=True)
    runner.warm_up(split_id)
    try:
        with open_source(args.camera, loop=args.loop) as source:
            async for result in runner.stream(source, split_id, client, frames=args.frames, stop=stop):
                print(result.line(), flush=True)
    finally:
        if client is not None:
            await client.close()


NO_BACKEND = "none: pip install 'splitedge[device]'"


def info(args: argparse.Namespace) -> None:
    """Print what ``run`` would work with here: the board, its profile and the backends."""
    board, backends = detect_board(), installed_backends()
    if args.json:
        report = {
            "board": board.to_dict(),
            "profile": board.profile.to_dict() if board.profile else None,
            "backends": [asdict(b) for b in backends],
        }
        print(json.dumps(report, indent=2))
        return
    print(f"board     {board.describe()}")
    print(f"machine   {board.machine()}")
    print(f"backends  {', '.join(b.describe() for b in backends) or NO_BACKEND}")
    print(f"profile   {_profile_line(board, backends)}")
    for problem in board.problems():
        print(f"warning   {problem}")


def _profile_line(board: DetectedBoard, backends: Sequence[InstalledBackend]) -> str:
    profile = board.profile
    if profile is None:
        return "none: the runtime's defaults (onnx, onnxruntime chooses the threads)"
    missing = "" if any(b.format == profile.backend for b in backends) else " (not installed here)"
    return (
        f"{profile.backend} backend{missing}, {profile.threads} threads; {profile.available_mb} MB for artifacts "
        f"({profile.memory_mb} MB less ~{profile.reserved_mb} MB for the OS and the runtime)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "info":
        info(args)
        return 0
    return run_command("split-device", run(args))


if __name__ == "__main__":
    sys.exit(main())
