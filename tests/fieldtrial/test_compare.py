"""``split-device report A B …``: runs side by side on one self-contained page, on traces built by hand."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest

from calibration import calibration_file as cal
from device_runtime import cli as device_cli
from device_runtime.bundle import LOCAL, OFFLOAD
from fieldtrial import commands
from fieldtrial._compare import COMPARISON_PLOTS, agreement, default_labels, trace_paths, write_comparison
from fieldtrial._page import PAGE
from fieldtrial._report import MODEL_PLOT, PLOTS, SUMMARY_FILE, summarize, write_report
from fieldtrial._trace import TRACE_SCHEMA_4, load_trace
from splitedge.errors import SplitEdgeError
from tests.fieldtrial.test_report import (
    BUNDLE, PNG_MAGIC, assert_png, frame_record, known_frames, run_record, tiny_calibration, write_jsonl,
)

DEADLINE_MS = 100.0


def schema_4_frames() -> list[dict]:
    """:func:`known_frames` as a schema 4 run records them: a reason per frame, and a deadline."""
    frames = known_frames()
    for f in frames:
        f["reason"] = {"kind": "no_rate"} if f["rate_bps"] is None else {"kind": "table", "cell": [1, 2]}
        f["deadline_ms"] = DEADLINE_MS
    return frames


def write_pair(folder: Path) -> tuple[Path, Path]:
    """Two runs of one bundle: ``a`` (schema 3) and ``b`` (schema 4, policy "cut", its fallback slower)."""
    folder.mkdir(parents=True, exist_ok=True)
    a = write_jsonl(folder / "a.jsonl", [run_record()] + known_frames())
    frames = schema_4_frames()
    frames[5]["total_ms"] = 260.0  # was 150
    b = write_jsonl(folder / "b.jsonl", [{**run_record(), "schema": TRACE_SCHEMA_4, "policy": "cut"}] + frames)
    return a, b


def test_a_schema_4_trace_reads_and_its_reasons_and_deadlines_are_counted(tmp_path: Path) -> None:
    _, b = write_pair(tmp_path)
    trace = load_trace(b)
    s = summarize(trace.run, trace.frames, None)
    assert s["split_reasons"] == {"table": 5, "no_rate": 1}  # the answered frames; no_rate: no estimate yet
    # Answered after 100 ms: 110 (local, the first frame) and 260 (the fallback).
    assert s["deadline_misses"] == {"with_deadline": 6, "missed": 2, "share": 2 / 6}
    older = summarize(run_record(), known_frames(), None)
    assert older["split_reasons"] == {} and older["deadline_misses"] is None


def test_agreement_matches_frames_by_index() -> None:
    reference = [frame_record(i, 0.1 * i, split, 10.0 * (i + 1), None, False, None)
                 for i, split in enumerate(["a", "a", "b", "b", "c"])]
    other = [frame_record(i, 0.1 * i, split, 11.0 * (i + 1), None, i == 3, None)
             for i, split in enumerate(["a", "b", "b", "b", "c", "c"])]
    a = agreement(reference, other)
    # index 1 differs, index 3 was dropped by the other run, index 5 the reference never had.
    assert (a["reference_answered"], a["answered_in_both"], a["same_split"]) == (5, 4, 3)
    assert a["split_agreement"] == 3 / 5 and a["split_agreement_answered"] == 3 / 4
    assert a["reference_p50_ms"] == 30.0 and a["p50_ms"] == 33.0 and a["p50_ratio"] == pytest.approx(1.1)


def test_default_labels_tell_the_runs_apart(tmp_path: Path) -> None:
    runs = [{"bundle_id": "m1", "policy": "auto"}, {"bundle_id": "m2", "policy": "auto"}]
    assert default_labels([Path("x/day1.jsonl"), Path("x/day2.jsonl")], runs) == ["day1", "day2"]
    assert default_labels([Path("m1/run.jsonl"), Path("m2/run.jsonl")], runs) == ["m1", "m2"]
    same = [{"bundle_id": "m", "policy": "auto"}] * 2
    assert default_labels([Path("mon/run.jsonl"), Path("tue/run.jsonl")], same) == ["mon/run", "tue/run"]
    assert default_labels([Path("run.jsonl"), Path("run.jsonl")], same) == ["run #1", "run #2"]


def test_folders_give_their_traces_and_nothing_else(tmp_path: Path) -> None:
    a, b = write_pair(tmp_path / "runs")
    write_jsonl(tmp_path / "runs" / "other.jsonl", [{"type": "something else"}])
    assert trace_paths([tmp_path / "runs"]) == [a, b]
    assert trace_paths([b, tmp_path / "runs"]) == [b, a, b]
    (tmp_path / "empty").mkdir()
    with pytest.raises(SplitEdgeError, match="empty: no trace in this folder"):
        trace_paths([tmp_path / "empty"])
    with pytest.raises(SplitEdgeError, match="gone.jsonl: no such trace file or folder"):
        trace_paths([tmp_path / "gone.jsonl"])


def embedded_images(page: str) -> list[bytes]:
    """The PNGs of a page, decoded from their data: URIs."""
    return [base64.b64decode(data) for data in re.findall(r'src="data:image/png;base64,([^"]+)"', page)]


def test_two_runs_side_by_side(tmp_path: Path) -> None:
    a, b = write_pair(tmp_path)
    out = tmp_path / "compare"
    summary = write_comparison([a, b], out, [cal.load_all(_saved(tmp_path))], ["first", "second"])
    assert json.loads((out / SUMMARY_FILE).read_text(encoding="utf-8")) == summary
    assert [r["label"] for r in summary["runs"]] == ["first", "second"]
    # Each run's own report, as the single-run report writes it, in a folder of its own.
    for run, trace in zip(summary["runs"], (a, b)):
        assert run["summary"] == write_report(trace, tmp_path / "alone", tiny_calibration())
        for name in [*PLOTS, MODEL_PLOT, SUMMARY_FILE]:
            assert (out / run["report"] / name).is_file(), name
    for name in COMPARISON_PLOTS:
        assert_png(out / name)
    (against,) = summary["against_first"]
    assert (against["label"], against["same_split"], against["split_agreement"]) == ("second", 6, 1.0)
    assert against["p50_ratio"] == 1.0  # only the slowest frame was slower: the median did not move
    page = (out / PAGE).read_text(encoding="utf-8")
    # Self-contained: no address to fetch, every picture inline (the comparison's and each run's).
    assert not re.search(r"(?:src|href)=\"(?!data:)", page) and "http" not in page
    images = embedded_images(page)
    assert len(images) == len(COMPARISON_PLOTS) + 2 * (len(PLOTS) + 1)
    assert all(image.startswith(PNG_MAGIC) for image in images)
    for text in ("first", "second", "the table's cell for the rate", "no rate estimate yet", "2 of 6", "DSC Eq. 7", "local (no offload)"):
        assert text in page, text


def _saved(folder: Path) -> Path:
    path = folder / "calibration.json"
    cal.save(tiny_calibration(), path)
    return path


def test_one_run_writes_its_report_and_the_page(tmp_path: Path) -> None:
    a, _ = write_pair(tmp_path)
    summary = write_comparison([a], tmp_path / "one")
    assert summary == write_report(a, tmp_path / "alone")
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == sorted([*PLOTS, SUMMARY_FILE, PAGE])
    assert len(embedded_images((tmp_path / "one" / PAGE).read_text(encoding="utf-8"))) == len(PLOTS)


def test_labels_and_calibrations_are_checked(tmp_path: Path) -> None:
    a, b = write_pair(tmp_path)
    with pytest.raises(SplitEdgeError, match="--label given 1 times for 2 runs"):
        write_comparison([a, b], tmp_path / "out", labels=["x"])
    with pytest.raises(SplitEdgeError, match="the labels must differ"):
        write_comparison([a, b], tmp_path / "out", labels=["x", "x"])
    other = cal.load_all(_other(tmp_path))
    with pytest.raises(SplitEdgeError, match=f"calibration is for bundle other-bundle, none of the runs is.*{BUNDLE}"):
        write_comparison([a, b], tmp_path / "out", [other])


def _other(folder: Path) -> Path:
    path = folder / "other.json"
    cal.save(tiny_calibration("other-bundle"), path)
    return path


def test_split_device_report_compares_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = write_pair(tmp_path)
    out = tmp_path / "compare"
    status = device_cli.main(["report", str(a), str(b), "--out", str(out), "--calibration", str(_saved(tmp_path)),
                              "--label", "first", "--label", "second"])
    assert status == 0
    text = capsys.readouterr().out
    assert "second against first: the same split on 100.0% of first's 6 answered frames" in text
    assert f"wrote {out / PAGE}" in text
    assert json.loads((out / SUMMARY_FILE).read_text())["runs"][1]["summary"]["gain_over_static"].keys() == {
        LOCAL, "cut", OFFLOAD}


def test_split_trial_report_takes_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_pair(tmp_path / "runs")
    assert commands.main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 0
    assert [r["label"] for r in json.loads((tmp_path / "out" / SUMMARY_FILE).read_text())["runs"]] == ["a", "b"]
    assert commands.main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--label", "x"]) == 2
    assert "--label given 1 times for 2 runs" in capsys.readouterr().err
