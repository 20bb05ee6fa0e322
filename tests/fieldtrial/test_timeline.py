"""The report's timeline: dropped frames by reason, the link's real rate beside the estimate, and
preprocessing as a stage of its own, on traces written by the real TraceWriter and the testbed's hook."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from calibration import LatencyModel
from device_runtime.bundle import LOCAL
from device_runtime.stream import DROP_QUEUE_FULL, FrameResult
from device_runtime.stream.trace import LINK_RATE, TRACE_SCHEMA, TraceWriter, append_link_rate
from fieldtrial._report import MODEL_PLOT, NOT_CALIBRATED, PLOTS, SUMMARY_FILE, format_summary, write_report
from fieldtrial._timeline import NOT_RECORDED
from fieldtrial._trace import TRACE_SCHEMA_2, load_trace, read_trace
from splitedge.errors import SplitEdgeError
from testbed import RateSchedule, trace_steps
from testbed._schedule import SET_BY
from tests.fieldtrial.test_report import BUNDLE, assert_png, frame_record, run_record, tiny_calibration, write_jsonl

RUN = {"bundle_id": BUNDLE, "policy": "auto", "batch": 1, "calibration": None, "source": "synthetic:10"}
STEP_S = 4.0  # the link steps from 20 to 3 Mbit/s here
BUSY = "board_busy"  # a reason this version has no words for: shown as written


def frame(i: int, start: float) -> FrameResult:
    """Frame ``i`` of a 10 fps camera: every third dropped (queue full; frames 10 and 40: board busy);
    the cut runs before the step with an estimate 5 % over the real rate, local after it, 10 % over."""
    captured = start + 0.1 * i
    if i % 3 == 1 or i in (10, 40):
        reason = BUSY if i in (10, 40) else DROP_QUEUE_FULL
        return FrameResult(index=i, name=f"f{i}", label=None, probability=None, split="", captured=captured,
                           total_ms=5.0, dropped=True, drop_reason=reason)
    before = 0.1 * i < STEP_S
    split, rate = ("cut", 21e6) if before else (LOCAL, 3.3e6)
    head, transfer, tail = (21.0, 2.0, 5.0) if before else (107.0, 0.0, 0.0)
    return FrameResult(
        index=i, name=f"f{i}", label="tram", probability=0.8, split=split, captured=captured, rate_bps=rate,
        preprocess_ms=124.0, head_ms=head, transfer_ms=transfer, tail_ms=tail, queue_ms=85.0,
        total_ms=124.0 + head + transfer + tail + 85.0, where="remote" if before else "local",
    )


def write_run(path: Path, frames: int = 60) -> Path:
    """A testbed run as the real writer writes it: the schedule's two rates and the camera's frames."""
    with TraceWriter(path, RUN) as writer:
        start = time.monotonic()
        writer.link_rate(20e6, SET_BY, applied=start)
        writer.link_rate(20e6, SET_BY, applied=start + 2.0)  # the same rate again: not a step
        writer.link_rate(3e6, SET_BY, applied=start + STEP_S)
        for i in range(frames):
            writer.frame(frame(i, start))
    return path


def test_drops_are_counted_by_reason_and_the_real_rate_read_back(tmp_path: Path) -> None:
    summary = write_report(write_run(tmp_path / "run.jsonl"), tmp_path / "out")
    assert summary["dropped"] == 20 and summary["drops_by_reason"] == {DROP_QUEUE_FULL: 18, BUSY: 2}
    real = summary["link_rate"]["real"]
    assert [(s["rate_mbit"], s["set_by"]) for s in real] == [(20.0, SET_BY), (3.0, SET_BY)]
    assert [s["t"] for s in real] == pytest.approx([0.0, STEP_S], abs=1e-3)
    # 21 / 20 before the step, 3.3 / 3 after it: 24 and 16 answered frames.
    estimate = summary["link_rate"]["estimate_over_real"]
    assert estimate["frames"] == 40
    assert (estimate["p5"], estimate["p50"], estimate["p95"]) == pytest.approx((1.05, 1.05, 1.10))
    assert json.loads((tmp_path / "out" / SUMMARY_FILE).read_text(encoding="utf-8")) == summary
    for name in PLOTS:
        assert_png(tmp_path / "out" / name)
    text = format_summary(summary)
    assert "dropped, by reason: 18 queue full (a newer frame took its place), 2 board busy" in text
    assert "link's real rate (testbed schedule): 20 → 3 Mbit/s" in text and "p50 1.05" in text


def test_preprocessing_is_a_stage_the_calibration_may_lack(tmp_path: Path) -> None:
    summary = write_report(write_run(tmp_path / "run.jsonl"), tmp_path / "out", calibration=tiny_calibration())
    local = summary["predicted_vs_measured"][LOCAL]
    assert local["stages"]["preprocess"] == {"measured_ms": 124.0, "predicted_ms": None, "model": NOT_CALIBRATED}
    assert local["unmodelled_stages"] == ["preprocess"]
    # The model's 100 ms head against the measured 107: preprocessing is left out of the ratio ...
    assert local["predicted_ms"] == 100.0 and local["stages_ms"] == 107.0 and local["ratio"] == pytest.approx(1.07)
    # ... and in the end to end, capture to answer: preprocessing, head and the board's queue.
    assert local["end_to_end_ms"] == pytest.approx(124.0 + 107.0 + 85.0)
    assert_png(tmp_path / "out" / MODEL_PLOT)
    assert "the calibration has no preprocessing time" in format_summary(summary)


class PreprocessingModel(LatencyModel):
    """A latency model with a preprocessing stage, as a calibration that times it will have."""

    def terms_ms(self, split: str, batch: int, rate_bps: float) -> dict[str, float]:
        return {"preprocess": 120.0 * batch, **super().terms_ms(split, batch, rate_bps)}


def test_a_calibrated_preprocessing_stage_is_compared(tmp_path: Path) -> None:
    calibration = tiny_calibration()
    calibration = replace(calibration, model=PreprocessingModel(calibration.model.splits, calibration.model.rtt_ms))
    summary = write_report(write_run(tmp_path / "run.jsonl"), tmp_path / "out", calibration=calibration)
    local = summary["predicted_vs_measured"][LOCAL]
    assert local["stages"]["preprocess"] == {"measured_ms": 124.0, "predicted_ms": 120.0}
    assert local["unmodelled_stages"] == [] and local["ratio"] == pytest.approx((124.0 + 107.0) / 220.0)
    assert_png(tmp_path / "out" / MODEL_PLOT)


def test_an_older_trace_has_no_reasons_and_no_real_rate(tmp_path: Path) -> None:
    trace = write_jsonl(tmp_path / "old.jsonl", [{**run_record(), "schema": TRACE_SCHEMA_2}] + [
        frame_record(i, 0.1 * i, "cut", 40.0, 8e5, i % 2 == 1, None) for i in range(6)
    ])
    summary = write_report(trace, tmp_path / "out")
    assert summary["drops_by_reason"] == {NOT_RECORDED: 3}
    assert summary["link_rate"] == {"real": [], "estimate_over_real": None}
    assert "reason not recorded" in format_summary(summary) and "link's real rate" not in format_summary(summary)
    for name in PLOTS:
        assert_png(tmp_path / "out" / name)


class RecordedLink:
    """A stand-in link for :meth:`RateSchedule.drive`: it only records the rates set."""

    def __init__(self) -> None:
        self.rates: list[float] = []

    def set_rate(self, rate_mbit: float) -> None:
        self.rates.append(rate_mbit)


def test_a_schedule_driven_beside_a_run_round_trips_through_its_trace(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    link = RecordedLink()
    with TraceWriter(path, RUN) as writer:
        start = time.monotonic()
        writer.frame(frame(0, start))
        asyncio.run(RateSchedule.parse("20:0.01,3:0.01").drive(link, trace_steps(path)))  # type: ignore[arg-type]
        writer.frame(frame(2, start))  # after the testbed's lines: appended, not over them
    trace = load_trace(path)
    assert trace.run["schema"] == TRACE_SCHEMA and [f["index"] for f in trace.frames] == [0, 2]
    assert link.rates == [20.0, 3.0]
    assert [(r["type"], r["rate_bps"], r["set_by"]) for r in trace.link_rates] == [
        (LINK_RATE, 20e6, SET_BY), (LINK_RATE, 3e6, SET_BY),
    ]
    assert 0.0 <= trace.link_rates[0]["t"] <= trace.link_rates[1]["t"]
    assert read_trace(path) == (trace.run, trace.frames)  # the frames-only reader is unchanged
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert [r["type"] for r in records] == ["run", "frame", LINK_RATE, LINK_RATE, "frame"]


def test_a_bad_link_rate_record_is_an_error_naming_its_line(tmp_path: Path) -> None:
    trace = write_jsonl(tmp_path / "bad.jsonl", [run_record(), frame_record(0, 0.0, "cut", 40.0, 8e5, False, None),
                                                 {"type": LINK_RATE, "t": 0.5, "rate_bps": 0}])
    with pytest.raises(SplitEdgeError, match=r"bad.jsonl:3: a link_rate record's rate_bps must be > 0"):
        load_trace(trace)


def test_the_link_rate_needs_a_trace_to_add_to(tmp_path: Path) -> None:
    with pytest.raises(SplitEdgeError, match="cannot add the link's rate to the trace"):
        append_link_rate(tmp_path / "absent.jsonl", 1e6, SET_BY)
