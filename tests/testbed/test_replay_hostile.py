"""``python -m testbed replay`` reads an untrusted trace (issue 45): a bad record is one line naming
its line and field, before anything is set up; no schedule outlasts the bounds a trace can hold."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from splitedge.errors import SplitEdgeError
from testbed import __main__ as testbed_main
from testbed import unavailable_reason
from testbed._replay import MAX_LINE_BYTES, MAX_T_S, read_trace, recorded_link, replay_source
from tests.conftest import TEST_SPLITS
from tests.signals import sigterm_ends_it

ROOT = Path(__file__).resolve().parents[2]
REASON = unavailable_reason()
needs_namespaces = pytest.mark.skipif(REASON is not None, reason=f"link emulation unavailable: {REASON}")

RUN = {"type": "run", "schema": "splitedge.trace/5", "started_unix": 1.7e9, "bundle_id": "b", "policy": "auto",
       "batch": 1, "source": "synthetic:10"}


def frame(i: int, t: float, rate_bps: Any = 8e6, **extra: Any) -> dict[str, Any]:
    return {"type": "frame", "t": t, "index": i, "split": "cut", "batch": 1, "rate_bps": rate_bps, "total_ms": 30.0,
            "dropped": False, **extra}


def frames() -> list[dict[str, Any]]:
    return [frame(i, 0.1 * i) for i in range(5)]


def write(path: Path, records: list[dict[str, Any]], raw_last: str | None = None) -> Path:
    text = "".join(json.dumps(r) + "\n" for r in [RUN, *records])
    path.write_text(text + (raw_last + "\n" if raw_last else ""), encoding="utf-8")
    return path


def replay_command(path: Path, tmp_path: Path) -> tuple[int, str]:
    """``python -m testbed replay`` in this process: its status and its stderr."""
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        code = testbed_main.main(["replay", str(path), "--bundle", str(tmp_path / "no-bundle"), "--out",
                                  str(tmp_path / "out")])
    return code, err.getvalue()


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


def test_a_last_frame_at_t_1e12_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "run.jsonl", frames() + [frame(5, 1e12)])  # was: a schedule of 31,700 years
    code, err = replay_command(path, tmp_path)
    assert code == 2 and "run.jsonl:7: a frame record's t must be" in one_line(err)
    assert not (tmp_path / "out").exists()  # refused before anything was set up


@pytest.mark.parametrize("field, value", [("t", None), ("t", "1.5"), ("t", True), ("index", None), ("index", -1),
                                          ("index", 1.5), ("index", 10**12), ("rate_bps", -8e6),
                                          ("rate_bps", "fast"), ("dropped", "no")])
def test_a_frame_with_a_bad_field_is_one_line(tmp_path: Path, field: str, value: Any) -> None:
    bad = frame(2, 0.2)
    if value is None:
        del bad[field]
    else:
        bad[field] = value
    path = write(tmp_path / "run.jsonl", [frame(0, 0.0), frame(1, 0.1), bad])
    code, err = replay_command(path, tmp_path)
    assert code == 2 and f"run.jsonl:4: a frame record's {field} must be" in one_line(err)


@pytest.mark.parametrize("rate", ["NaN", "-1e6", "Infinity", "0"])
def test_a_link_rate_that_is_no_rate_is_one_line(tmp_path: Path, rate: str) -> None:
    path = write(tmp_path / "run.jsonl", frames(),
                 raw_last=f'{{"type": "link_rate", "t": 0.0, "rate_bps": {rate}, "set_by": "x"}}')
    path.write_text(path.read_text() + json.dumps(frame(9, 0.9)) + "\n")  # not the last line: not cut short
    code, err = replay_command(path, tmp_path)
    assert code == 2 and "run.jsonl:7: a link_rate record's rate_bps must be" in one_line(err)


def test_a_nan_rate_estimate_is_one_line(tmp_path: Path) -> None:
    lines = [json.dumps(r) for r in [RUN, *frames()]]
    lines[3] = lines[3].replace('"rate_bps": 8000000.0', '"rate_bps": NaN')
    path = tmp_path / "run.jsonl"
    path.write_text("\n".join(lines) + "\n")
    code, err = replay_command(path, tmp_path)
    assert code == 2 and "run.jsonl:4: a frame record's rate_bps" in one_line(err)


def test_a_line_past_the_cap_is_one_line(tmp_path: Path) -> None:
    path = write(tmp_path / "run.jsonl", frames())
    path.write_text(path.read_text() + json.dumps({"type": "note", "x": "y" * (2 * MAX_LINE_BYTES)}) + "\n"
                    + json.dumps(frame(9, 0.9)) + "\n")
    code, err = replay_command(path, tmp_path)
    assert code == 2 and "run.jsonl:7: a line longer than" in one_line(err)


def test_the_schedule_of_a_trace_in_bounds_is_bounded(tmp_path: Path) -> None:
    run, found, rates = read_trace(write(tmp_path / "run.jsonl", frames() + [frame(5, MAX_T_S)]))
    schedule = recorded_link(found, rates).schedule
    assert sum(s.duration_s for s in schedule.steps) <= MAX_T_S + 1.0


def test_a_cut_short_last_line_is_left_out(tmp_path: Path) -> None:
    _, found, _ = read_trace(write(tmp_path / "run.jsonl", frames(), raw_last='{"type": "frame", "t": '))
    assert len(found) == 5


@needs_namespaces
def test_sigterm_ends_a_long_replay_within_5_s(tmp_path: Path, mobilenet_bundle: Path, photos_dir: Path) -> None:
    """A trace in bounds may still hold a link for hours (its last record at t = 3,000 s): SIGTERM
    unwinds the replay (board, host, link) and ends it in one line within 5 s."""
    records = [frame(i, 0.1 * i, split=TEST_SPLITS[-1]) for i in range(4)] + [frame(4, 3_000.0, split=TEST_SPLITS[-1])]
    records += [{"type": "link_rate", "t": t, "rate_bps": rate, "set_by": "x"} for t, rate in
                ((0.0, 2e7), (1.0, 1e7), (3_000.0, 2e7))]
    trace = write(tmp_path / "long.jsonl", records)
    source = json.dumps({"source": str(photos_dir)})[1:-1]
    trace.write_text(trace.read_text().replace('"source": "synthetic:10"', source))
    out = tmp_path / "out"
    replaying = subprocess.Popen(
        [sys.executable, "-m", "testbed", "replay", str(trace), "--bundle", str(mobilenet_bundle), "--policy",
         TEST_SPLITS[-1], "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def driving() -> None:
        deadline = time.monotonic() + 120
        while not (out / "replay.jsonl").is_file() and replaying.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # driving the schedule now

    _, err = sigterm_ends_it(replaying, driving)
    assert replaying.returncode == 143 and "stopped by SIGTERM" in one_line(err)


@pytest.mark.parametrize("source", ["/dev/zero", 7, {"a": 1}, None])
def test_a_source_that_is_no_file_or_folder_is_not_replayed_from(source: Any) -> None:
    with pytest.raises(SplitEdgeError, match="give --source"):  # was: /dev/zero handed to the board's camera
        replay_source({**RUN, "source": source}, None)


def test_a_fifo_source_is_not_replayed_from(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "clip.mp4")
    with pytest.raises(SplitEdgeError, match="is not here as a file or folder"):
        replay_source({**RUN, "source": str(tmp_path / "clip.mp4")}, None)
