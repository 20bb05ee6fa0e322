"""What ``split-device run`` and ``calibrate`` run with, typed, and the one check of each value.

A value means the same wherever it comes from: the flag's argparse ``type``, a key of
``device.toml``, a ``SPLITEDGE_*`` variable and ``split-device config --set`` all go through the
check in :data:`KEYS` (a batch of 0, a timeout of ``nan``, 100,000 threads or text that is not
UTF-8 is refused where it enters, not when ``run`` trips over it); every number is a
:class:`splitedge.Bounds` with its maximum stated below. :class:`RunSettings` and
:class:`CalibrateSettings` are what the library (``device_runtime._run``) takes; the CLI only
builds them.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from device_runtime.board._calibrate import DEFAULT_BATCHES, DEFAULT_FRAME
from device_runtime.board._codings import AccuracyFloor
from device_runtime.bundle import FORMATS
from device_runtime.engine import AUTO, PRECISIONS, PREPROCESS_PATHS
from device_runtime.hosts import host_address
from splitedge import Bounds, LOCAL, SettingError, as_flag_type
from splitedge.errors import HostUnavailableError

__all__ = [
    "ACCURACY_LOSS", "AGREEMENT", "AUTO", "BATCH", "CalibrateSettings", "Connection", "FPS", "FRAMES", "FRAME_SIDE", "KEEP", "KEYS", "Key", "QUEUE",
    "REPEATS", "RunSettings", "Runtime", "SUMMARY_EVERY", "SettingError", "START_TIMEOUT", "THREADS", "as_flag_type",
    "batches", "calibrate_settings", "run_settings",
]

ENV_PREFIX = "SPLITEDGE_"


def text(value: str) -> str:
    """Any text a TOML file can hold: valid UTF-8 (no undecodable bytes from the shell) and no
    control characters, which would make the file :func:`write_settings` writes unreadable."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise SettingError(f"{value!r} is not valid UTF-8 text") from None
    if any(ord(c) < 0x20 or c == "\x7f" for c in value):
        raise SettingError(f"{value!r} holds a control character")
    return value


# The bounds of every number the board's commands take (splitedge._numbers), each maximum with why.
# A file may be written on another machine than the board that reads it (a deploy writes
# /etc/splitedge/device.toml), so no bound is this machine's CPU count or memory.

#: Inference threads (onnxruntime's or LiteRT's intra-op pool): 64 times a Raspberry Pi's 4 cores,
#: above any board's CPU count; threads past the cores only contend, and 100,000 was accepted by
#: ``config --set`` and the run died in SIGSEGV 83 s later (issue 45).
THREADS = Bounds(int, 1, 256, example="4")
#: Frames per head run: 1024 frames of 224x224 are 600 MB of float32 input, more than a board lends one batch.
BATCH = Bounds(int, 1, 1024, example="4")
#: Frames waiting before the drop policy applies: 4096 frames of 640x480 are 3.5 GiB.
QUEUE = Bounds(int, 1, 4096, example="4")
#: ``calibrate --min-agreement``: the share of answers a coded option must keep equal to the float model's.
AGREEMENT = Bounds(float, 0.0, 1.0, example="0.97")
#: ``calibrate --max-accuracy-loss``: the top-1 points a coded option may lose against the full model.
ACCURACY_LOSS = Bounds(float, 0.0, 100.0, example="1")
#: Frames before a run stops: over a year at 30 fps (a run without --frames goes on by itself).
FRAMES = Bounds(int, 1, 10**9, example="300")
#: Timed runs per calibration measurement: 10,000 runs of a 100 ms head are 17 minutes for one cell.
REPEATS = Bounds(int, 1, 10_000, example="20")
#: Seconds to find and connect to a host, and the silence that takes a host for gone: an hour.
TIMEOUT = Bounds(float, 0, 3600, "seconds", "5", low_open=True)
#: A frame's budget: past a minute a deadline is none (say 0).
DEADLINE_MS = Bounds(float, 0, 60_000, "milliseconds", "100", zero="none")
#: The pace calibration times the board at: far above the frame rate of any camera a board takes
#: (tens of frames a second; a fast cropped mode a hundred or two).
FPS = Bounds(float, 0, 1000, "frames per second", "5 or 0.5", zero="back to back")
#: A side of the camera's frame: above 8K video's 7680x4320 and any camera a board takes; an
#: 8192x8192 RGB frame is 192 MiB, where 100000x100000 asked 27.9 GiB and ended in a traceback (issue 45).
FRAME_SIDE = Bounds(int, 1, 8192, "pixels", "640")
#: Seconds between summary lines: a day.
SUMMARY_EVERY = Bounds(float, 0, 86_400, "seconds", "10", low_open=True)
#: Releases kept by switch, current and previous included: each is a bundle's heads on the board's card.
KEEP = Bounds(int, 1, 100, example="3")
#: Seconds systemd lets the board's service take to answer its first frame: an hour (a Pi Zero 2 W takes 3 minutes).
START_TIMEOUT = Bounds(int, 1, 3600, "seconds", "180")


def frame_size(value: str) -> tuple[int, int]:
    """``WIDTHxHEIGHT``, the camera's frame size in pixels, like 640x480, each side within :data:`FRAME_SIDE`."""
    width, sep, height = value.lower().partition("x")
    if sep and width.isdecimal() and height.isdecimal() and FRAME_SIDE.contains(int(width)) and \
            FRAME_SIDE.contains(int(height)):
        return int(width), int(height)
    raise SettingError(f"frame size {value!r}: expected WIDTHxHEIGHT in pixels, each side from {FRAME_SIDE.low:g} to "
                       f"{FRAME_SIDE.high:g}, like 640x480")


frame_size.bounds = FRAME_SIDE  # type: ignore[attr-defined]
frame_size.template = "{}x480"  # type: ignore[attr-defined]


#: A camera's own frame rate in its spec (``synthetic:FPS``, ``picam@FPS``): as --fps, above any
#: camera a board takes (``synthetic:nan`` was taken for a rate); the Pi camera's is above 0.
CAMERA_FPS = Bounds(float, 0, 1000, "frames per second", "15", zero="as fast as it can")
PICAM_FPS = Bounds(float, 0, 1000, "frames per second", "15", low_open=True)
#: ``picam[N][:WIDTHxHEIGHT][@FPS]``, as device_runtime.stream._picamera reads it.
_PICAM = re.compile(r"picam(?P<num>\d*)(?::(?P<w>\d+)x(?P<h>\d+))?(?:@(?P<fps>\d+(?:\.\d+)?))?")


def camera(value: str) -> str:
    """Any source ``run`` may open (text, as :func:`text`); the numbers of ``synthetic:FPS`` and
    ``picam[N][:WIDTHxHEIGHT][@FPS]`` checked here, within :data:`CAMERA_FPS`, :data:`PICAM_FPS` and
    :data:`FRAME_SIDE` (a camera number of at most three digits)."""
    value = text(value)
    if value.startswith("synthetic:"):
        try:
            CAMERA_FPS(value.partition(":")[2])
        except SettingError:
            raise SettingError(f"camera {value!r}: expected synthetic:FPS, the rate {CAMERA_FPS.describe()}, like "
                               f"synthetic:15") from None
    match = _PICAM.fullmatch(value)
    if match is not None:
        sides = [int(match[side]) for side in ("w", "h") if match[side]]
        if not all(FRAME_SIDE.contains(side) for side in sides) or (
                match["fps"] and not PICAM_FPS.contains(float(match["fps"]))) or len(match["num"]) > 3:
            raise SettingError(f"camera {value!r}: expected picam[N][:WIDTHxHEIGHT][@FPS], each side from "
                               f"{FRAME_SIDE.low:g} to {FRAME_SIDE.high:g} pixels and the rate "
                               f"{PICAM_FPS.describe()}, like picam:1280x720@15")
    return value


def host(value: str) -> str:
    """``auto`` or ``IP:PORT``: a host without a port is never found."""
    value = text(value)
    if value != AUTO:
        try:
            host_address(value)
        except HostUnavailableError as exc:
            raise SettingError(str(exc)) from None
    return value


def batches(value: str) -> tuple[int, ...]:
    """Batch sizes like ``1,2,4``, each within :data:`BATCH`."""
    parts = [part.strip() for part in value.split(",") if part.strip()]
    try:
        found = tuple(sorted({BATCH(part) for part in parts}))
    except SettingError:
        found = ()
    if not found:
        raise SettingError(f"batch sizes {value!r}: expected {BATCH.describe().replace('a whole number', 'whole numbers')}"
                           f" separated by commas, like 1,2,4")
    return found


batches.bounds = BATCH  # type: ignore[attr-defined]


def one_of(*choices: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        if value not in choices:
            raise SettingError(f"expected one of {', '.join(choices)}, got {value!r}")
        return value

    check.__name__ = "choice"
    return check


@dataclass(frozen=True)
class Key:
    """One setting a file, the environment or a flag may give: its check, the TOML types a file
    may hold it as, and the commands that take it."""

    dest: str  # the argparse dest and the key's name
    check: Callable[[str], Any]
    kind: type | tuple[type, ...]
    commands: tuple[str, ...] = ("run", "calibrate")
    many: bool = False  # a list in the file, comma-separated in the environment (--interface, repeatable)

    @property
    def flag(self) -> str:
        return "--" + self.dest.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.dest.upper()


KEYS: dict[str, Key] = {k.dest: k for k in (
    Key("host", host, str),
    Key("interface", text, str, many=True),
    Key("timeout", TIMEOUT, (int, float)),
    Key("key_file", text, str),
    Key("tls_ca", text, str),
    Key("backend", one_of(AUTO, *FORMATS), str),
    Key("precision", one_of(*PRECISIONS), str),
    Key("threads", THREADS, int),
    Key("preprocess", one_of(*PREPROCESS_PATHS), str),
    Key("camera", camera, (str, int), commands=("run",)),
    Key("split", text, str, commands=("run",)),
    Key("batch", BATCH, int, commands=("run",)),
    Key("deadline_ms", DEADLINE_MS, (int, float), commands=("run",)),
    Key("frame", frame_size, str, commands=("calibrate",)),
)}


@dataclass(frozen=True)
class Connection:
    """How the board finds and talks to its hosts (``--host``, ``--interface``, ``--timeout``, credentials)."""

    host: str = AUTO
    hops: tuple[str, ...] = ()  # --host again: a chain's later hosts or a semantic split's other fragments
    interface: tuple[str, ...] | None = None
    timeout: float = 5.0
    key_file: str | None = None
    tls_ca: str | None = None


@dataclass(frozen=True)
class Runtime:
    """What runs the board's networks (``--backend``, ``--precision``, ``--threads``) and prepares
    their input (``--preprocess``)."""

    backend: str = AUTO
    precision: str = AUTO
    threads: int | None = None
    preprocess: str = AUTO


@dataclass(frozen=True)
class RunSettings:
    """Everything ``split-device run`` streams with."""

    bundle: str
    connection: Connection = field(default_factory=Connection)
    runtime: Runtime = field(default_factory=Runtime)
    camera: str = AUTO
    realtime: bool = False
    split: str = AUTO
    batch: int = 1
    queue: int | None = None
    drop: str | None = None
    frames: int | None = None
    loop: bool = False
    trace: str | None = None
    # AUTO: a live camera's frame interval, none for files and videos; None: none (``--deadline-ms 0``,
    # converted here once, by run_settings: the flag's 0 goes no further).
    deadline_ms: float | str | None = AUTO
    learn: bool = False
    transmit: str = AUTO
    live: str | None = None  # --live [ADDRESS:]PORT: the run's live page (device_runtime.live); None: none
    head_times: str | None = None  # --head-times TRACE: decide with the head times that trace recorded
    pace: str | None = None  # --pace TRACE: each stage held to the time it took in that trace's run

    @property
    def auto(self) -> bool:
        """The split moves with the link (``--split auto``)."""
        return self.split == AUTO

    @property
    def local(self) -> bool:
        """The full model on the board, no host at all (``--split local``)."""
        return self.split == LOCAL

    @property
    def given_deadline_ms(self) -> float | None:
        """The deadline ``--deadline-ms`` gave in ms; None where it gave none or was not given (a live
        camera's frame interval is known only once it is open)."""
        return None if self.deadline_ms == AUTO else self.deadline_ms


@dataclass(frozen=True)
class CalibrateSettings:
    """Everything ``split-device calibrate`` measures with."""

    bundle: str
    connection: Connection = field(default_factory=Connection)
    runtime: Runtime = field(default_factory=Runtime)
    batches: tuple[int, ...] = DEFAULT_BATCHES
    repeats: int = 20
    fps: float = 0.0
    no_host: bool = False
    frame: tuple[int, int] = DEFAULT_FRAME  # (width, height) of the camera's frames: preprocessing is timed on one
    camera: str | None = None  # the run's camera, capturing while the board is timed (its frames' size and pace)
    floor: AccuracyFloor = AccuracyFloor()  # what a coded option must keep of the answers to be offered (issue 47)


def _connection(args: argparse.Namespace) -> Connection:
    interface = getattr(args, "interface", None)
    return Connection(host=args.host, hops=tuple(args.hops), interface=tuple(interface) if interface else None,
                      timeout=args.timeout, key_file=args.key_file, tls_ca=args.tls_ca)


def _runtime(args: argparse.Namespace) -> Runtime:
    return Runtime(backend=args.backend, precision=args.precision, threads=args.threads, preprocess=args.preprocess)


def _deadline_ms(flag: float | None) -> float | str | None:
    """``--deadline-ms`` (or a file's ``deadline_ms``) as the code says it: not given is AUTO, the
    flag's 0 ("none") is None, the one place that 0 is read."""
    if flag is None:
        return AUTO
    return flag or None


def run_settings(args: argparse.Namespace) -> RunSettings:
    """``run``'s flags, already filled from the files and the environment, as one typed value."""
    return RunSettings(
        bundle=args.bundle, connection=_connection(args), runtime=_runtime(args), camera=str(args.camera),
        realtime=args.realtime, split=args.split, batch=args.batch, queue=args.queue, drop=args.drop,
        frames=args.frames, loop=args.loop, trace=args.trace, deadline_ms=_deadline_ms(args.deadline_ms),
        learn=args.learn, transmit=args.transmit, live=args.live, head_times=args.head_times, pace=args.pace,
    )


def calibrate_settings(args: argparse.Namespace) -> CalibrateSettings:
    return CalibrateSettings(
        bundle=args.bundle, connection=_connection(args), runtime=_runtime(args), batches=args.batch,
        repeats=args.repeats, fps=args.fps, no_host=args.no_host, frame=args.frame, camera=args.camera,
        floor=AccuracyFloor(args.min_agreement, args.max_accuracy_loss),
    )
