"""``split-device``: run a bundle's head on the board's camera stream, the tail on a host.

``calibrate`` measures the board, the host and the link into ``calibration.json``; ``plan``
shows the table it produced; ``run`` streams frames with the split chosen from that table
(``--split auto``) or fixed; ``report`` turns a ``--trace`` into plots and a summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Mapping, Sequence

from calibration import (
    BANDIT_FILENAME, FILENAME, Bandit, Calibration, CalibrationError, Calibrations, HostView, place_fragments, save,
)
from device_runtime.board.calibrate import (
    DEFAULT_BATCHES,
    calibrate,
    calibration_for,
    calibrations_for,
    precision_of,
    spread_warning,
)
from device_runtime.board.commands import add_commands, handler, settings_for
from device_runtime.board.detect import (
    DetectedBoard,
    InstalledBackend,
    detect_board,
    installed_backends,
    resolve_backend,
)
from device_runtime.board.status import LastRun
from device_runtime.bundle import FORMATS, FULL, HEAD, LOCAL, OFFLOAD, Bundle
from device_runtime.engine.runner import PRECISIONS, DeviceRunner, default_split
from device_runtime.hosts.client import Credentials, HostClient
from device_runtime.hosts.connect import connect_host, host_address
from device_runtime.hosts.discovery import discover
from device_runtime.hosts.host_link import HostLink
from device_runtime.hosts.kernel_timing import kernel_timing_support
from device_runtime.hosts.link_meter import LinkMeter
from device_runtime.lifecycle import notify, run_command, stop_on_signals
from device_runtime.service import add_service_command, install_service
from device_runtime.stream.camera import FrameSource, open_source
from device_runtime.stream.picamera import pi_camera_absent
from device_runtime.stream.pipeline import Pipeline, PipelineConfig
from device_runtime.stream.policy import AutoPolicy, BanditPolicy, SplitPolicy, StaticPolicy
from device_runtime.stream.trace import TraceWriter
from device_runtime.wire.auth import load_key
from device_runtime.wire.tls import client_context
from splitedge.errors import BundleError, CameraError, HostUnavailableError, SplitEdgeError

EXAMPLES = """\
examples:
  split-device calibrate bundle/ --host auto                # once per board and bundle: writes bundle/calibration.json
  split-device run bundle/                                  # the Pi camera module (else camera 0), split from the table
  split-device run bundle/ --camera picam:1280x720@15       # the Pi camera at another size and frame rate
  split-device run bundle/ --camera 0 --batch 4 --trace run.jsonl  # OpenCV camera 0 (a USB webcam)
  split-device run bundle/ --camera clip.mp4 --realtime     # a recording replayed at its own frame rate, like a camera
  split-device run bundle/ --camera photos/ --host 192.168.1.20:7767 --split features_14_conv_2
  split-device run bundle/ --split features_4_conv_2+features_14_conv_2 --host 192.168.1.20:7767 --host 10.0.0.5:7767
  split-device run bundle/ --camera clip.mp4 --split local  # full model on the board, no host
  split-device report run.jsonl --out report/               # latency over time, CDFs, drops, gain over static splits
  split-device run bundle/ --camera 0 --key-file host.key   # the host's key: every frame authenticated
  split-device run bundle/ --camera 0 --host 192.168.1.20:7767 --key-file host.key --tls-ca host.pem  # and TLS
"""

CALIBRATE_EXAMPLES = """\
examples:
  split-device calibrate bundle/                            # host by zeroconf, batches 1,2,4,8,16
  split-device calibrate bundle/ --host 192.168.1.20:7767 --batch 1,4 --repeats 50
  split-device calibrate bundle/ --host 192.168.1.20:7767 --host 10.0.0.5:7767   # chains placed over both hosts
  split-device calibrate bundle/ --key-file host.key        # a host started with --key-file
  split-device calibrate bundle/ --fps 5 --batch 1          # heads timed as a 5 frames/s camera paces them
  split-device calibrate bundle/ --backend tflite --precision int8  # a second table; run takes the one it runs
  split-device plan bundle/ --out plan/                     # the table it wrote, as text and a plot
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
        "--camera", default="auto",
        help="'picam[N][:WIDTHxHEIGHT][@FPS]' (the Pi camera module via Picamera2; 640x480 at 30 fps unless given), "
        "an OpenCV camera index, a video file, a folder of images, or 'synthetic[:FPS]' (default auto: picam on a "
        "Raspberry Pi with a camera module, else 0)",
    )
    run.add_argument("--realtime", action="store_true",
                     help="replay a video file at its own frame rate, as a live camera (frames the board cannot keep "
                     "up with are dropped); default: as fast as the pipeline reads it")
    _host_arguments(run)
    run.add_argument(
        "--split", default="auto",
        help="'auto' (default: from calibration.json, moving with the link), a split id, 'local' (the full "
        "model here) or 'offload' (the full model on the host)",
    )
    run.add_argument("--batch", type=int, default=1, help="frames per head run (default 1)")
    run.add_argument("--queue", type=int, default=None,
                     help="frames waiting before the drop policy applies (default: one batch when newest frames "
                     "win, a live camera's default; 4 otherwise)")
    run.add_argument("--drop", choices=("newest", "none"), default=None,
                     help="when the pipeline is full: newest wins (drop the oldest; default for a camera) or none "
                     "(wait; default for files and videos)")
    run.add_argument("--frames", type=int, default=None, help="stop after N frames (default: the whole source)")
    run.add_argument("--loop", action="store_true", help="repeat a folder of images forever")
    run.add_argument("--trace", metavar="FILE.jsonl", help="write one record per frame (see split-device report)")
    run.add_argument("--deadline-ms", type=_non_negative("deadline", "milliseconds", "100 (0: none)"), default=None,
                     metavar="MS",
                     help="each frame's budget at the host, its queue and tail: a host that cannot answer in time "
                     "says so and the frame runs here (default: a live camera's frame interval; none for files and "
                     "videos; 0: none). With a semantic split in the bundle and --split auto or a layer split, "
                     "also each frame's deadline from capture to answer: a bandit chooses per batch between the "
                     "layer split and the semantic split (SplitPlace), its state kept in bandit.json beside "
                     "calibration.json")
    run.add_argument("--learn", action="store_true",
                     help="with --deadline-ms and a semantic split: learn the choice ε-greedily (SplitPlace) rather "
                     "than run on what was learned (UCB that keeps learning slowly)")
    _runtime_arguments(run)
    run.add_argument("--transmit", choices=("auto", "float32", "uint8"), default="auto",
                     help="cut tensor on the link (default auto: uint8 where the bundle has its quantization)")

    cal = commands.add_parser(
        "calibrate", help="measure board, host and link; write calibration.json", epilog=CALIBRATE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cal.add_argument("bundle", help="bundle directory")
    _host_arguments(cal)
    cal.add_argument("--batch", type=_batches, default=DEFAULT_BATCHES, metavar="1,2,4",
                     help="batch sizes to measure (default 1,2,4,8,16)")
    cal.add_argument("--repeats", type=int, default=20, help="timed runs per measurement, after warm-up (default 20)")
    cal.add_argument("--fps", type=_non_negative("frame rate", "frames per second", "5 or 0.5"), default=0.0,
                     metavar="F",
                     help="time the board's runs F a second at most, as the camera will pace them: a board idle "
                          "between frames runs them at another speed than back to back (default 0: back to back)")
    cal.add_argument("--no-host", action="store_true", help="calibrate the board alone (every choice is local)")
    _runtime_arguments(cal)

    plan = commands.add_parser(
        "plan", help="print and plot the split table of calibration.json", epilog=CALIBRATE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    plan.add_argument("bundle", help="bundle directory with calibration.json")
    plan.add_argument("--out", metavar="DIR", help="also write plan.png (DSC Fig. 2 style) and plan.json here")

    report = commands.add_parser(
        "report", help="plots and a summary from a --trace file", epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    report.add_argument("trace", help="JSONL trace written by split-device run --trace")
    report.add_argument("--out", required=True, metavar="DIR", help="directory for the PNGs and summary.json")
    report.add_argument("--calibration", metavar="FILE",
                        help="calibration.json for the gain over static splits (default: the one the run used)")

    info_parser = commands.add_parser(
        "info", help="show the detected board, the installed backends and the profile in force",
        epilog=INFO_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    info_parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    add_commands(commands)  # verify, status, config, switch, rollback
    add_service_command(commands)
    return parser


class _Hosts(argparse.Action):
    """``--host`` again: a chain's later hosts, in stage order (``args.hops``)."""

    def __call__(self, parser, namespace, value, option_string=None) -> None:
        if getattr(namespace, "_host_given", False):
            namespace.hops = [*namespace.hops, value]
        else:
            namespace.host, namespace._host_given = value, True


def _host_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", type=_host, default="auto", action=_Hosts,
                        help="IP:PORT of the host (it prints its port as it starts; no default port), or 'auto' "
                        "for zeroconf (default); run --split CHAIN or a semantic split: once per stage or fragment, in "
                        "order; calibrate: again for "
                        "each other host a chain's later stages may run on (with auto: every host found)")
    parser.set_defaults(hops=[])
    parser.add_argument("--interface", action="append", help="interface address for zeroconf (repeatable)")
    parser.add_argument("--timeout", type=float, default=5.0,
                        help="seconds to find and connect to a host; a host silent this long is taken for gone "
                        "(default 5)")
    parser.add_argument("--key-file", metavar="FILE",
                        help="the host's pre-shared key (split-host serve --key-file): every frame authenticated; "
                        "with a key, only hosts that authenticate frames are used")
    parser.add_argument("--tls-ca", metavar="FILE",
                        help="connect with TLS, trusting this CA or the host's self-signed certificate (PEM); the "
                        "certificate must name the host's address")


def _credentials(args: argparse.Namespace) -> Credentials:
    """The key and TLS context of --key-file and --tls-ca, checked before anything starts."""
    return Credentials(
        key=load_key(args.key_file) if args.key_file else None,
        tls=client_context(args.tls_ca) if args.tls_ca else None,
    )


def _runtime_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=None,
                        help="inference threads (default: the board profile's, else the runtime's)")
    parser.add_argument("--backend", choices=("auto", *FORMATS), default="auto",
                        help="artifact format to run here (default auto: the board profile's, if the bundle has it)")
    parser.add_argument("--precision", choices=PRECISIONS, default="auto",
                        help="head and full-model precision (default auto: int8 where the bundle measured its top-1 "
                        "within 1 point of float32's)")


def _batches(text: str) -> tuple[int, ...]:
    try:
        batches = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"batch sizes {text!r}: expected integers like 1,2,4") from None
    if not batches or batches[0] < 1:
        raise argparse.ArgumentTypeError(f"batch sizes {text!r}: at least one, each at least 1")
    return batches


def _host(text: str) -> str:
    """``auto`` or ``IP:PORT``, refused as a usage error: a host without a port is never found."""
    if text != "auto":
        try:
            host_address(text)
        except HostUnavailableError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _non_negative(what: str, unit: str, example: str) -> Callable[[str], float]:
    """An argparse type: a finite number of ``unit`` >= 0 (a usage error naming ``what`` otherwise)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0:
            raise argparse.ArgumentTypeError(f"{what} {text!r}: expected {unit} >= 0, like {example}")
        return value

    return parse


def _runner(args: argparse.Namespace, bundle: Bundle, split_id: str, board: DetectedBoard) -> DeviceRunner:
    backend = resolve_backend(args.backend, bundle, split_id, board)
    threads = args.threads or (board.profile.threads if board.profile else None)
    return DeviceRunner(
        bundle, threads=threads, backend=backend, transmit=getattr(args, "transmit", "auto"), precision=args.precision
    )


async def run(args: argparse.Namespace) -> None:
    """The stream, leaving its summary in ``last-run.json`` beside the bundle (split-device status)."""
    last_run = LastRun(args.bundle)
    try:
        await _run(args, last_run)
    except BaseException as exc:
        last_run.failed(exc)
        raise
    finally:
        last_run.write()


async def _run(args: argparse.Namespace, last_run: LastRun) -> None:
    credentials = _credentials(args)
    bundle = Bundle.load(args.bundle, roles=(HEAD, FULL))
    board = detect_board()
    args.camera, chosen = _camera(args.camera, board)
    first = default_split(bundle) if args.split == "auto" else args.split
    start_split = LOCAL if first == OFFLOAD else first
    tables = _tables(args.split, bundle)
    if tables is not None and args.backend == "auto":
        args.backend = _calibrated_backend(tables, bundle, start_split, board)
    runner = _runner(args, bundle, start_split, board)
    calibration = _table_for(runner, tables, args.bundle) if tables is not None else None
    policy: SplitPolicy = AutoPolicy(calibration) if calibration is not None else StaticPolicy(first, bundle)
    warm = list(calibration.table.splits) if calibration is not None else [first]
    bandit = _bandit(args, bundle)
    if bandit is not None:
        policy = BanditPolicy(policy, bundle, bandit[0], bandit[1])
        warm.append(bandit[0])
        print(f"choosing per batch between the layer split and {bandit[0]} for a {args.deadline_ms:g} ms deadline "
              f"({bandit[1].mode}: {'ε-greedy' if args.learn else 'UCB'})", flush=True)
    for split_id in {*warm, LOCAL}:
        runner.warm_up(split_id)
    print(f"{board.describe()}: {runner.backend} backend, {runner.threads or 'default'} threads, "
          f"split {args.split}", flush=True)
    stop = asyncio.Event()
    stop_on_signals(stop)
    hosts = None
    if args.split != LOCAL:
        hosts = HostLink(bundle, args.host, args.interface, timeout=args.timeout, credentials=credentials)
        if await hosts.connect():
            print(f"host {hosts.address}: bundle {bundle.id}", flush=True)
        elif args.split != "auto":
            await hosts.close()
            raise SplitEdgeError(f"{hosts.last_error} (or run with --split auto to start locally and offload when "
                                 "a host appears)")
        else:
            print(f"no host yet ({hosts.last_error}); running locally, looking for one every "
                  f"{hosts.retry_s:g} s", flush=True)
    placements = _placements(bundle, args.split, args.host, args.hops, calibration.routes if calibration else {})
    if hosts is not None and args.host == "auto":
        placements["fragments"] = {**placements["fragments"], **await _spread_fragments(bundle, args)}
    config = PipelineConfig(batch=args.batch, queue=args.queue, drop=args.drop, request_timeout_s=args.timeout,
                            deadline_ms=args.deadline_ms, **placements)
    meter = LinkMeter()
    if calibration is not None and calibration.link is not None:
        meter.estimator.observe_rtt(calibration.link["rtt_ms"] / 1000.0)
    pipeline = Pipeline(runner, policy, hosts, config, meter)
    last_run.watch(bundle, pipeline.stats, policy)
    trace = TraceWriter(args.trace, _run_record(args, bundle, runner, calibration)) if args.trace else None
    try:
        with _open_camera(args, chosen) as source:
            print(f"camera: {source.description}{chosen}", flush=True)
            ready = False
            async for result in pipeline.run(source, frames=args.frames, stop=stop):
                print(result.line(), flush=True)
                if not ready:  # a frame answered: bundle, camera and a path to the result all work
                    notify(f"READY=1\nSTATUS=running {bundle.manifest.bundle_id} from {args.bundle}")
                    ready = True
                if trace is not None:
                    trace.frame(result)
    finally:
        notify("STOPPING=1")
        if trace is not None:
            trace.close()
        if hosts is not None:
            await hosts.close()
        if bandit is not None:
            print(f"kept what the bandit learned in {bandit[1].save(bundle.root / BANDIT_FILENAME)}", flush=True)
    stats = pipeline.stats
    per_split = ", ".join(f"{k} {v}" for k, v in stats.per_split.most_common())
    switches = f", {policy.switches} split switches" if isinstance(policy, AutoPolicy) else ""
    print(f"{stats.frames} frames: {stats.dropped} dropped ({stats.drop_rate:.1%}), {stats.fallbacks} answered "
          f"locally after a host failure{switches}; by split: {per_split}", flush=True)


def _bandit(args: argparse.Namespace, bundle: Bundle) -> tuple[str, Bandit] | None:
    """The semantic split and the bandit choosing it per batch, where the run has one: a deadline,
    a semantic split in the bundle, and --split auto or a layer split (the other arm). The bandit
    goes on from what it learned before (``bandit.json`` beside ``calibration.json``)."""
    semantic = [s.id for s in bundle.manifest.splits if s.fragments]
    if not args.deadline_ms or not semantic or args.split in (*semantic, LOCAL):
        if args.learn:
            why = ("needs --deadline-ms" if not args.deadline_ms else "needs a semantic split in the bundle "
                   "(split-export build --semantic K)" if not semantic else f"chooses for --split auto or a layer split, "
                   f"not {args.split}")
            raise SplitEdgeError(f"--learn: the layer/semantic bandit {why}")
        return None
    path = bundle.root / BANDIT_FILENAME
    bandit = Bandit.load(path) if path.is_file() else Bandit()
    bandit.mode = "learn" if args.learn else "run"
    return semantic[0], bandit


async def _spread_fragments(bundle: Bundle, args: argparse.Namespace) -> dict[str, tuple[str, ...]]:
    """Each semantic split's fragments over the hosts zeroconf finds serving the bundle
    (:func:`calibration.place_fragments`: the least loaded, no two on one host while another is
    free), from the loads they advertise. Nothing found: every fragment on the connected host."""
    semantic = [s for s in bundle.manifest.splits if s.fragments]
    if not semantic:
        return {}
    adverts = await discover(bundle.id, args.interface, timeout=args.timeout)
    placed = {}
    for split in semantic:
        names = [split.stage_id(f.index) for f in split.fragments]
        views = [HostView(f"{a.address}:{a.port}", {n: {1: 0.0} for n in names}, a.load, rate_bps=1.0) for a in adverts]
        placement = place_fragments(split.id, names, split.tensor.bytes_per_sample, {1: 0.0}, views, batch=1) if views else None
        if placement is not None:
            placed[split.id] = placement.hosts
            print(f"semantic split {split.id}: fragments on {', '.join(placement.hosts)}", flush=True)
    return placed


def _placements(
    bundle: Bundle, split_id: str, first: str, hops: list[str], placed: Mapping[str, tuple[str, ...]]
) -> dict[str, dict[str, tuple[str, ...]]]:
    """:class:`PipelineConfig`'s ``routes`` (each chain's hosts after the connected one) and
    ``fragments`` (each semantic split's fragments' hosts): the ``--host`` flags (``first``, then
    ``hops``) for the split named by ``--split``; otherwise a chain where calibration placed it
    (``placed``), else every stage or fragment on the connected host."""
    several = [s for s in bundle.manifest.splits if s.parts]
    later = {"routes": {s.id: tuple(placed.get(s.id, ())) for s in several if s.stages},
             "fragments": {s.id: () for s in several if s.fragments}}
    if not hops:
        return later
    split = next((s for s in several if s.id == split_id), None)
    if split is None:
        known = ", ".join(s.id for s in several) or "none in this bundle"
        raise SplitEdgeError(f"--host given {1 + len(hops)} times: the later ones are the hosts of a chain's stages "
                             f"or a semantic split's fragments; name it with --split (these splits: {known})")
    word = "stage" if split.stages else "fragment"
    if len(hops) != len(split.parts) - 1:
        raise SplitEdgeError(f"{split.kind} split {split.id} runs {word}s 1..{len(split.parts)} on hosts: give --host "
                             f"once per {word}, in order ({len(split.parts)}), or once for all of them on one host; "
                             f"got {1 + len(hops)}")
    if split.stages:
        later["routes"][split.id] = tuple(hops)
    else:
        later["fragments"][split.id] = (first, *hops)
    return later


def _open_camera(args: argparse.Namespace, chosen: str) -> FrameSource:
    try:
        return open_source(args.camera, loop=args.loop, realtime=args.realtime)
    except CameraError as exc:
        raise CameraError(f"{exc}{chosen}") from exc  # with why --camera auto took this one


def _camera(spec: str, board: DetectedBoard) -> tuple[str, str]:
    """The source ``--camera auto`` stands for here, and a note saying why (empty when named)."""
    if spec != "auto":
        return spec, ""
    if not (board.model or "").startswith("Raspberry Pi"):
        return "0", " (auto: not a Raspberry Pi, so OpenCV camera 0)"
    absent = pi_camera_absent()
    if absent is None:
        return "picam", " (auto: a Raspberry Pi with a camera module)"
    return "0", f" (auto: OpenCV camera 0, no Pi camera: {absent})"


def _tables(split: str, bundle: Bundle) -> Calibrations | None:
    """The bundle's calibration tables for ``--split auto`` (None otherwise, or with a warning when
    there are none: the run then holds the smallest cut)."""
    if split != "auto":
        return None
    try:
        return calibrations_for(bundle)
    except BundleError as exc:
        print(f"warning: {exc}; using split {default_split(bundle)} (the smallest cut) until then",
              file=sys.stderr, flush=True)
        return None


def _calibrated_backend(tables: Calibrations, bundle: Bundle, split_id: str, board: DetectedBoard) -> str:
    """``--backend auto`` with a calibration: the board profile's backend when it was calibrated, else the
    backend of the latest table that can run here (the table's timings are its backend's)."""
    preferred = resolve_backend("auto", bundle, split_id, board)
    if any(t.backend == preferred for t in tables.tables):
        return preferred
    installed = {b.format for b in installed_backends()}
    role = FULL if split_id == LOCAL else HEAD
    usable = tuple(t for t in tables.tables if t.backend in installed and bundle.has(split_id, role, fmt=t.backend))
    if not usable:
        return preferred
    return Calibrations(tables.bundle_id, tables.manifest_sha256, usable).latest().backend


def _table_for(runner: DeviceRunner, tables: Calibrations, bundle_dir: str) -> Calibration:
    """The table of the backend and precision ``runner`` runs. Without one, a one-line warning naming
    both and the command that measures it, and the nearest table (the same backend, else the same
    precision): its link and host times hold for any backend, and the head times of the splits
    this run takes are replaced by the ones it measures (AutoPolicy), which holds the cut better
    than no table at all would."""
    backend, precision = runner.backend, precision_of(runner)
    table = tables.get(backend, precision)
    if table is not None:
        return table
    table = tables.nearest(backend, precision)
    print(f"warning: {Path(bundle_dir) / FILENAME} was measured for {tables.describe()}, not for "
          f"{backend}/{precision}, which this run uses; choosing splits with the {'/'.join(table.key)} table "
          f"(its head times corrected as this run measures its own) — to measure this one, run split-device "
          f"calibrate {bundle_dir} --backend {backend} --precision {precision}", file=sys.stderr, flush=True)
    return table


def _run_record(
    args: argparse.Namespace, bundle: Bundle, runner: DeviceRunner, calibration: Calibration | None,
) -> dict[str, object]:
    return {
        "bundle_id": bundle.id, "policy": args.split, "batch": args.batch, "source": args.camera,
        "calibration": str(Path(args.bundle) / FILENAME) if calibration is not None else None,
        # The table the run chose its splits with, and what it ran: the report compares with the same table.
        "calibration_key": list(calibration.key) if calibration is not None else None,
        "backend": runner.backend, "precision": precision_of(runner),
        "host": args.host, "queue": args.queue, "drop": args.drop, "realtime": args.realtime,
    }


async def calibrate_command(args: argparse.Namespace) -> None:
    bundle = Bundle.load(args.bundle, roles=(HEAD, FULL))
    board = detect_board()
    runner = _runner(args, bundle, bundle.manifest.splits[0].id if bundle.manifest.splits else LOCAL, board)
    print(f"{board.describe()}: {runner.backend} backend, {runner.threads or 'default'} threads; "
          f"batches {', '.join(map(str, args.batch))}, {args.repeats} repeats"
          + (f" at {args.fps:g} runs/s" if args.fps > 0 else ""), flush=True)
    credentials = _credentials(args)
    client = None if args.no_host else await connect_host(
        bundle, args.host, args.interface, timeout=args.timeout, credentials=credentials, without_host="--no-host"
    )
    peers, loads = ([], {}) if client is None else await _chain_peers(bundle, args, credentials, client.address)
    try:
        result = await calibrate(runner, client, args.batch, args.repeats, board.to_dict(),
                                 lambda line: print(line, flush=True), args.fps, peers, loads)
    finally:
        for host in (client, *peers):
            if host is not None:
                await host.close()
    warning = spread_warning(result.head_spread)
    if warning is not None:
        print(warning, file=sys.stderr, flush=True)
    path = bundle.root / FILENAME
    tables = save(result, path)
    others = [f"{'/'.join(t.key)} ({t.created})" for t in tables.tables if t.key != result.key]
    print(f"wrote {path}: the {'/'.join(result.key)} table" + (f", kept {', '.join(others)}" if others else ""))
    print(_table_text(result))


async def _chain_peers(
    bundle: Bundle, args: argparse.Namespace, credentials: Credentials, first: str
) -> tuple[list[HostClient], dict[str, float]]:
    """The other hosts a chain's later stages may run on: the later ``--host`` flags, or with
    ``--host auto`` every other host zeroconf finds serving the bundle (and the loads they
    advertise). One that cannot be reached is named and left out: the chain is placed on the others."""
    if not any(s.stages for s in bundle.manifest.splits):
        return [], {}
    addresses, loads = list(args.hops), {}
    if args.host == "auto":
        adverts = await discover(bundle.id, args.interface, timeout=args.timeout)
        loads = {f"{a.address}:{a.port}": a.load for a in adverts}
        addresses = list(loads)
    peers = []
    for address in dict.fromkeys(a for a in addresses if a != first):
        try:
            peers.append(await connect_host(bundle, address, timeout=args.timeout, credentials=credentials))
        except HostUnavailableError as exc:
            print(f"peer {address} left out of chain placement: {exc}", file=sys.stderr, flush=True)
    return peers, loads


def plan(args: argparse.Namespace) -> None:
    bundle = Bundle.load(args.bundle, roles=())
    if (bundle.root / BANDIT_FILENAME).is_file():  # what a run with --deadline-ms learned, calibrated or not
        print("\n".join(Bandit.load(bundle.root / BANDIT_FILENAME).describe()))
    for table in calibrations_for(bundle).tables:
        print(_table_text(table))
    calibration = calibration_for(bundle)  # the latest table is the one plotted
    if args.out:
        from fieldtrial.plots import plot_table

        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        plot_table(calibration, out / "plan.png")
        (out / "plan.json").write_text(json.dumps(calibration.table.to_dict(), indent=2))
        print(f"wrote {out / 'plan.png'} and {out / 'plan.json'}")


def _table_text(calibration: Calibration) -> str:
    """For each batch size, the rate ranges over which each split is best (DSC Eq. 6)."""
    table = calibration.table
    lines = [f"best split by batch size and link rate (bundle {calibration.bundle_id}, "
             f"{'/'.join(calibration.key)} heads, calibrated {calibration.created}):"]
    for batch in table.batches:
        edges = table.boundaries(batch)
        first = table.lookup(batch, table.rates_bps[0])
        spans, low, current = [], table.rates_bps[0], first
        for rate, _, above in edges:
            spans.append(f"{current} {_mbit(low)}–{_mbit(rate)}")
            low, current = rate, above
        spans.append(f"{current} ≥{_mbit(low)}")
        lines.append(f"  B={batch:<3d} " + ";  ".join(spans))
    for chain, hosts in calibration.routes.items():
        lines.append(f"  chain {chain}: stage 1 on the host the board sends to, then {' > '.join(hosts)}")
    return "\n".join(lines)


def _mbit(rate_bps: float) -> str:
    return f"{rate_bps / 1e6:.3g} Mbit/s"


def report_command(args: argparse.Namespace) -> None:
    from calibration import load_all
    from fieldtrial.report import format_summary, write_report

    calibration = load_all(args.calibration) if args.calibration else None  # the report takes the run's table
    summary = write_report(args.trace, args.out, calibration)
    print(format_summary(summary))
    print(f"wrote {args.out}")


NO_BACKEND = "none: pip install 'splitedge[device]'"


def info(args: argparse.Namespace) -> None:
    """Print what ``run`` would work with here: the board, its profile and the backends."""
    board, backends = detect_board(), installed_backends()
    link = kernel_timing_support()  # how the link estimate will time transfers (issue 14)
    if args.json:
        report = {
            "board": board.to_dict(),
            "profile": board.profile.to_dict() if board.profile else None,
            "backends": [asdict(b) for b in backends],
            "link_timing": link.to_dict(),
        }
        print(json.dumps(report, indent=2))
        return
    print(f"board     {board.describe()}")
    print(f"machine   {board.machine()}")
    print(f"backends  {', '.join(b.describe() for b in backends) or NO_BACKEND}")
    print(f"profile   {_profile_line(board, backends)}")
    print(f"link      rate timed by {link.describe()}")
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
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    admin = install_service if args.command == "install-service" else handler(args.command, build_parser)
    try:
        if admin is not None:
            return admin(args)
        settings_for(args, argv, build_parser)  # device.toml and SPLITEDGE_* fill the flags not given
        if getattr(args, "hops", []) and args.command not in ("run", "calibrate"):
            raise SplitEdgeError(f"--host given {1 + len(args.hops)} times: only run and calibrate take a chain's hosts")
    except SplitEdgeError as exc:
        print(f"split-device: error: {exc}", file=sys.stderr)
        return 2
    if args.command in ("info", "plan", "report"):
        try:
            {"info": info, "plan": plan, "report": report_command}[args.command](args)
        except (SplitEdgeError, CalibrationError) as exc:
            print(f"split-device: error: {exc}", file=sys.stderr)
            return 2
        return 0
    command = run(args) if args.command == "run" else calibrate_command(args)
    return run_command("split-device", command)


if __name__ == "__main__":
    sys.exit(main())
