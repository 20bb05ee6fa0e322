"""The bounds of every number ``split-host`` takes (:class:`splitedge.Bounds`), each maximum with why.

A flag's type is :func:`splitedge.as_flag_type` of one of these: ``nan``, the infinities, a
negative and anything past the maximum are a usage error naming the flag and its range, exit
status 2, before anything starts (``--idle-timeout nan`` once crashed in an assertion,
``--max-wait-ms inf`` timed every request out, ``--threads 100000`` never listened, issue 45).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from device_runtime.wire.ops import HelloReply
from splitedge import Bounds, SettingError, as_flag_type

__all__ = ["BOUNDS", "flag", "procs_flag", "sizes_flag"]

#: A batch's samples: 4096 rows of a 224x224 image's cut are gigabytes of input to one tail run.
MAX_BATCH = Bounds(int, 1, 4096, example="8")

BOUNDS: dict[str, Bounds] = {
    # A TCP port; 0 asks the kernel for a free one.
    "port": Bounds(int, 0, 65535, "a TCP port", "7767", zero="a free one"),
    "metrics_port": Bounds(int, 0, 65535, "a TCP port", "9100", zero="a free one"),
    # Tail worker threads: past the cores of a two-socket server threads only queue for them.
    "workers": Bounds(int, 1, 1024, example="8"),
    # onnxruntime's intra-op threads per tail: each tail has a pool this big, and 100,000 never got
    # as far as listening; 256 is above any host's cores per tail run.
    "threads": Bounds(int, 1, 256, example="4"),
    # A frame's 4-byte length cannot say 4 GiB.
    "max_frame_mb": Bounds(float, 0.001, 4095, "MiB", "64"),
    # Frames arriving, all connections together: four of the largest frames the wire can carry.
    "max_partial_mb": Bounds(float, 0.001, 4 * 4095, "MiB", "256"),
    # Connections: the kernel's default most file descriptors a process may hold (nr_open).
    "max_connections": Bounds(int, 1, 1_048_576, example="1024"),
    "max_connections_per_address": Bounds(int, 1, 1_048_576, example="256"),
    # Idle connections are shed after this: an hour, so that shedding stays on (inf turned it off).
    "idle_timeout": Bounds(float, 0, 3600, "seconds", "300", low_open=True),
    # A frame unfinished this long: the largest frame at 10 Mbit/s takes an hour.
    "frame_timeout": Bounds(float, 0, 3600, "seconds", "60", low_open=True),
    # A board sends its hello as it connects; ten minutes is past any handshake.
    "first_frame_timeout": Bounds(float, 0, 600, "seconds", "10", low_open=True),
    # What is pending on SIGTERM: ten minutes, past systemd's stop timeout; 0 stops at once.
    "drain_timeout": Bounds(float, 0, 600, "seconds", "5"),
    # hello announces it to boards, which hold the same bounds.
    "profile_budget_ms": Bounds(float, HelloReply.MIN_PROFILE_BUDGET_MS, HelloReply.MAX_PROFILE_BUDGET_MS,
                                "milliseconds", "2000"),
    "max_batch": MAX_BATCH,
    # A request waiting for company: a second is a board's frame interval at 1 fps; longer only
    # delays every answer (inf timed every request out).
    "max_wait_ms": Bounds(float, 0, 1000, "milliseconds", "5", zero="no waiting"),
    # Samples waiting across the host before it answers overloaded.
    "max_queue": Bounds(int, 1, 1_048_576, example="256"),
    # Processes on one port: each holds its tails in memory; past the cores they only contend.
    "procs": Bounds(int, 1, 256, example="4"),
}


def flag(dest: str) -> Callable[[str], int | float]:
    """The argparse type of the flag whose dest is ``dest``: its :data:`BOUNDS` entry's check."""
    return as_flag_type(BOUNDS[dest])


def procs_flag(auto: str) -> Callable[[str], int | str]:
    """``--procs``: ``auto`` or a number of processes within ``BOUNDS['procs']``."""
    number = flag("procs")

    def procs(text: str) -> int | str:
        return text if text == auto else number(text)

    procs.bounds = BOUNDS["procs"]  # type: ignore[attr-defined]
    return procs


def sizes_flag(words: tuple[str, ...]) -> Callable[[str], str]:
    """``--buckets``: one of ``words`` or batch sizes like ``1,2,4,8``, each within :data:`MAX_BATCH`."""

    def buckets(text: str) -> str:
        if text in words:
            return text
        try:
            sizes = sorted({MAX_BATCH(size.strip()) for size in text.split(",")})
        except SettingError:
            raise argparse.ArgumentTypeError(
                f"{text!r}: give {', '.join(words)} or batch sizes such as 1,2,4,8, each from 1 to "
                f"{MAX_BATCH.high:g}") from None
        return ",".join(str(size) for size in sizes)

    buckets.bounds = MAX_BATCH  # type: ignore[attr-defined]
    return buckets
