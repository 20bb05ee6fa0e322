"""What ``split-device run`` and ``calibrate`` run with, typed, and the one check of each value.

A value means the same wherever it comes from: the flag's argparse ``type``, a key of
``device.toml``, a ``SPLITEDGE_*`` variable and ``split-device config --set`` all go through the
check in :data:`KEYS` (a batch of 0, a timeout of ``nan`` or text that is not UTF-8 is refused
where it enters, not when ``run`` trips over it). :class:`RunSettings` and
:class:`CalibrateSettings` are what the library (``device_runtime.run``) takes; the CLI only
builds them.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from device_runtime.board.calibrate import DEFAULT_BATCHES, DEFAULT_FRAME
from device_runtime.bundle import FORMATS
from device_runtime.engine import AUTO, PRECISIONS, PREPROCESS_PATHS
from device_runtime.hosts import host_address
from splitedge import HostUnavailableError, LOCAL

__all__ = [
    "AUTO", "CalibrateSettings", "Connection", "KEYS", "Key", "RunSettings", "Runtime", "SettingError", "as_flag_type",
    "calibrate_settings", "run_settings",
]

ENV_PREFIX = "SPLITEDGE_"


class SettingError(ValueError):
    """A setting's value refused by its check; the message says what is expected, with an example."""


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


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise SettingError(f"expected a whole number >= 1, like 4, got {value!r}") from None
    if number < 1:
        raise SettingError(f"expected a whole number >= 1, like 4, got {value!r}")
    return number


def _number(value: str, ok: Callable[[float], bool], what: str, expected: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or not ok(number):
        raise SettingError(f"{what} {value!r}: expected {expected}")
    return number


def positive_seconds(value: str) -> float:
    return _number(value, lambda n: n > 0, "timeout", "seconds > 0, like 5")


def milliseconds(value: str) -> float:
    return _number(value, lambda n: n >= 0, "deadline", "milliseconds >= 0, like 100 (0: none)")


def non_negative_rate(value: str) -> float:
    return _number(value, lambda n: n >= 0, "frame rate", "frames per second >= 0, like 5 or 0.5")


def frame_size(value: str) -> tuple[int, int]:
    """``WIDTHxHEIGHT``, the camera's frame size in pixels, like 640x480."""
    width, sep, height = value.lower().partition("x")
    if sep and width.isdecimal() and height.isdecimal() and int(width) >= 1 and int(height) >= 1:
        return int(width), int(height)
    raise SettingError(f"frame size {value!r}: expected WIDTHxHEIGHT in pixels, like 640x480")


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
    try:
        found = tuple(sorted({int(part) for part in value.split(",") if part.strip()}))
    except ValueError:
        raise SettingError(f"batch sizes {value!r}: expected integers like 1,2,4") from None
    if not found or found[0] < 1:
        raise SettingError(f"batch sizes {value!r}: at least one, each at least 1")
    return found


def one_of(*choices: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        if value not in choices:
            raise SettingError(f"expected one of {', '.join(choices)}, got {value!r}")
        return value

    check.__name__ = "choice"
    return check


def as_flag_type(check: Callable[[str], Any]) -> Callable[[str], Any]:
    """``check`` as an argparse ``type``: its message becomes the usage error."""

    def parse(value: str) -> Any:
        try:
            return check(value)
        except SettingError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = check.__name__
    return parse


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
    Key("timeout", positive_seconds, (int, float)),
    Key("key_file", text, str),
    Key("tls_ca", text, str),
    Key("backend", one_of(AUTO, *FORMATS), str),
    Key("precision", one_of(*PRECISIONS), str),
    Key("threads", positive_int, int),
    Key("preprocess", one_of(*PREPROCESS_PATHS), str),
    Key("camera", text, (str, int), commands=("run",)),
    Key("split", text, str, commands=("run",)),
    Key("batch", positive_int, int, commands=("run",)),
    Key("deadline_ms", milliseconds, (int, float), commands=("run",)),
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
    deadline_ms: float | None = None  # None: the camera's frame interval; 0: none
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


def _connection(args: argparse.Namespace) -> Connection:
    interface = getattr(args, "interface", None)
    return Connection(host=args.host, hops=tuple(args.hops), interface=tuple(interface) if interface else None,
                      timeout=args.timeout, key_file=args.key_file, tls_ca=args.tls_ca)


def _runtime(args: argparse.Namespace) -> Runtime:
    return Runtime(backend=args.backend, precision=args.precision, threads=args.threads, preprocess=args.preprocess)


def run_settings(args: argparse.Namespace) -> RunSettings:
    """``run``'s flags, already filled from the files and the environment, as one typed value."""
    return RunSettings(
        bundle=args.bundle, connection=_connection(args), runtime=_runtime(args), camera=str(args.camera),
        realtime=args.realtime, split=args.split, batch=args.batch, queue=args.queue, drop=args.drop,
        frames=args.frames, loop=args.loop, trace=args.trace, deadline_ms=args.deadline_ms, learn=args.learn,
        transmit=args.transmit, live=args.live, head_times=args.head_times,
        pace=args.pace,
    )


def calibrate_settings(args: argparse.Namespace) -> CalibrateSettings:
    return CalibrateSettings(
        bundle=args.bundle, connection=_connection(args), runtime=_runtime(args), batches=args.batch,
        repeats=args.repeats, fps=args.fps, no_host=args.no_host, frame=args.frame, camera=args.camera,
    )
