"""What a board can say about itself: its bundle's files, its release, its service, its last run.

``split-device verify`` checks every file of a bundle against its manifest (for scripts and
deploys: every problem at once, one line each); ``split-device status`` reads the release
layout (:mod:`device_runtime.board._release`), asks systemd about the service, and reads
``last-run.json``, which every ``split-device run`` writes beside its bundle when it ends.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from device_runtime.board._release import Layout
from device_runtime.bundle import MANIFEST_NAME, Bundle, artifacts_of, verify_files
from splitedge import SplitEdgeError, write_atomically
from splitedge.reading import read_text_bounded

__all__ = ["LAST_RUN", "SERVICE", "LastRun", "board_status", "format_status", "service_state", "verify_report"]

LAST_RUN = "last-run.json"
#: What status reads of it: the run writes a few KB (its stats and split); more is no run's.
MAX_LAST_RUN_BYTES = 1 << 20
SERVICE = "splitedge-device"
NO_SYSTEMD = "no systemd"


def verify_report(path: str | Path) -> dict[str, Any]:
    """Every file of the bundle at ``path`` checked against its manifest (see :func:`verify_files`)."""
    manifest, problems = verify_files(path)
    files = 0 if manifest is None else len(manifest.full) + sum(len(artifacts_of(s)) for s in manifest.splits)
    return {
        "bundle": str(path), "ok": not problems, "files": files, "problems": problems,
        "bundle_id": None if manifest is None else manifest.bundle_id,
        "wire_id": None if manifest is None else manifest.wire_id,
    }


def service_state(unit: str = SERVICE, systemd_dir: Path = Path("/run/systemd/system")) -> str:
    """``systemctl is-active UNIT`` (active, inactive, failed, activating...), or ``no systemd`` where
    the machine was not booted with it (``sd_booted()``'s test) or has no systemctl."""
    systemctl = shutil.which("systemctl")
    if systemctl is None or not systemd_dir.is_dir():
        return NO_SYSTEMD
    out = subprocess.run([systemctl, "is-active", unit], capture_output=True, text=True, timeout=10)
    return out.stdout.strip() or out.stderr.strip() or f"unknown (systemctl exit {out.returncode})"


class _Stats(Protocol):
    frames: int
    dropped: int
    fallbacks: int
    per_split: Mapping[str, int]


class LastRun:
    """The summary ``split-device run`` leaves in ``<bundle>/last-run.json`` when it ends, well or not.

    Written whole (a temporary file renamed into place): ``status`` never reads half a file. A
    bundle directory that cannot be written is a warning, never the run's failure.
    """

    def __init__(self, bundle_dir: str | Path, clock=time.time) -> None:
        self.path = Path(bundle_dir) / LAST_RUN
        self.clock = clock
        self.record: dict[str, Any] = {"started": clock(), "bundle_id": None, "release": None, "frames": 0,
                                       "dropped": 0, "fallbacks": 0, "by_split": {}, "switches": None, "error": None}
        self._stats: _Stats | None = None
        self._policy: Any = None

    def watch(self, bundle: Bundle, stats: _Stats, policy: Any = None) -> None:
        """Read ``stats`` (and the policy's ``switches``, where it counts them) when the run ends."""
        self.record.update(bundle_id=bundle.id, release=bundle.manifest.bundle_id)
        self.path = bundle.root / LAST_RUN  # the release that ran, even if current was switched meanwhile
        self._stats, self._policy = stats, policy

    def failed(self, exc: BaseException) -> None:
        self.record["error"] = str(exc) or type(exc).__name__

    def write(self) -> Path | None:
        ended = self.clock()
        record = dict(self.record, ended=ended, seconds=round(ended - self.record["started"], 3))
        if self._stats is not None:
            stats = self._stats
            record.update(frames=stats.frames, dropped=stats.dropped, fallbacks=stats.fallbacks,
                          by_split=dict(stats.per_split))
        switches = getattr(self._policy, "switches", None)
        record["switches"] = switches if isinstance(switches, int) else None
        if not (self.path.parent / MANIFEST_NAME).is_file():
            return None  # no bundle there: nothing to write beside
        try:
            write_atomically(self.path, json.dumps(record, indent=2))
        except OSError as exc:
            print(f"warning: could not write {self.path}: {exc}", flush=True)
            return None
        return self.path


def _last_run(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(read_text_bounded(path, MAX_LAST_RUN_BYTES))  # a FIFO or /dev/zero is refused
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as exc:  # unreadable, not UTF-8, not JSON
        return {"error": f"{path} unreadable: {exc}"}
    return data if isinstance(data, dict) else {"error": f"{path}: not a JSON object"}


def board_status(root: str | Path, systemd_dir: Path = Path("/run/systemd/system")) -> dict[str, Any]:
    """The release in use, the one a rollback returns to, the releases kept, the service, the last run."""
    layout = Layout(Path(root))
    current = layout.current_id()
    return {
        "root": str(layout.root),
        "current": current,
        "current_ok": current is not None and (layout.release(current) / MANIFEST_NAME).is_file(),
        "previous": layout.previous_id(),
        "releases": layout.installed(),
        "service": service_state(SERVICE, systemd_dir),
        "last_run": _last_run(layout.current / LAST_RUN) if current is not None else None,
    }


def _when(seconds: Any) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds)) if isinstance(seconds, (int, float)) else "?"


def format_status(status: Mapping[str, Any]) -> str:
    current = status["current"]
    if current is None:
        release = f"none: nothing deployed under {status['root']}"
    else:
        broken = "" if status["current_ok"] else " (BROKEN: its directory or manifest is missing)"
        release = f"{current}{broken} ({status['root']}/current)"
    others = [r for r in status["releases"] if r != current]
    lines = [
        f"release   {release}",
        f"rollback  {status['previous'] or 'none'}; {len(others)} other release(s) kept",
        f"service   {SERVICE}: {status['service']}",
    ]
    run = status["last_run"]
    if run is None:
        lines.append("last run  none recorded")
    elif "started" not in run:
        lines.append(f"last run  {run.get('error')}")
    else:
        by_split = ", ".join(f"{k} {v}" for k, v in (run.get("by_split") or {}).items()) or "none"
        outcome = f"failed: {run['error']}" if run.get("error") else "ended cleanly"
        lines.append(f"last run  {_when(run.get('started'))}, {run.get('seconds', '?')} s: {run.get('frames', 0)} "
                     f"frames, {run.get('dropped', 0)} dropped, {run.get('fallbacks', 0)} host failures answered "
                     f"locally; by split: {by_split}; {outcome}")
    return "\n".join(lines)


def status_exit_code(status: Mapping[str, Any]) -> int:
    """0 when a whole release is current, 1 otherwise (for scripts that wait for a healthy board)."""
    return 0 if status["current_ok"] else 1


def check_root(root: Path) -> None:
    if root.exists() and not root.is_dir():
        raise SplitEdgeError(f"{root}: not a directory; --root names the board's splitedge directory")
