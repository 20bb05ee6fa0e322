"""``--pace``: a board held to the stage times a trace recorded, frame by frame, where it is faster,
and left at its own speed (counted) where it is slower.

Holding only ever adds time: every assertion here is a lower bound (a stage held to 150 ms takes at
least 150), or a count of what was held, never how long a busy machine took.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from device_runtime.bundle import LOCAL
from device_runtime.cli import main
from device_runtime.stream import BoardPace, read_pace
from device_runtime.stream._pace import PREPROCESS
from device_runtime.stream._reason import FALLBACK, TABLE
from splitedge.errors import SplitEdgeError

RUN = {"type": "run", "schema": "splitedge.trace/5", "started_unix": 0.0, "policy": "local", "bundle_id": "b"}


def record(index: int, split: str, head_ms: float, batch: int = 1, preprocess_ms: float = 4.0, **extra) -> dict:
    return {"type": "frame", "index": index, "split": split, "batch": batch, "head_ms": head_ms,
            "preprocess_ms": preprocess_ms, "dropped": False, "reason": {"kind": TABLE}, **extra}


def write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in [RUN, *records]))
    return path


def test_each_frame_is_held_to_its_own_time_else_to_its_splits_median() -> None:
    """A frame the trial ran with the same split and batch size takes its own time; another split
    or batch size there, or a frame the trial never had, the median of that split at that size; a
    split the trial never ran, none. Fallbacks (a head and the full model together) and dropped
    frames are no one's time."""
    pace = BoardPace.from_records([
        record(0, LOCAL, 100.0), record(1, LOCAL, 300.0), record(2, LOCAL, 200.0, preprocess_ms=9.0),
        record(3, "cut", 20.0, batch=2), record(4, LOCAL, 5000.0, reason={"kind": FALLBACK}),
        {**record(5, LOCAL, 7000.0), "dropped": True},
    ])
    assert pace.target_ms(1, LOCAL, 1) == 300.0 and pace.target_ms(2, LOCAL, 1) == 200.0
    assert pace.target_ms(3, LOCAL, 1) == 200.0  # the trial ran the cut there: local's median
    assert pace.target_ms(4, LOCAL, 1) == 200.0 and pace.target_ms(99, LOCAL, 1) == 200.0
    assert pace.target_ms(3, "cut", 2) == 20.0 and pace.target_ms(0, "cut", 1) is None
    assert pace.target_ms(2, PREPROCESS, 1) == 9.0 and pace.target_ms(99, PREPROCESS, 1) == 4.0


def test_a_faster_stage_is_held_a_slower_one_is_counted() -> None:
    pace = BoardPace.from_records([record(0, LOCAL, 60.0)], source="trial.jsonl")
    assert pace.hold(60.0, lambda: ("fast", 1.0))[0] == "fast"
    out, ms = pace.hold(30.0, lambda: ("fast", 1.0))
    assert out == "fast" and ms >= 30.0
    assert pace.hold(30.0, lambda: ("slow", 45.0)) == ("slow", 45.0)
    assert pace.hold(None, lambda: ("unpaced", 2.0)) == ("unpaced", 2.0)
    assert (pace.held, pace.slower) == (2, 1)
    assert "trial.jsonl: 2 stage runs; 1 ran slower here than there" in pace.summary()


def test_a_trace_to_pace_to_needs_answered_frames(tmp_path: Path) -> None:
    with pytest.raises(SplitEdgeError, match="no frame with its stage times to pace this board to"):
        read_pace(write(tmp_path / "empty.jsonl", [{**record(0, LOCAL, 50.0), "dropped": True}]))
    (tmp_path / "not.jsonl").write_text('{"type": "frame"}\n')
    with pytest.raises(SplitEdgeError, match="not a splitedge trace"):
        read_pace(tmp_path / "not.jsonl")
    with pytest.raises(SplitEdgeError, match="cannot read the trace"):
        read_pace(tmp_path / "gone.jsonl")
    garbage = [record(0, LOCAL, "fast"), record(1, LOCAL, -5.0), record(2, LOCAL, float("nan")),
               {**record(3, LOCAL, 9.0), "index": "3"}, {**record(4, LOCAL, 9.0), "batch": 0}, "not a record"]
    with pytest.raises(SplitEdgeError, match="no frame with its stage times"):  # none of them is anyone's time
        read_pace(write(tmp_path / "garbage.jsonl", [{**r, "preprocess_ms": None} if isinstance(r, dict) else r
                                                     for r in garbage]))
    cut_short = write(tmp_path / "cut.jsonl", [record(0, LOCAL, 50.0)])
    cut_short.write_text(cut_short.read_text() + '{"type": "fra')  # a run that lost power mid-line
    assert read_pace(cut_short).target_ms(0, LOCAL, 1) == 50.0


def test_a_run_with_pace_takes_the_recorded_boards_time_frame_by_frame(mobilenet_bundle: Path, tmp_path: Path,
                                                                       capsys) -> None:
    """The trial's board took 150 ms for the full model (400 at frame 2) and 30 ms to preprocess a
    frame: a run paced to it answers no frame sooner, its trace says so, and the summary counts
    the stages held."""
    trial = write(tmp_path / "trial.jsonl", [record(i, LOCAL, 400.0 if i == 2 else 150.0, preprocess_ms=30.0)
                                             for i in range(4)])
    trace = tmp_path / "run.jsonl"
    assert main(["run", str(mobilenet_bundle), "--camera", "synthetic", "--frames", "4", "--split", "local",
                 "--drop", "none", "--threads", "1", "--trace", str(trace), "--pace", str(trial)]) == 0
    out = capsys.readouterr().out
    assert f"running at the pace of the board that recorded {trial}" in out
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    assert lines[0]["pace"] == str(trial)
    frames = [line for line in lines if line["type"] == "frame"]
    assert [f["index"] for f in frames] == [0, 1, 2, 3]
    assert all(f["head_ms"] >= (400.0 if f["index"] == 2 else 150.0) for f in frames), frames
    assert all(f["preprocess_ms"] >= 30.0 for f in frames) and all(f["total_ms"] >= 180.0 for f in frames)
    counted = re.search(r"held to the times of .*: (\d+) stage runs(?:; (\d+) ran slower)?", out)
    assert counted is not None and int(counted[1]) + int(counted[2] or 0) == 8  # 4 heads, 4 preprocessings
