"""``split-device report`` holds a bounded amount of a trace, whatever its length (issue 45: 1 M
records cost 4.1 GB, 10 M ran out of 8 GB): every frame is counted, at most a sample of them is
kept, and the summary says which figures come from the sample. Checked by structure (what is kept
after more frames than the caps), never by timing or by measuring memory."""

from __future__ import annotations

import functools
import random
from pathlib import Path

import numpy as np
import pytest

from device_runtime.bundle import LOCAL, OFFLOAD
from fieldtrial import _compare as compare
from fieldtrial import _tally as tallying
from fieldtrial._page import PAGE
from fieldtrial._report import ESTIMATED, format_summary, summarize, write_report
from fieldtrial._tally import OTHER, REORDER_WINDOW, Counted, Sample, Tally
from fieldtrial._trace import MAX_KEPT, MAX_NAME, load_trace
from splitedge import SplitEdgeError
from tests.fieldtrial.make_big_trace import records
from tests.fieldtrial.test_report import known_frames, run_record, write_jsonl

FRAMES = 3_000
KEEP = 200


def _frames(n: int = FRAMES) -> list[dict]:
    return [r for r in records(n) if r["type"] == "frame"]


def test_the_sample_never_holds_more_than_its_cap() -> None:
    sample = Sample(KEEP)
    for i, frame in enumerate(_frames()):
        sample.add(frame)
        assert len(sample) == min(i + 1, KEEP)
    kept = sample.frames()
    assert len(kept) == KEEP and sample.seen == FRAMES
    lines = [f["index"] for f in kept]
    assert lines == sorted(lines)  # in the order added (the trace's)


def test_up_to_its_cap_the_sample_is_every_frame_in_order() -> None:
    frames = _frames(KEEP)
    sample = Sample(KEEP)
    for frame in frames:
        sample.add(frame)
    assert sample.frames() == frames


def test_two_runs_of_one_source_keep_the_same_indices() -> None:
    """Kept by index, not by position: a replay that dropped other frames keeps the same frames of
    those both answered, so a comparison still matches frames by index."""
    frames = _frames()
    other = [f for f in frames if f["index"] % 7]  # another run: every 7th frame never written
    a, b = Sample(KEEP), Sample(KEEP)
    for f in frames:
        a.add(f)
    for f in other:
        b.add(f)
    kept_a = {f["index"] for f in a.frames()}
    kept_b = {f["index"] for f in b.frames()}
    assert {i for i in kept_a if i % 7} <= kept_b


def test_counted_values_never_exceed_their_cap() -> None:
    counted = Counted(always=(LOCAL,), cap=10)
    for i in range(1_000):
        counted.add(f"s{i}")
    counted.add(LOCAL)  # always counted apart
    assert len(counted.counts) == 11 and counted.uncounted == 990
    assert sum(counted.all().values()) == 1_001
    kept = counted.shown()
    assert kept is not None and LOCAL in kept
    grouped = counted.group(kept)
    assert grouped["frames"] + sum(n for v, n in counted.counts.items() if v != OTHER) == 1_001
    assert grouped["values_past_count"] == 1


def test_the_reorder_window_is_bounded_and_the_seconds_exact_within_it() -> None:
    frames = [{"t": i * 0.1, "index": i, "split": ("cut", LOCAL)[i // 3 % 2], "dropped": False, "total_ms": 1.0}
              for i in range(REORDER_WINDOW + 500)]
    shuffled = frames[:]
    rng = random.Random(45)
    for i in range(0, len(shuffled) - 8, 8):  # out of capture order by up to 8 frames, as frames in flight are
        block = shuffled[i:i + 8]
        rng.shuffle(block)
        shuffled[i:i + 8] = block
    tally = Tally()
    for frame in shuffled:
        tally.add(frame)
        assert len(tally._window) <= REORDER_WINDOW
    tally.finish()
    exact = Tally.of(sorted(shuffled, key=lambda f: f["index"]))
    assert tally.out_of_order == 0
    assert tally.seconds == pytest.approx(exact.seconds)
    assert sum(tally.seconds.values()) == pytest.approx(frames[-1]["t"])


def test_a_frame_further_out_of_order_than_the_window_is_counted_not_lost() -> None:
    frames = [{"t": 1.0 + i, "index": i + 1, "split": "cut", "dropped": False, "total_ms": 1.0} for i in range(20)]
    frames.append({"t": 0.0, "index": 0, "split": LOCAL, "dropped": False, "total_ms": 1.0})
    tally = Tally()
    window, tallying.REORDER_WINDOW = tallying.REORDER_WINDOW, 4
    try:
        for frame in frames:
            tally.add(frame)
    finally:
        tallying.REORDER_WINDOW = window
    tally.finish()
    assert tally.out_of_order == 1 and tally.answered == 21 and tally.splits.counts[LOCAL] == 1


def test_a_trace_past_the_cap_is_counted_whole_and_estimated_from_its_sample(tmp_path: Path) -> None:
    path = tmp_path / "long.jsonl"
    all_records = list(records(FRAMES))
    write_jsonl(path, all_records)
    trace = load_trace(path, keep=KEEP)
    assert len(trace.frames) == KEEP and trace.sampled and trace.tally is not None
    summary = write_report(path, tmp_path / "out", trace=trace)
    whole = summarize(all_records[0], [r for r in all_records if r["type"] == "frame"], None, True,
                      [r for r in all_records if r["type"] == "link_rate"])
    for count in ("frames", "answered", "dropped", "drops_by_reason", "duration_s", "fps", "split_changes",
                  "fallbacks", "deadline_refusals", "deadline_misses", "split_reasons"):
        assert summary[count] == whole[count], count
    assert {s: p["frames"] for s, p in summary["per_split"].items()} == {
        s: p["frames"] for s, p in whole["per_split"].items()}
    assert {s: p["seconds"] for s, p in summary["per_split"].items()} == pytest.approx(
        {s: p["seconds"] for s, p in whole["per_split"].items()})
    assert summary["sample"] == {"frames_kept": KEEP, "frames": FRAMES, "cap": MAX_KEPT, "estimated": list(ESTIMATED),
                                 "seconds_out_of_order": 0}
    assert whole["sample"]["estimated"] == []
    assert summary["latency_ms"]["p50"] == pytest.approx(whole["latency_ms"]["p50"], rel=0.1)  # a sample's estimate


def test_below_the_cap_the_report_is_the_summary_of_every_frame(tmp_path: Path) -> None:
    frames = known_frames()
    path = write_jsonl(tmp_path / "run.jsonl", [run_record()] + frames)
    summary = write_report(path, tmp_path / "out")
    assert summary["sample"]["estimated"] == [] and summary["sample"]["frames_kept"] == len(frames)
    assert {k: v for k, v in summary.items() if k != "grouped"} == summarize(run_record(), known_frames(), None)


def test_100_000_distinct_splits_past_the_count_cap_add_up(tmp_path: Path) -> None:
    """Past MAX_COUNTED distinct values, a value first seen is counted as OTHER at once: the per-split
    frames still add up to every answered frame, and the seconds to the answered span."""
    base = known_frames()[1]
    n = 2 * tallying.MAX_COUNTED
    frames = [{**base, "t": i * 0.01, "index": i, "split": OFFLOAD if i % 10 == 0 else f"s{i}"} for i in range(n)]
    trace = load_trace(write_jsonl(tmp_path / "r.jsonl", [run_record()] + frames), keep=KEEP)
    assert trace.tally is not None and len(trace.tally.splits.counts) <= tallying.MAX_SHOWN
    summary = write_report(tmp_path / "r.jsonl", tmp_path / "out", trace=trace)
    assert sum(s["frames"] for s in summary["per_split"].values()) == n
    assert sum(s["seconds"] for s in summary["per_split"].values()) == pytest.approx((n - 1) * 0.01)
    assert summary["per_split"][OFFLOAD]["frames"] == n // 10
    assert summary["grouped"]["split"]["frames"] == summary["per_split"][OTHER]["frames"]


def test_link_rate_records_past_the_cap_are_counted_not_kept(tmp_path: Path) -> None:
    rates = [{"type": "link_rate", "t": i * 0.1, "rate_bps": 1e6 * (1 + i % 2), "set_by": "netem"} for i in range(30)]
    path = write_jsonl(tmp_path / "r.jsonl", [run_record(), *rates, *known_frames()])
    trace = load_trace(path, keep=10)
    assert len(trace.link_rates) == 10 and trace.rates_left_out == 20
    assert write_report(path, tmp_path / "out", trace=trace)["link_rate"]["records_left_out"] == 20


def test_the_sample_keeps_the_shape_of_the_latencies() -> None:
    """The bottom-k sample by index is uniform: its median is the median of every frame within a few %."""
    frames = [f for f in _frames() if not f.get("dropped")]
    sample = Sample(KEEP * 2)
    for f in frames:
        sample.add(f)
    every = np.median([f["total_ms"] for f in frames])
    assert np.median([f["total_ms"] for f in sample.frames()]) == pytest.approx(every, rel=0.05)


def test_a_comparison_of_sampled_runs_says_so_on_its_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    every = list(records(FRAMES))
    a = write_jsonl(tmp_path / "a.jsonl", every)
    b = write_jsonl(tmp_path / "b.jsonl", [r for r in every if r.get("index", 1) % 5])  # a run that lost frames
    monkeypatch.setattr(compare, "load_trace", functools.partial(load_trace, keep=KEEP))
    summary = compare.write_comparison([a, b], tmp_path / "out")
    (against,) = summary["against_first"]
    assert against["estimated_from_sample"] is True
    assert against["answered_in_both"] > KEEP // 2  # kept by index: the frames both kept still match
    assert "estimated from a sample of 200 of its 3,000 frames" in (tmp_path / "out" / PAGE).read_text(encoding="utf-8")
    assert "sample of 200 of its 3,000 frames" in format_summary(summary["runs"][0]["summary"])


def test_the_printed_summary_lists_a_few_steps_of_the_link_rate(tmp_path: Path) -> None:
    rates = [{"type": "link_rate", "t": i * 0.1, "rate_bps": 1e6 * (1 + i % 2), "set_by": "netem"} for i in range(500)]
    summary = write_report(write_jsonl(tmp_path / "r.jsonl", [run_record(), *rates, *known_frames()]), tmp_path / "out")
    (line,) = [line for line in format_summary(summary).splitlines() if "real rate" in line]
    assert "(500 steps in all)" in line and len(line) < 300 and len(summary["link_rate"]["real"]) == 500


def test_a_kept_frame_holds_a_few_fields_whatever_its_line_held(tmp_path: Path) -> None:
    """A line may hold up to MAX_LINE_BYTES: kept whole, 100,000 of them would be 100 GB. A kept frame
    has the fields the report reads, the reason's kind alone and the start of its error."""
    frames = known_frames()
    frames[5].update(reason={"kind": "fallback", "junk": "x" * 100_000}, error="e" * 100_000, junk=["y"] * 10_000)
    rate = {"type": "link_rate", "t": 0.0, "rate_bps": 1e6, "set_by": "netem", "junk": "z" * 100_000}
    trace = load_trace(write_jsonl(tmp_path / "r.jsonl", [run_record(), rate, *frames]))
    kept = trace.frames[5]
    assert kept["reason"] == {"kind": "fallback"} and len(kept["error"]) == MAX_NAME and "junk" not in kept
    assert "name" not in kept and trace.link_rates == [{"type": "link_rate", "t": 0.0, "rate_bps": 1e6,
                                                        "set_by": "netem"}]


@pytest.mark.parametrize("field", ["split", "drop_reason", "reason"])
def test_a_name_past_max_name_is_refused_in_one_line(tmp_path: Path, field: str) -> None:
    frames = known_frames()
    long = "s" * (MAX_NAME + 1)
    frame = frames[2] if field == "drop_reason" else frames[1]
    frame[field] = {"kind": long} if field == "reason" else long
    line = frames.index(frame) + 2
    with pytest.raises(SplitEdgeError, match=rf"r\.jsonl:{line}: a frame record's {field} must be .*{MAX_NAME}"):
        load_trace(write_jsonl(tmp_path / "r.jsonl", [run_record(), *frames]))
