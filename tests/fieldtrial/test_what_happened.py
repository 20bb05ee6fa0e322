"""Issue 43.7, "the report says what happened": a deadline refusal, a host failure and a frame run
locally by choice told apart; split changes counted as the run counts them; each frame against its
floor and oracle; the calibrated ÷ measured time per stage; a hostile trace field refused in one line."""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path
from typing import Any

import pytest

from device_runtime.bundle import LOCAL, OFFLOAD
from device_runtime.stream import FrameResult, Reason, RunEvents
from device_runtime.stream.trace import LINK_RATE, TraceWriter
from device_runtime.stream._reason import DEADLINE, FALLBACK, TABLE
from fieldtrial import _bounds as bounds, commands, _plots as plots
from fieldtrial._page import PAGE
from fieldtrial._report import SUMMARY_FILE, format_summary, summarize, write_report
from fieldtrial._timeline import AFTER_DEADLINE, AFTER_FAILURE, BY_CHOICE, local_cause_label, real_rate_steps
from tests.fieldtrial.test_compare import _saved
from tests.fieldtrial.test_report import frame_record, queued_frames, run_record, tiny_calibration, write_jsonl


def legends(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """The legend labels of every figure the report draws from now on, by file name (read off the
    figure as it is saved, so what a reader sees, not what the code meant to draw)."""
    drawn: dict[str, list[str]] = {}
    save = plots._save

    def recording(plt: Any, fig: Any, path: str | Path) -> None:
        drawn[Path(path).name] = [text.get_text() for ax in fig.axes if ax.get_legend()
                                  for text in ax.get_legend().get_texts()]
        save(plt, fig, path)

    monkeypatch.setattr(plots, "_save", recording)
    return drawn


def three_local_frames() -> list[dict]:
    """A cut, then three frames answered on the board: by the table's choice, after the host refused
    the cut for its deadline, after the host failed (as the pipeline records them)."""
    frames = [frame_record(0, 0.0, "cut", 40.0, 8e5, False, None), frame_record(1, 0.5, LOCAL, 100.0, 8e4, False, None),
              frame_record(2, 1.0, LOCAL, 150.0, 8e5, False, "cut: deadline_exceeded: 30 ms queued"),
              frame_record(3, 1.5, LOCAL, 200.0, 8e5, False, "cut: host went away")]
    for f, kind in zip(frames, (TABLE, TABLE, DEADLINE, FALLBACK)):
        f["reason"] = {"kind": kind}
    return frames


def test_a_deadline_refusal_a_host_failure_and_a_choice_are_told_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    drawn = legends(monkeypatch)
    trace = write_jsonl(tmp_path / "run.jsonl", [run_record()] + three_local_frames())
    assert commands.main(["report", str(trace), "--out", str(tmp_path / "out")]) == 0
    summary = json.loads((tmp_path / "out" / SUMMARY_FILE).read_text(encoding="utf-8"))
    assert {cause: (c["frames"], c["p50_ms"]) for cause, c in summary["local_causes"].items()} == {
        BY_CHOICE: (1, 100.0), AFTER_DEADLINE: (1, 150.0), AFTER_FAILURE: (1, 200.0)}
    assert (summary["deadline_refusals"], summary["fallbacks"]) == (1, 1)  # no longer lumped
    labels = [local_cause_label(cause) for cause in (BY_CHOICE, AFTER_DEADLINE, AFTER_FAILURE)]
    assert len(set(labels)) == 3
    for label in labels:
        assert label in drawn["latency_over_time.png"]  # a marker of its own in the latency panel
        assert f"{label} (1)" in drawn["latency_cdf.png"]  # a CDF curve of its own
        assert label in (tmp_path / "out" / PAGE).read_text(encoding="utf-8")
    assert "host failed: answered here" not in drawn["latency_over_time.png"]
    assert "1 local after a deadline refusal" in format_summary(summary)


def answered_out_of_capture_order() -> list[FrameResult]:
    """Answered A, B, A, B while captured A, A, B, B: frame 2 (captured before 1) waited on its host."""
    start = time.monotonic()
    order = [(0, 0.0, "a"), (2, 0.2, "b"), (1, 0.1, "a"), (3, 0.3, "b")]
    return [FrameResult(index=i, name=f"f{i}", label="cat", probability=0.9, split=split, captured=start + t,
                        total_ms=20.0, preprocess_ms=1.0, head_ms=5.0, reason=Reason(TABLE))
            for i, t, split in order]


def test_split_changes_are_counted_as_the_run_counts_them(tmp_path: Path) -> None:
    results = answered_out_of_capture_order()
    events = RunEvents()
    for result in results:
        events.frame(result)
    path = tmp_path / "run.jsonl"
    with TraceWriter(path, {"bundle_id": "tiny-0123456789ab", "policy": "auto", "batch": 1, "source": "x"}) as writer:
        for result in results:
            writer.frame(result)
    assert commands.main(["report", str(path), "--out", str(tmp_path / "out")]) == 0
    summary = json.loads((tmp_path / "out" / SUMMARY_FILE).read_text(encoding="utf-8"))
    assert summary["split_changes"] == events.final()["split_changes"] == 3  # a -> b -> a -> b
    page = (tmp_path / "out" / PAGE).read_text(encoding="utf-8")
    header = re.findall(r"<th>(.*?)</th>", page.split("</table>")[0])
    cells = re.findall(r"<td>(.*?)</td>", page.split("</table>")[0])
    assert cells[header.index("split changes")] == "3"


# The floor and oracle by hand. The link: no real rate before 0.4 s, 8e5 bit/s from 0.4 s, 8e6 from 1 s.
# The tiny model (rtt 1 ms, no preprocessing timed) predicts local 100; cut 20 + 8e6/r + 1 + 5;
# offload 8e7/r + 1 + 10. Each frame: preprocessing 2 ms, batch 1.
STEPS = [{"type": LINK_RATE, "t": 0.4, "rate_bps": 8e5, "set_by": "test"},
         {"type": LINK_RATE, "t": 1.0, "rate_bps": 8e6, "set_by": "test"}]


def bounded_frames() -> list[dict]:
    def frame(i: int, t: float, split: str, total: float, estimate: float | None, head: float, size: int,
              tail: float) -> dict:
        record = frame_record(i, t, split, total, estimate, False, None)
        record.update(head_ms=head, bytes=size, tail_ms=tail)
        return record

    return [
        # Before the first real step: the board's estimate, 4e5. Floor 2 + 21 + 8e6/4e5 (20) + 5 = 48;
        # oracle at 4e5: local 100, cut 20 + 20 + 1 + 5 = 46, offload 200 + 1 + 10 = 211 -> 46.
        frame(0, 0.1, "cut", 60.0, 4e5, 21.0, 1000, 5.0),
        # No rate at all, and bytes crossed: no floor, no oracle.
        frame(1, 0.2, "cut", 50.0, None, 21.0, 1000, 5.0),
        # Real 8e5 (the estimate, 7e5, is not taken): floor 2 + 21 + 10 + 5 = 38; oracle cut 36.
        frame(2, 0.5, "cut", 40.0, 7e5, 21.0, 1000, 5.0),
        frame_record(3, 1.0, "", 5.0, None, True, None),  # dropped: no latency, no bounds
        # Real 8e6: floor 2 + 0 + 8e7/8e6 (10) + 10 = 22; oracle offload 10 + 1 + 10 = 21 (cut 27).
        frame(4, 1.5, OFFLOAD, 30.0, 6e6, 0.0, 10000, 10.0),
        # Local by choice, nothing crossed: floor 2 + 100 = 102; oracle at the real 8e6: offload 21.
        frame(5, 2.0, LOCAL, 110.0, None, 100.0, 0, 0.0),
    ]


def test_each_frame_against_its_floor_and_oracle_by_hand() -> None:
    frames = bounded_frames()
    answered = [f for f in frames if not f["dropped"]]
    per_frame = bounds.frame_bounds(answered, real_rate_steps(STEPS), tiny_calibration().model)
    assert [b.floor_ms for b in per_frame] == pytest.approx([48.0, None, 38.0, 22.0, 102.0])
    assert [b.floor_rate for b in per_frame] == [bounds.ESTIMATE, None, bounds.REAL, bounds.REAL, None]
    assert [b.oracle_ms for b in per_frame] == pytest.approx([46.0, None, 36.0, 21.0, 21.0])
    assert [b.oracle_split for b in per_frame] == ["cut", None, "cut", OFFLOAD, OFFLOAD]

    s = summarize(run_record(), frames, tiny_calibration(), link_rates=STEPS)
    latency, oracles = [60.0, 40.0, 30.0, 110.0], [46.0, 36.0, 21.0, 21.0]
    assert s["floor"] == {
        "frames": 4, "left_out": 1, "rate": {"real": 2, "estimate": 1}, "p50_ms": pytest.approx((38.0 + 48.0) / 2),
        # Ratios 1.25, 1.053, 1.364, 1.078: the median is the mean of the middle two.
        "latency_over_floor": {"median_of_ratios": pytest.approx((110.0 / 102.0 + 60.0 / 48.0) / 2),
                               "ratio_of_medians": pytest.approx(((40.0 + 60.0) / 2) / ((38.0 + 48.0) / 2))},
    }
    assert s["oracle"] == {
        "frames": 4, "left_out": 1, "rate": {"real": 3, "estimate": 1}, "p50_ms": pytest.approx((21.0 + 36.0) / 2),
        "splits": {"cut": 2, OFFLOAD: 2},
        "latency_over_oracle": {"mean_of_ratios": pytest.approx(sum(a / o for a, o in zip(latency, oracles)) / 4)},
    }
    assert summarize(run_record(), frames, None, link_rates=STEPS)["oracle"] is None  # no calibration, no oracle


def test_the_floor_and_the_oracle_are_drawn_and_say_where_the_estimate_stood_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    drawn = legends(monkeypatch)
    trace = write_jsonl(tmp_path / "run.jsonl", [run_record()] + bounded_frames() + STEPS)
    summary = write_report(trace, tmp_path / "out", calibration=tiny_calibration())
    labels = drawn["latency_over_time.png"]
    assert "floor: the frame's own compute\n(the board's rate estimate on 1 of 4 frames: no real rate there)" in labels
    assert ("oracle: the calibration's fastest option at the link's rate\n"
            "(the board's rate estimate on 1 of 4 frames: no real rate there)") in labels
    text = format_summary(summary)
    assert "latency ÷ floor, median of ratios 1.16, ratio of medians 1.16" in text
    assert "at the board's rate estimate on 1 frames (no real rate recorded there)" in text


def test_calibrated_over_measured_per_stage_in_the_summary_and_on_the_page(tmp_path: Path) -> None:
    comparison = summarize(run_record(), queued_frames(), tiny_calibration())["predicted_vs_measured"]
    # The cut's stages ran 21, 11.5 and 5 ms against 20, 11 and 5 calibrated; local 100 against 100.
    assert comparison["cut"]["calibrated_over_measured"] == pytest.approx(
        {"head": 20.0 / 21.0, "transfer": 11.0 / 11.5, "tail": 1.0})
    assert comparison[LOCAL]["calibrated_over_measured"] == {"head": pytest.approx(1.0), "transfer": None, "tail": None}
    trace = write_jsonl(tmp_path / "run.jsonl", [run_record()] + queued_frames())
    assert commands.main(["report", str(trace), "--out", str(tmp_path / "out"), "--calibration",
                          str(_saved(tmp_path))]) == 0
    page = (tmp_path / "out" / PAGE).read_text(encoding="utf-8")
    assert "calibrated ÷ measured, per stage" in page and "head 0.95, transfer 0.96, tail 1.00" in page


HOSTILE = [
    ("head_ms", math.nan),
    ("total_ms", -5.0),
    ("bytes", 10**30),
    ("tail_ms", "1e400"),  # JSON that Python reads as infinity
    ("transfer_ms", 1e300),
    ("rate_bps", -1.0),
    ("batch", 0),
]


@pytest.mark.parametrize(("field", "value"), HOSTILE, ids=[f for f, _ in HOSTILE])
def test_a_hostile_field_is_one_line_naming_the_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, value: Any,
) -> None:
    frames = three_local_frames()
    frames[1][field] = "__RAW__" if isinstance(value, str) else value  # a string: JSON written as it is
    lines = [json.dumps(r).replace('"__RAW__"', str(value)) for r in [run_record()] + frames]
    trace = tmp_path / "hostile.jsonl"
    trace.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert commands.main(["report", str(trace), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"{trace}:3: a frame record's {field} must be" in err
    assert not (tmp_path / "out" / SUMMARY_FILE).exists()
