"""A run's events: a split change when the answering split changes, a summary when the clock says so."""

from __future__ import annotations

import json

import pytest

from device_runtime.bundle import LOCAL
from device_runtime.stream._reason import FALLBACK, TABLE, Reason
from device_runtime.stream._results import DROP_QUEUE_FULL, FrameResult
from device_runtime.stream._summary import LatencyHistogram, RunEvents
from tests.calibration.test_timing import ManualClock

CUT = "features_14_conv_2"


def _answered(index: int, split: str, total_ms: float, reason: Reason = Reason(TABLE), **fields) -> FrameResult:
    return FrameResult(index=index, name=f"f{index}", label="cat", probability=0.9, split=split, total_ms=total_ms,
                       reason=reason, **fields)


def _dropped(index: int) -> FrameResult:
    return FrameResult(index=index, name=f"f{index}", label=None, probability=None, split="", dropped=True,
                       drop_reason=DROP_QUEUE_FULL)


def test_changes_and_summaries_follow_the_results_and_the_clock() -> None:
    clock = ManualClock(0.0)
    events = RunEvents(every_s=10.0, clock=clock)
    made = []
    for i in range(30):  # a frame every 0.5 s: 15 s of frames
        clock.now += 0.5
        if i == 7:
            result = _dropped(i)
        elif i < 12:
            result = _answered(i, CUT, float(10 + i), host="127.0.0.1:7767", where="remote")
        else:
            reason = Reason(FALLBACK, wanted=CUT, error="host gone")
            result = _answered(i, LOCAL, 50.0, reason, error=f"{CUT}: host gone", attempted=CUT)
        made.append(events.frame(result))
    kinds = [e["event"] for batch in made for e in batch]
    assert kinds == ["split_change", "split_change", "summary"]  # the first split, the fallback; one summary at 10 s
    first, fallback = made[0][0], made[12][0]
    assert (first["from"], first["to"], first["reason"]) == (None, CUT, {"kind": TABLE})
    assert (fallback["from"], fallback["to"], fallback["reason"]["kind"], fallback["index"]) == (CUT, LOCAL, FALLBACK, 12)
    (summary,) = made[19]  # the 20th frame is 10 s in
    assert summary["seconds"] == 10.0 and summary["answered"] == 19 and summary["dropped"] == 1
    assert summary["fps"] == 1.9 and summary["fallbacks"] == 8
    assert summary["splits"] == {CUT: round(11 / 19, 4), LOCAL: round(8 / 19, 4)}
    assert summary["hosts"] == ["127.0.0.1:7767", "local"]
    # nearest rank over 10..21 (less the dropped 7th) and eight 50s: p50 the 10th of 19, p95 the 19th
    assert (summary["p50_ms"], summary["p95_ms"]) == (20.0, 50.0)
    clock.now += 1.0
    final = events.final()
    assert final["event"] == "final" and final["frames"] == 30 and final["answered"] == 29 and final["dropped"] == 1
    assert final["split_changes"] == 1 and final["by_split"] == {LOCAL: 18, CUT: 11}
    assert final["seconds"] == 16.0 and final["p95_ms"] == pytest.approx(50.0, rel=0.03)
    json.dumps([e for batch in made for e in batch] + [final])  # every event is JSON


def test_the_runs_percentiles_stay_within_a_bin() -> None:
    histogram = LatencyHistogram()
    for ms in range(1, 1001):
        histogram.add(float(ms))
    assert histogram.percentile(50) == pytest.approx(500.0, rel=0.03)
    assert histogram.percentile(95) == pytest.approx(950.0, rel=0.03)
    assert LatencyHistogram().percentile(50) is None


def test_a_summary_period_must_be_positive() -> None:
    with pytest.raises(ValueError, match="expected a number of seconds > 0"):
        RunEvents(every_s=0.0)
