"""Ctrl-C and SIGTERM end ``split-export`` in one line, exit 130 or 143, with no staging left (issue 27, point 9).

Real signals to real processes: ``split-export`` runs a tiny user model whose factory or forward
pass says so on stderr and then waits, so the signal lands at a known point (inside the build's
staging, or while ``points`` loads the model) however busy the machine is. Before, Ctrl-C printed
39 to 90 lines of traceback and SIGTERM during ``build`` left a ``.NAME.partial-PID`` folder.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="split-export build needs the workstation environment")

ROOT = Path(__file__).resolve().parents[2]
#: How long the busiest machine may take to import torch and reach the marked point.
REACH_S = 180

MODEL = '''
import sys, time
from pathlib import Path
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, slow):
        super().__init__()
        self.slow = slow
        self.conv = nn.Conv2d(3, 4, 3)
        self.fc = nn.Linear(4, 10)

    def forward(self, x):
        if self.slow and any(Path.cwd().glob(".bundle.partial-*")):  # the build is in its staging
            print("MARK: exporting", file=sys.stderr, flush=True)
            time.sleep(600)
        return self.fc(self.conv(x).mean((2, 3)))


def slow_forward():
    return Net(True)


def slow_factory():
    print("MARK: loading", file=sys.stderr, flush=True)
    time.sleep(600)
    return Net(False)
'''


class Command:
    """``split-export ARGS`` in a process of its own, its stderr read line by line as it comes."""

    def __init__(self, cwd: Path, *argv: str) -> None:
        self.process = subprocess.Popen([sys.executable, "-m", "exporter.cli", *argv], cwd=cwd, text=True,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                        env={**os.environ, "PYTHONPATH": str(ROOT)})
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for(self, mark: str) -> None:
        """Until a line starting with ``mark`` arrives (bounded): the command is where the test wants it."""
        while True:
            try:
                line = self.lines.get(timeout=REACH_S)
            except queue.Empty:
                self.process.kill()
                pytest.fail(f"no {mark!r} line within {REACH_S} s; stderr so far: {self.seen}")
            if line is None:
                pytest.fail(f"split-export ended (exit {self.process.wait()}) before {mark!r}: {self.seen}")
            self.seen.append(line)
            if line.startswith(mark):
                return

    def after_signal(self, signum: signal.Signals) -> tuple[int, list[str]]:
        """Send ``signum``; the exit status and every stderr line after the mark."""
        before = len(self.seen)
        self.process.send_signal(signum)
        try:
            status = self.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.process.kill()
            pytest.fail(f"split-export did not end within 120 s of {signum.name}")
        self.reader.join(timeout=30)
        while (line := self.lines.get_nowait()) is not None:
            self.seen.append(line)
        return status, self.seen[before:]


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    (tmp_path / "slowmodel.py").write_text(MODEL)
    return tmp_path


@pytest.mark.parametrize("signum, status, said", [(signal.SIGINT, 130, "Ctrl-C (SIGINT)"),
                                                  (signal.SIGTERM, 143, "SIGTERM")])
def test_build_stopped_ends_in_one_line_and_leaves_no_staging(model_dir: Path, signum: signal.Signals, status: int,
                                                              said: str) -> None:
    out = model_dir / "bundle"
    (out / "old").mkdir(parents=True)  # the last good bundle: kept as it is
    build = Command(model_dir, "build", "slowmodel:slow_forward", "--input-shape", "3,16,16", "--splits", "auto",
                    "--out", str(out))
    build.wait_for("MARK: exporting")
    assert [p.name for p in model_dir.glob(".bundle.partial-*")], "the build is not in its staging yet"
    code, after = build.after_signal(signum)
    assert code == status, after
    assert after == [f"split-export: stopped by {said} before it finished; nothing it was writing was kept: "
                     "run it again"], after
    assert sorted(p.name for p in model_dir.iterdir()) == ["bundle", "slowmodel.py"]  # no .bundle.partial-PID
    assert [p.name for p in out.iterdir()] == ["old"]


@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_points_stopped_ends_in_one_line(model_dir: Path, signum: signal.Signals, status: int) -> None:
    points = Command(model_dir, "points", "slowmodel:slow_factory", "--input-shape", "3,16,16")
    points.wait_for("MARK: loading")
    code, after = points.after_signal(signum)
    assert code == status, after
    assert len(after) == 1 and after[0].startswith("split-export: stopped by "), after
