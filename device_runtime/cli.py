"""``split-device``: run a bundle's head on the board's camera stream, the tail on a host.

``calibrate`` measures the board, the host and the link into ``calibration.json``; ``plan``
shows the table it produced; ``run`` streams frames with the split chosen from that table
(``--split auto``) or fixed; ``report`` turns a ``--trace`` into plots and a summary.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from importlib.metadata import entry_points
from typing import Any, Callable, Sequence

from calibration.bandit import BANDIT_FILENAME, Bandit
from device_runtime.board import (
    DEFAULT_BATCHES, DEFAULT_FRAME, DetectedBoard, InstalledBackend, add_commands, add_service_command,
    calibration_for, calibrations_for, detect_board, handler, install_service, installed_backends, settings_for,
)
from device_runtime.board.run_settings import (
    ACCURACY_LOSS, AGREEMENT, BATCH, FPS, FRAMES, KEYS, QUEUE, REPEATS, SUMMARY_EVERY, as_flag_type, batches,
    calibrate_settings, run_settings,
)
from device_runtime.bundle import FORMATS, Bundle
from device_runtime.engine import AUTO, PRECISIONS, PREPROCESS_PATHS
from device_runtime.live import live_flag
from device_runtime._run import DEFAULT, QUIET, VERBOSE, Output, calibrate_board, run_stream, table_text
from device_runtime.link import kernel_timing_support
from splitedge import SplitEdgeError
from splitedge.lifecycle import exit_on_signals, run_command
from splitedge.reading import add_report_arguments

EXAMPLES = """\
examples:
  split-device calibrate bundle/ --host auto                # once per board and bundle: writes bundle/calibration.json
  split-device run bundle/                                  # the Pi camera module (else camera 0), split from the table
  split-device run bundle/ --camera picam:1280x720@15       # the Pi camera at another size and frame rate
  split-device run bundle/ --camera 0 --batch 4 --trace run.jsonl  # OpenCV camera 0 (a USB webcam)
  split-device run bundle/ --camera clip.mp4 --realtime     # a recording replayed at its own frame rate, like a camera
  split-device run bundle/ --camera photos/ --host 192.168.1.20:7767 --split features_14_conv_2
  split-device run bundle/ --split features_4_conv_2+features_14_conv_2 --host 192.168.1.20:7767 --host 10.0.0.5:7767
  split-device run bundle/ --camera photos/ --split features_14_conv_2@k4  # the cut in 4 bits a value, where the bundle has them
  split-device run bundle/ --camera clip.mp4 --split local  # full model on the board, no host
  split-device report run.jsonl --out report/               # latency over time, CDFs, drops, gain over static splits
  split-device report a.jsonl b.jsonl --out compare/        # runs side by side in compare/report.html
  split-device run bundle/ --camera 0 --key-file host.key   # the host's key: every frame authenticated
  split-device run bundle/ --live 8080                      # watch it at http://127.0.0.1:8080/ (this board only)
  split-device run bundle/ --live 0.0.0.0:8080 --key-file host.key  # from the network: the page asks for a token
  split-device run bundle/ --camera 0 --host 192.168.1.20:7767 --key-file host.key --tls-ca host.pem  # and TLS
  split-device run bundle/ --verbose                        # a line per frame: label, split, stage times, why
  split-device run bundle/ --quiet --frames 300             # the final summary alone (and errors)
  split-device run bundle/ --json --summary-every 60 | jq -c 'select(.event == "split_change")'

run prints a line as it starts, a line each time the split answering frames changes (to, from,
and why: the table's cell and the rate estimate against its edges, the hysteresis holding a split
the table no longer wants, no host, a fallback and its error, a capped upload, the bandit's arm),
a summary every --summary-every seconds (answered, dropped, fps, p50/p95 capture to answer,
each split's share, the hosts) and a final one; --trace keeps every frame with its reason.
"""

CALIBRATE_EXAMPLES = """\
examples:
  split-device calibrate bundle/                            # host by zeroconf, batches 1,2,4,8,16
  split-device calibrate bundle/ --host 192.168.1.20:7767 --batch 1,4 --repeats 50
  split-device calibrate bundle/ --host 192.168.1.20:7767 --host 10.0.0.5:7767   # chains placed over both hosts
  split-device calibrate bundle/ --key-file host.key        # a host started with --key-file
  split-device calibrate bundle/ --fps 5 --batch 1          # heads timed as a 5 frames/s camera paces them
  split-device calibrate bundle/ --frame 1280x720           # preprocessing timed on the camera's 1280x720 frames
  split-device calibrate bundle/ --camera clip.mp4          # timed while the run's camera captures, on its frames and pace
  split-device calibrate bundle/ --backend tflite --precision int8  # a second table; run takes the one it runs
  split-device calibrate bundle/ --min-agreement 0.99       # offer only the codings that kept 99 % of the answers
  split-device plan bundle/ --out plan/                     # the table it wrote, as text and a plot
  split-device calibrate bundle/ --json | jq .table         # its summary as one JSON object (progress on stderr)
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
        "--camera", default=AUTO, type=_checked("camera"),
        help="'picam[N][:WIDTHxHEIGHT][@FPS]' (the Pi camera module via Picamera2; 640x480 at 30 fps unless given), "
        "an OpenCV camera index, a video file, a folder of images, or 'synthetic[:FPS]' (default auto: picam on a "
        "Raspberry Pi with a camera module, else 0)",
    )
    run.add_argument("--realtime", action="store_true",
                     help="replay a video file at its own frame rate, as a live camera (frames the board cannot keep "
                     "up with are dropped); default: as fast as the pipeline reads it")
    _host_arguments(run)
    run.add_argument(
        "--split", default=AUTO, type=_checked("split"),
        help="'auto' (default: from calibration.json, moving with the link), a split id, a split's k-bit "
        "coding (SPLIT@k4: its cut in 4 bits a value, where the bundle was built with --cut-bits), 'local' (the "
        "full model here) or 'offload' (the full model on the host)",
    )
    run.add_argument("--batch", type=_checked("batch"), default=1, help=f"frames per head run, at most {BATCH.high:g} (default 1)")
    run.add_argument("--queue", type=as_flag_type(QUEUE), default=None,
                     help="frames waiting before the drop policy applies (default: one batch when newest frames "
                     "win, a live camera's default; 4 otherwise)")
    run.add_argument("--drop", choices=("newest", "none"), default=None,
                     help="when the pipeline is full: newest wins (drop the oldest; default for a camera) or none "
                     "(wait; default for files and videos)")
    run.add_argument("--frames", type=as_flag_type(FRAMES), default=None,
                     help=f"stop after N frames, at most {FRAMES.high:,} (default: the whole source)")
    run.add_argument("--loop", action="store_true", help="repeat a folder of images forever")
    run.add_argument("--trace", metavar="FILE.jsonl", help="write one record per frame (see split-device report)")
    run.add_argument("--head-times", metavar="TRACE.jsonl",
                     help="with --split auto: decide with the head times that trace's run decided with (its calibrated "
                     "ones, then each refinement from the frame it made it at) instead of timing this board's: a "
                     "replay of a trial's decisions on another machine or under another load (python -m testbed "
                     "replay does this by default)")
    run.add_argument("--pace", metavar="TRACE.jsonl",
                     help="hold each stage the board runs (preprocessing, a head, the full model) to the time it took "
                     "in that trace's run, frame by frame: a replay at the speed of the trial's board (python -m "
                     "testbed replay does this by default); where this board is slower it runs at its own speed, "
                     "and the run's summary says how often")
    run.add_argument("--deadline-ms", type=_checked("deadline_ms"), default=None,
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
    run.add_argument("--live", metavar="[ADDRESS:]PORT", type=live_flag,
                     help="serve a live page of the run on PORT, on 127.0.0.1 unless ADDRESS is given: the latest "
                     "frame with its label, the split and why, the rate estimate against the table's boundaries, "
                     "each stage's latency over the last minute, drops and the host; with --key-file the page asks "
                     "for a token, and the URL printed at start carries it (default: off)")
    run.add_argument("--transmit", choices=("auto", "float32", "uint8"), default="auto",
                     help="cut tensor on the link (default auto: uint8 where the bundle has its quantization); a "
                     "split's k-bit codings are options of their own: --split SPLIT@k4")
    said = run.add_mutually_exclusive_group()
    said.add_argument("--verbose", "-v", action="store_true",
                      help="also a line per frame: label, split, stage times, the rate estimate and why that split (the default where the run ends by itself: --frames N, a folder of images, a video file; a live camera's run prints none unless asked)")
    said.add_argument("--quiet", "-q", action="store_true", help="print only errors and the final summary")
    run.add_argument("--json", action="store_true",
                     help="print JSON lines on stdout, one object per event (start, split_change, summary, final; "
                     "frame with --verbose), and nothing else there: progress goes to stderr")
    run.add_argument("--summary-every", type=as_flag_type(SUMMARY_EVERY), default=10.0, metavar="S",
                     help="seconds between summary lines (default 10)")

    cal = commands.add_parser(
        "calibrate", help="measure board, host and link; write calibration.json", epilog=CALIBRATE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cal.add_argument("bundle", help="bundle directory")
    _host_arguments(cal)
    cal.add_argument("--batch", type=as_flag_type(batches), default=DEFAULT_BATCHES, metavar="1,2,4",
                     help=f"batch sizes to measure, each at most {BATCH.high:g} (default 1,2,4,8,16)")
    cal.add_argument("--repeats", type=as_flag_type(REPEATS), default=20,
                     help=f"timed runs per measurement, after warm-up, at most {REPEATS.high:,} (default 20)")
    cal.add_argument("--fps", type=as_flag_type(FPS), default=0.0,
                     metavar="F",
                     help="time the board's runs F a second at most, as the camera will pace them: a board idle "
                          "between frames runs them at another speed than back to back (default 0: back to back)")
    cal.add_argument("--no-host", action="store_true", help="calibrate the board alone (every choice is local)")
    cal.add_argument("--min-agreement", type=as_flag_type(AGREEMENT), default=0.97, metavar="SHARE",
                     help="offer a split's k-bit coding (split-export build --cut-bits) to the table only where the "
                     "build measured it answering as the float model does on at least this share of held-out "
                     "images (default 0.97); a coding nothing measured is never offered")
    cal.add_argument("--max-accuracy-loss", type=as_flag_type(ACCURACY_LOSS), default=1.0, metavar="POINTS",
                     help="where the build measured top-1 on labelled test data instead: offer a coding that loses at "
                     "most this many points of the full model's top-1 (default 1)")
    cal.add_argument("--json", action="store_true",
                     help="print the summary as one JSON object on stdout at the end (progress on stderr)")
    cal.add_argument("--frame", type=_checked("frame"), default=DEFAULT_FRAME, metavar="WIDTHxHEIGHT",
                     help="the camera's frame size: preprocessing (by the --preprocess path) is timed on a frame "
                          f"this big, its cost grows with the frame (each side at most {KEYS['frame'].check.bounds.high:g} "
                          "pixels; default 640x480)")
    cal.add_argument("--camera", default=None, type=_checked("camera"), metavar="SPEC",
                     help="the camera the run will use (as run's --camera; a video file is replayed at its own "
                          "rate): it captures while the board is timed, as it will in the run, and preprocessing is "
                          "timed on its frames, at its size and, unless --fps says, at its pace (default: none, a "
                          "synthetic frame of --frame)")
    _runtime_arguments(cal)

    plan = commands.add_parser(
        "plan", help="print and plot the split table of calibration.json", epilog=CALIBRATE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    plan.add_argument("bundle", help="bundle directory with calibration.json")
    plan.add_argument("--out", metavar="DIR", help="also write plan.png (DSC Fig. 2 style) and plan.json here")

    report = commands.add_parser(
        "report", help="plots, a summary and report.html from --trace files; several runs side by side",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_report_arguments(report)  # split-trial report's too: one definition, in splitedge

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
    parser.add_argument("--host", type=_checked("host"), default=AUTO, action=_Hosts,
                        help="IP:PORT of the host (it prints its port as it starts; no default port), or 'auto' "
                        "for zeroconf (default); run --split CHAIN or a semantic split: once per stage or fragment, in "
                        "order; calibrate: again for "
                        "each other host a chain's later stages may run on (with auto: every host found)")
    parser.set_defaults(hops=[])
    parser.add_argument("--interface", action="append", type=_checked("interface"),
                        help="interface address for zeroconf (repeatable)")
    parser.add_argument("--timeout", type=_checked("timeout"), default=5.0,
                        help="seconds to find and connect to a host; a host silent this long is taken for gone "
                        "(default 5)")
    parser.add_argument("--key-file", metavar="FILE", type=_checked("key_file"),
                        help="the host's pre-shared key (split-host serve --key-file): every frame authenticated; "
                        "with a key, only hosts that authenticate frames are used")
    parser.add_argument("--tls-ca", metavar="FILE", type=_checked("tls_ca"),
                        help="connect with TLS, trusting this CA or the host's self-signed certificate (PEM); the "
                        "certificate must name the host's address")


def _checked(key: str) -> Callable[[str], Any]:
    """The flag's argparse type: the same check its key gets in device.toml and SPLITEDGE_*."""
    return as_flag_type(KEYS[key].check)


def _runtime_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=_checked("threads"), default=None,
                        help=f"inference threads, at most {KEYS['threads'].check.high:g} (default: the board profile's, else "
                        "the runtime's)")
    parser.add_argument("--backend", choices=(AUTO, *FORMATS), default=AUTO,
                        help="artifact format to run here (default auto: the board profile's, if the bundle has it)")
    parser.add_argument("--precision", choices=PRECISIONS, default="auto",
                        help="head and full-model precision (default auto: int8 where the bundle measured its top-1 "
                        "within 1 point of float32's)")
    parser.add_argument("--preprocess", type=_checked("preprocess"), default=AUTO, metavar="|".join(PREPROCESS_PATHS),
                        help="frame to model input: exact (PIL's resize, as torchvision) or fast (OpenCV, uint8); "
                        "default auto: fast where the bundle measured it agreeing with exact on 99.5%% of top-1 answers")


def plan(args: argparse.Namespace) -> None:
    bundle = Bundle.load(args.bundle, roles=())
    if (bundle.root / BANDIT_FILENAME).is_file():  # what a run with --deadline-ms learned, calibrated or not
        print("\n".join(Bandit.load(bundle.root / BANDIT_FILENAME).describe()))
    for table in calibrations_for(bundle).tables:
        print(table_text(table))
    if args.out:
        print(_trial_command("plot_plan")(calibration_for(bundle), args.out))  # the latest table is the one plotted


def report_command(args: argparse.Namespace) -> None:
    print(_trial_command("report")(args.traces, args.out, args.calibration, args.label))


def _trial_command(name: str) -> Callable[..., str]:
    """A field-trial command (plots need matplotlib, which a board does not install), found by its
    entry point: the board runtime never imports ``fieldtrial``."""
    found = entry_points(group="splitedge.device_commands", name=name)
    if not found:
        raise SplitEdgeError(f"this needs splitedge's field-trial tools, not installed here: pip install "
                             f"'splitedge[report]' (or run split-trial where they are)")
    return next(iter(found)).load()


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
    """Every command ends in one line: an error (exit 2), Ctrl-C (130) or SIGTERM (143)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    if args.command not in ("run", "calibrate"):
        return exit_on_signals("split-device", lambda: _command(args, argv))
    status = exit_on_signals("split-device", lambda: _settle(args, argv))
    if status != 0:
        return status
    if args.command == "run":
        return run_command("split-device", run_stream(run_settings(args), output(args)))
    return run_command("split-device", calibrate_board(calibrate_settings(args), output(args)))


def output(args: argparse.Namespace) -> Output:
    """What ``run`` or ``calibrate`` prints, from ``--verbose``, ``--quiet``, ``--json`` and ``--summary-every``."""
    detail = VERBOSE if getattr(args, "verbose", False) else QUIET if getattr(args, "quiet", False) else DEFAULT
    return Output(detail=detail, json=args.json, summary_every_s=getattr(args, "summary_every", 10.0))


def _settle(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """device.toml and SPLITEDGE_* fill the flags not given."""
    settings_for(args, argv, build_parser)
    return 0


def _command(args: argparse.Namespace, argv: Sequence[str]) -> int:
    admin = install_service if args.command == "install-service" else handler(args.command, build_parser)
    if admin is not None:
        return admin(args)
    _settle(args, argv)
    {"info": info, "plan": plan, "report": report_command}[args.command](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
