"""The CPUs this process may use, and onnxruntime sessions that stay on them.

onnxruntime left to itself sizes its intra-op pool to the machine's physical cores, pins each
worker to one of them (whatever the process's affinity says) and lets the workers spin between
runs. A field trial (issue 43) saw all three go wrong on a shared board: calibration timed seven
sessions in turn, each with two spinning threads that slowed the next (the full MobileNetV2
145 ms calibrated, 53 ms alone, 25-32 ms with one thread), and a host's pool put a worker on the
board's CPU, outside the host process's affinity. So every session here is made by
:func:`session_options`: as many threads as the process may use (its affinity, and its cgroup's
CPU quota), each worker allowed only the process's CPUs, and no spinning where several sessions
take turns on the same CPUs (a board's heads and full model, a calibration's round robin).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Iterable

__all__ = ["allowed_cpus", "cpu_quota", "session_options", "usable_cpus"]

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")


def allowed_cpus() -> frozenset[int]:
    """The CPUs the scheduler may run this process on (``taskset``, a cpuset, a benchmark's pin)."""
    return frozenset(os.sched_getaffinity(0))


def cpu_quota(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> float | None:
    """The CPUs' worth of time this process's cgroup (and every group above it) may use, the
    smallest quota on the way up: ``cpu.max`` (cgroup v2) or ``cpu.cfs_quota_us`` over
    ``cpu.cfs_period_us`` (v1). None where no group sets one or the files cannot be read."""
    try:
        lines = proc_cgroup.read_text(errors="replace").splitlines()[:64]
    except OSError:
        return None
    quotas: list[float] = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":  # v2: one unified hierarchy
            quotas += _walk(root, path, _v2_quota)
        elif "cpu" in controllers.split(","):
            base = next((root / name for name in ("cpu,cpuacct", "cpu") if (root / name).is_dir()), None)
            if base is not None:
                quotas += _walk(base, path, _v1_quota)
    return min(quotas, default=None)


def _walk(base: Path, path: str, read: Any) -> Iterable[float]:
    """``read`` of the group at ``path`` under ``base`` and of each group above it."""
    parts = [p for p in path.strip().split("/") if p and p not in (".", "..")]
    for depth in range(len(parts), -1, -1):
        quota = read(base.joinpath(*parts[:depth]))
        if quota is not None:
            yield quota


def _v2_quota(group: Path) -> float | None:
    try:
        quota, period = (group / "cpu.max").read_text()[:64].split()[:2]
        return None if quota == "max" else _ratio(float(quota), float(period))
    except (OSError, ValueError):
        return None


def _v1_quota(group: Path) -> float | None:
    try:
        quota = float((group / "cpu.cfs_quota_us").read_text()[:32])
        period = float((group / "cpu.cfs_period_us").read_text()[:32])
    except (OSError, ValueError):
        return None
    return None if quota < 0 else _ratio(quota, period)


def _ratio(quota: float, period: float) -> float | None:
    return quota / period if period > 0 and math.isfinite(quota / period) and quota > 0 else None


def usable_cpus(cpus: frozenset[int] | None = None, quota: float | None = None) -> int:
    """How many threads of computation this process can run at once: its CPUs, fewer where its
    cgroup's quota allows fewer (rounded down: a second thread on a 1.5-CPU quota only waits its
    turn), at least one. ``cpus`` and ``quota`` default to this process's own."""
    count = len(allowed_cpus() if cpus is None else cpus)
    quota = cpu_quota() if quota is None else quota
    if quota is not None:
        count = min(count, int(quota))
    return max(1, count)


def _ort_cpu_list(cpus: Iterable[int]) -> str:
    """A set of CPUs as onnxruntime's affinity strings write it: ranges and single ids, counted
    from 1 (the kernel's CPU 0 is onnxruntime's 1), so the kernel's {0, 1, 2, 3, 6} is ``1-4,7``."""
    runs: list[list[int]] = []
    for cpu in sorted(c + 1 for c in cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def session_options(ort: Any, threads: int | None = None, spinning: bool = False,
                    cpus: frozenset[int] | None = None) -> Any:
    """onnxruntime ``SessionOptions`` for a session that stays on this process's CPUs.

    ``threads`` (None: :func:`usable_cpus`) is always set, so onnxruntime never sizes its pool to
    the machine and never pins a worker itself; each of its ``threads - 1`` workers (the caller's
    thread is the first) may run on any of ``cpus`` (default: the process's) and nowhere else.
    ``spinning`` off (the default) makes a worker sleep between runs instead of spinning for the
    next: where sessions alternate, one session's spinning workers take the CPU the next one runs on.
    """
    cpus = allowed_cpus() if cpus is None else cpus
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or usable_cpus(cpus)
    options.inter_op_num_threads = 1  # sequential execution: no second pool
    if options.intra_op_num_threads > 1:
        options.add_session_config_entry(
            "session.intra_op_thread_affinities", ";".join([_ort_cpu_list(cpus)] * (options.intra_op_num_threads - 1)))
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return options
