"""``--pace`` reads an untrusted trace (issue 45): a recorded time of 1e9 ms held the board's engine
for days, deaf to SIGTERM, and 1e300 overflowed ``time.sleep``. No stage is held past
:data:`MAX_HOLD_MS`; a time past it, or no time at all, is left out and counted; a stop ends a hold."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from device_runtime.bundle import LOCAL
from device_runtime.stream import BoardPace, read_pace
from device_runtime.stream import _pace as pace_module
from device_runtime.stream._pace import MAX_HOLD_MS, PREPROCESS
from splitedge.errors import SplitEdgeError
from tests.device_runtime.stream.test_pace import record, write
from tests.signals import sigterm_ends_it


@pytest.mark.parametrize("bad", [1e9, 1e300, math.inf, math.nan, -5.0, "10", None])
def test_a_recorded_time_past_the_bound_is_left_out_and_counted(bad: object) -> None:
    pace = BoardPace.from_records([record(0, LOCAL, 100.0), record(1, LOCAL, bad, preprocess_ms=bad)])
    assert pace.target_ms(1, LOCAL, 1) == 100.0  # the split's median, of the times that are times
    assert pace.target_ms(1, PREPROCESS, 1) == 4.0
    assert pace.left_out == (0 if bad is None else 2)
    assert all(0 <= ms <= MAX_HOLD_MS for ms in pace.medians.values())
    if pace.left_out:
        assert f"{pace.left_out} recorded stage times left out" in pace.summary()


def test_a_trace_of_1e9_ms_heads_is_read_without_holding_to_them(tmp_path: Path) -> None:
    path = write(tmp_path / "trial.jsonl", [record(0, LOCAL, 1e9), record(1, LOCAL, 80.0)])
    raw = path.read_text().replace('"head_ms": 80.0', '"head_ms": 1e300')
    path.write_text(raw + json.dumps(record(2, LOCAL, 60.0, reason="not an object")) + "\n")
    pace = read_pace(path)
    assert pace.target_ms(0, LOCAL, 1) == 60.0 and pace.left_out == 2


def test_no_hold_outlasts_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pace_module, "MAX_HOLD_MS", 50.0)
    pace = BoardPace.from_records([record(0, LOCAL, 10.0)])
    started = time.monotonic()
    out, ms = pace.hold(1e300, lambda: ("x", 1.0))  # was: OverflowError
    assert out == "x" and 50.0 <= ms < 2_000.0 and time.monotonic() - started < 2.0


def test_a_stop_ends_a_hold_at_once() -> None:
    pace = BoardPace.from_records([record(0, LOCAL, 10.0)])
    threading.Timer(0.2, pace.stop).start()
    started = time.monotonic()
    pace.hold(MAX_HOLD_MS, lambda: ("x", 0.0))
    assert time.monotonic() - started < 2.0
    assert pace.hold(MAX_HOLD_MS, lambda: ("y", 0.0)) == ("y", 0.0)  # stopped: nothing more is held


def test_a_line_past_the_cap_is_one_error_naming_it(tmp_path: Path) -> None:
    path = write(tmp_path / "trial.jsonl", [record(0, LOCAL, 80.0)])
    path.write_text(path.read_text() + json.dumps({"type": "note", "x": "y" * (2 << 20)}) + "\n"
                    + json.dumps(record(1, LOCAL, 60.0)) + "\n")
    with pytest.raises(SplitEdgeError, match=r"trial.jsonl:3: a line longer than"):
        read_pace(path)


def test_a_cut_short_last_line_is_left_out(tmp_path: Path) -> None:
    path = write(tmp_path / "trial.jsonl", [record(0, LOCAL, 80.0)])
    path.write_text(path.read_text() + '{"type": "frame", "index": \n\n')
    assert read_pace(path).target_ms(0, LOCAL, 1) == 80.0


def test_sigterm_ends_a_run_paced_to_1e9_ms_within_5_s(mobilenet_bundle: Path, tmp_path: Path) -> None:
    """Was: the engine held a frame for 11 days and the run ignored SIGTERM for over 45 s."""
    trial = write(tmp_path / "trial.jsonl", [record(i, LOCAL, 1e9) for i in range(4)] + [record(4, LOCAL, 20.0)])
    running = subprocess.Popen(
        [sys.executable, "-m", "device_runtime.cli", "run", str(mobilenet_bundle), "--camera", "synthetic", "--frames",
         "100000", "--split", "local", "--threads", "1", "--pace", str(trial)],
        cwd=Path(__file__).resolve().parents[3], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = sigterm_ends_it(running, lambda: time.sleep(6.0))  # started, and into its frames
    assert "Traceback" not in err and "4 recorded stage times left out" in out, (out, err)
