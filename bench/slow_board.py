"""A slower board on this machine: a real-time process takes most of every millisecond of one CPU.

A Raspberry-Pi-class board is several times slower than this machine's cores. The benchmarks
run the board's ``split-device`` pinned to one CPU and leave it ``share`` of that CPU: a
``SCHED_FIFO`` process pinned there spins (1 - share) ms of every millisecond and sleeps the
rest, so whatever the board did before, it runs at ``share`` of the CPU at a 1 ms grain.

Why not a CPU cgroup quota (``cpu.cfs_quota_us``): CFS bandwidth hands out runtime per period
(at least 1 ms of quota, so a 4 ms period for a quarter core) and a group idle between frames
starts the next one with runtime left over on its CPU and at a phase of the period its own
wake-ups set. On this machine the full MobileNetV2 ran 39 ms back to back under a 0.25 quota
but 24-48 ms per frame at 2 frames/s (the median moving 30-40 ms from run to run), and a
4 ms head ran at full speed; under this process it runs 39.2 ms back to back and 39.4 ms
paced at 5 frames/s (min 37.5, max 42.4).

Run as a script it is the spinning process: ``python bench/slow_board.py CPU SHARE``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager
from typing import Iterator

PERIOD_S = 1e-3
READY = "stealing"


def steal(cpu: int, share: float) -> None:
    """Leave ``share`` of every PERIOD_S of ``cpu`` to the tasks pinned there; never returns."""
    os.sched_setaffinity(0, {cpu})
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))  # before any CFS task, the board included
    print(READY, flush=True)
    spin, clock = PERIOD_S * (1.0 - share), time.perf_counter
    while True:
        end = clock() + spin
        while clock() < end:
            pass
        time.sleep(PERIOD_S - spin)


@contextmanager
def slowed_cpu(cpu: int, share: float) -> Iterator[subprocess.Popen | None]:
    """``cpu`` left at ``share`` while inside; the spinning process (None where it cannot run real-time)."""
    if not 0.0 < share < 1.0:
        raise ValueError(f"board share {share}: expected a fraction of a CPU between 0 and 1")
    proc = subprocess.Popen([sys.executable, __file__, str(cpu), str(share)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        if proc.stdout.readline().strip() != READY:
            proc.wait(timeout=10)
            print(f"cannot slow CPU {cpu} ({proc.stderr.read().strip()[-300:]}): the board runs at this "
                  "machine's full speed", file=sys.stderr)
            yield None
            return
        yield proc
    finally:
        proc.kill()
        proc.wait()


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far, all its threads (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    steal(int(sys.argv[1]), float(sys.argv[2]))
