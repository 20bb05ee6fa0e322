"""``split-device report``: the summary's numbers on traces built by hand, the plots, and the errors."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import calibration as cal
from calibration import calibration_file
from calibration import LatencyModel, SplitTable, SplitTimings
from calibration.calibration_file import Calibration
from device_runtime.bundle import LOCAL, OFFLOAD
from device_runtime.stream._results import FrameResult
from device_runtime.stream.trace import TRACE_SCHEMA, TraceWriter
from fieldtrial import _plots as plots
from fieldtrial._report import MODEL_PLOT, NOT_CALIBRATED, PLOTS, SUMMARY_FILE, format_summary, summarize, write_report
from fieldtrial._timeline import BY_CHOICE, NOT_TOLD
from fieldtrial._trace import TRACE_SCHEMA_1
from splitedge.errors import SplitEdgeError

BUNDLE = "tiny-0123456789ab"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# T(B=1, r) of the hand-made model (DSC Eq. 4-5, rtt 1 ms): local 100; cut 20 + 8e6/r + 5 + 1;
# offload 8e7/r + 10 + 1. At the trace's rates: 8e4 -> (100, 126, 1011), 8e5 -> (100, 36, 111),
# 8e6 -> (100, 27, 21) for (local, cut, offload).
T = {
    8e4: {LOCAL: 100.0, "cut": 126.0, OFFLOAD: 1011.0},
    8e5: {LOCAL: 100.0, "cut": 36.0, OFFLOAD: 111.0},
    8e6: {LOCAL: 100.0, "cut": 27.0, OFFLOAD: 21.0},
}

# (t, split, total_ms, rate_bps, dropped, error): 8 frames, 2 dropped, 1 fallback, 4 switches.
FRAMES = [
    (0.0, LOCAL, 110.0, None, False, None),  # no rate estimate yet: not a DSC Eq. 7 state
    (0.5, "cut", 40.0, 8e5, False, None),
    (1.0, "", 5.0, None, True, None),
    (1.5, "cut", 44.0, 8e5, False, None),
    (2.0, OFFLOAD, 30.0, 8e6, False, None),
    (2.5, LOCAL, 150.0, 8e4, False, "cut: host went away"),
    (3.0, "", 5.0, None, True, None),
    (4.0, OFFLOAD, 26.0, 8e6, False, None),
]
LATENCIES = [110.0, 40.0, 44.0, 30.0, 150.0, 26.0]  # the answered frames'
PREPROCESS_MS = 2.0


def tiny_model() -> LatencyModel:
    return LatencyModel(
        splits=(
            SplitTimings(LOCAL, 0, {1: 100.0}, {}),
            SplitTimings("cut", 1000, {1: 20.0}, {1: 5.0}),
            SplitTimings(OFFLOAD, 10000, {}, {1: 10.0}),
        ),
        rtt_ms=1.0,
    )


def tiny_calibration(bundle_id: str = BUNDLE) -> Calibration:
    model = tiny_model()
    return Calibration(
        bundle_id=bundle_id, manifest_sha256="0" * 64, created="2025-05-01T12:00:00+00:00", board={"name": "test"},
        backend="onnx", precision="float32", threads=None, repeats=1, batches=(1, 4), link=None, model=model,
        table=SplitTable.build(model, [1, 4], points_per_decade=5),
    )


def run_record(calibration: str | None = None) -> dict[str, Any]:
    return {"type": "run", "schema": TRACE_SCHEMA, "started_unix": 1.7e9, "bundle_id": BUNDLE, "policy": "auto",
            "batch": 1, "calibration": calibration, "source": "synthetic"}


def frame_record(i: int, t: float, split: str, total_ms: float, rate: float | None, dropped: bool, error: str | None) -> dict:
    return {
        "type": "frame", "t": t, "index": i, "name": f"f{i}.png", "label": None if dropped else "espresso",
        "probability": None if dropped else 0.9, "split": split, "batch": 1, "bytes": 0, "rate_bps": rate,
        "preprocess_ms": 0.0 if dropped else PREPROCESS_MS, "head_ms": 0.0, "transfer_ms": 0.0, "tail_ms": 0.0,
        "total_ms": total_ms, "dropped": dropped, "where": "local", "host": None, "error": error,
    }


def known_frames() -> list[dict]:
    return [frame_record(i, *f) for i, f in enumerate(FRAMES)]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, path
    assert len(data) > 10_000, f"{path}: {len(data)} bytes, too small to hold a drawn figure"


def test_counts_rates_and_switches_on_a_known_trace() -> None:
    s = summarize(run_record(), known_frames(), None)
    assert (s["frames"], s["answered"], s["dropped"]) == (8, 6, 2)
    assert s["drop_rate"] == 0.25
    assert s["duration_s"] == 4.0
    assert s["fps"] == 1.5  # 6 answered frames over 4 s of capture
    assert s["split_changes"] == 4  # local -> cut -> offload -> local -> offload
    # The frame that fell back records no reason (as before schema 4): refused or failed, it cannot say.
    assert (s["fallbacks"], s["deadline_refusals"]) == (0, 0)
    assert {cause: c["frames"] for cause, c in s["local_causes"].items()} == {BY_CHOICE: 1, NOT_TOLD: 1}
    assert s["run"]["bundle_id"] == BUNDLE and s["calibration"] is None and "gain_over_static" not in s


def test_latency_percentiles_are_numpys() -> None:
    s = summarize(run_record(), known_frames(), None)
    p50, p95, p99 = np.percentile(LATENCIES, [50, 95, 99])
    assert s["latency_ms"] == {"p50": p50, "p95": p95, "p99": p99, "mean": np.mean(LATENCIES)}
    assert s["per_split"]["cut"]["p50_ms"] == np.percentile([40.0, 44.0], 50)
    assert s["per_split"][LOCAL]["p95_ms"] == np.percentile([110.0, 150.0], 95)


def test_each_split_says_what_a_frame_crossed_the_link_in() -> None:
    """A coded option (issue 47) is a split of its own in the report, its bytes a frame its coding's."""
    frames = [{**frame_record(i, i * 0.5, split, 30.0, 8e5, False, None), "bytes": sent}
              for i, (split, sent) in enumerate([("cut", 7840), ("cut@k4", 980), ("cut@k4", 980), (LOCAL, 0)])]
    s = summarize(run_record(), frames, None)
    assert {split: p["bytes_per_frame"] for split, p in s["per_split"].items()} == {"cut": 7840, "cut@k4": 980, LOCAL: 0}
    table = format_summary(s)
    assert any(line.startswith("cut@k4") and line.rstrip().endswith("980") for line in table.splitlines())


def test_per_split_shares_and_seconds() -> None:
    per_split = summarize(run_record(), list(reversed(known_frames())), None)["per_split"]  # order on disk must not matter
    assert list(per_split) == [OFFLOAD, "cut", LOCAL]  # input to output
    assert sum(p["share"] for p in per_split.values()) == pytest.approx(1.0)
    assert [p["frames"] for p in per_split.values()] == [2, 2, 2]
    # Each answered frame holds until the next answered capture: local 0-0.5 and 2.5-4.0, cut 0.5-2.0, offload 2.0-2.5.
    assert {k: p["seconds"] for k, p in per_split.items()} == {LOCAL: 2.0, "cut": 1.5, OFFLOAD: 0.5}


def test_gain_over_static_is_dsc_eq7_by_hand() -> None:
    s = summarize(run_record(), known_frames(), tiny_calibration())
    states = [(f[3], f[1]) for f in FRAMES if not f[4] and f[3] is not None]  # (rate, split that ran)
    assert len(states) == 5
    expected = {
        static: sum(abs(T[r][chosen] - T[r][static]) / T[r][static] for r, chosen in states) / len(states)
        for static in (LOCAL, "cut", OFFLOAD)
    }
    # Written out for local: |36-100| + |36-100| + |21-100| + |100-100| + |21-100|, over 100, over 5.
    assert expected[LOCAL] == pytest.approx((64 + 64 + 79 + 0 + 79) / 100 / 5)
    assert s["gain_over_static"] == pytest.approx(expected, rel=1e-12)
    assert s["gain_scenario"] == {"states": 5, "without_rate": 1, "unmodelled_split": 0}


def staged(i: int, t: float, split: str, rate: float | None, head: float, transfer: float, tail: float,
           queue: float = 0.0, slot: float = 0.0, host_queue: float = 0.0, other: float = 0.5,
           error: str | None = None) -> dict:
    """A frame whose total is its preprocessing, stages, waits and ``other`` (hand-offs) added up."""
    total = PREPROCESS_MS + head + transfer + tail + queue + slot + host_queue + other
    record = frame_record(i, t, split, total, rate, False, error)
    record.update(head_ms=head, transfer_ms=transfer, tail_ms=tail, queue_ms=queue, slot_ms=slot,
                  host_queue_ms=host_queue, where="local" if split == LOCAL else "remote")
    return record


def queued_frames() -> list[dict]:
    """A run that backs up: the board's queue grows by 10 ms a frame (a recording read faster than
    the head runs) and the host queues too, while every stage runs as calibrated, give or take.

    The tiny model at 8e5 bit/s predicts cut = 20 + (10 + 1) + 5 = 36 ms, local = 100 ms.
    """
    frames = [
        staged(i, 0.1 * i, "cut", 8e5, head=21.0, transfer=11.5, tail=5.0, queue=100.0 + 10.0 * i, slot=20.0,
               host_queue=30.0)
        for i in range(20)
    ]
    frames += [staged(20 + i, 2.0 + 0.1 * i, LOCAL, None, head=100.0, transfer=0.0, tail=0.0, queue=50.0)
               for i in range(3)]
    # Answered here after the host failed: its head time holds the failed attempt; left out.
    frames.append(staged(23, 2.5, LOCAL, 8e5, head=500.0, transfer=0.0, tail=0.0, error="cut: host went away"))
    return frames


def test_a_calibration_that_timed_preprocessing_is_compared_stage_by_stage() -> None:
    """calibrate's preprocessing term (issue 29.3) is a modelled stage like the others: predicted,
    in the prediction's sum, and no longer listed as missing."""
    model = LatencyModel(tiny_model().splits, tiny_model().rtt_ms, preprocess_ms=1.5)
    timed = calibration_file.Preprocessing("fast", 640, 480, cal.Spread(1.0, 1.5, 2.5))
    calibration = Calibration(**{**{f: getattr(tiny_calibration(), f) for f in Calibration.__dataclass_fields__},
                                 "model": model, "preprocess": timed,
                                 "table": SplitTable.build(model, [1, 4], points_per_decade=5)})
    cut = summarize(run_record(), queued_frames(), calibration)["predicted_vs_measured"]["cut"]
    assert cut["stages"]["preprocess"] == {"measured_ms": PREPROCESS_MS, "predicted_ms": pytest.approx(1.5)}
    assert cut["unmodelled_stages"] == [] and cut["predicted_ms"] == pytest.approx(37.5)  # 1.5 + 36
    assert cut["stages_ms"] == pytest.approx(PREPROCESS_MS + 37.5)


def test_measured_vs_model_sets_the_waits_apart_from_the_stages() -> None:
    comparison = summarize(run_record(), queued_frames(), tiny_calibration())["predicted_vs_measured"]
    cut = comparison["cut"]
    assert cut["frames"] == 20 and cut["predicted_ms"] == pytest.approx(36.0)
    # The stages ran as the model said: 21 + 11.5 + 5 = 37.5 ms against 36.
    assert cut["stages_ms"] == pytest.approx(37.5) and cut["ratio"] == pytest.approx(37.5 / 36.0)
    assert cut["stages"] == {
        "preprocess": {"measured_ms": PREPROCESS_MS, "predicted_ms": None, "model": NOT_CALIBRATED},
        "head": {"measured_ms": 21.0, "predicted_ms": pytest.approx(20.0)},
        "transfer": {"measured_ms": 11.5, "predicted_ms": pytest.approx(11.0)},
        "tail": {"measured_ms": 5.0, "predicted_ms": pytest.approx(5.0)},
    }
    # The waits, apart: the board's queue (median of 100..290 ms), the slot, the host's queue.
    assert cut["waits_ms"] == {"queue": 195.0, "slot": 20.0, "host_queue": 30.0, "all": 245.0}
    # End to end, capture to answer, as the report used to compare it: the model looked 7.9x off.
    assert cut["end_to_end_ms"] == pytest.approx(PREPROCESS_MS + 37.5 + 245.0 + 0.5)
    assert cut["end_to_end_ratio"] == pytest.approx(285.0 / 36.0) and cut["end_to_end_ratio"] > 7
    # Local: its head is the full model; the fallback frame is not compared.
    assert comparison[LOCAL]["frames"] == 3 and comparison[LOCAL]["ratio"] == pytest.approx(1.0)
    assert comparison[LOCAL]["waits_ms"]["queue"] == 50.0


def test_measured_vs_model_in_the_printed_summary_and_its_plot(tmp_path: Path) -> None:
    trace = write_jsonl(tmp_path / "run.jsonl", [run_record()] + queued_frames())
    summary = write_report(trace, tmp_path / "out", calibration=tiny_calibration())
    assert_png(tmp_path / "out" / MODEL_PLOT)
    text = format_summary(summary)
    assert "measured vs model (medians, ms)" in text
    row = [line for line in text.splitlines() if line.startswith("cut ")][-1]  # after the per-split table
    assert row.split() == ["cut", "20", "36.0", "37.5", "1.04", "2.0", "245.0", "285.0", "7.92"]


def test_a_schema_1_trace_has_no_waits(tmp_path: Path) -> None:
    # Before the waits were recorded: the host's queue was in tail_ms, the board's nowhere.
    frames = [staged(i, 0.1 * i, "cut", 8e5, head=20.0, transfer=11.0, tail=5.0 + 30.0, queue=0.0) for i in range(5)]
    for f in frames:
        for key in ("queue_ms", "slot_ms", "host_queue_ms"):
            del f[key]
    trace = write_jsonl(tmp_path / "old.jsonl", [{**run_record(), "schema": TRACE_SCHEMA_1}] + frames)
    summary = write_report(trace, tmp_path / "out", calibration=tiny_calibration())
    cut = summary["predicted_vs_measured"]["cut"]
    assert cut["waits_ms"] is None and cut["stages_ms"] == pytest.approx(66.0)
    assert "a schema 1 trace: no waits recorded" in format_summary(summary)


def test_frames_on_a_split_the_model_lacks_are_left_out_of_the_gain() -> None:
    frames = known_frames() + [frame_record(8, 5.0, "other_cut", 50.0, 8e5, False, None)]
    s = summarize(run_record(), frames, tiny_calibration())
    assert s["gain_scenario"] == {"states": 5, "without_rate": 1, "unmodelled_split": 1}
    assert "other_cut" in s["per_split"] and "other_cut" not in s["predicted_vs_measured"]
    assert set(s["predicted_vs_measured"]) == {OFFLOAD, "cut", LOCAL}


def test_write_report_files_and_round_trip(tmp_path: Path) -> None:
    trace = write_jsonl(tmp_path / "run.jsonl", [run_record()] + known_frames())
    summary = write_report(trace, tmp_path / "out", calibration=tiny_calibration())
    assert json.loads((tmp_path / "out" / SUMMARY_FILE).read_text(encoding="utf-8")) == summary
    for name in PLOTS:
        assert_png(tmp_path / "out" / name)
    text = format_summary(summary)
    for expected in ("p50", "p95", "p99", "1.50 fps", "25.0 %", "local (no offload)", "offload (full offload)",
                     f"{100 * summary['gain_over_static'][LOCAL]:7.1f} %", "DSC Eq. 7"):
        assert expected in text


def test_write_report_loads_the_runs_calibration(tmp_path: Path) -> None:
    calibration_file.save(tiny_calibration(), tmp_path / "calibration.json")
    trace = write_jsonl(tmp_path / "run.jsonl", [run_record(str(tmp_path / "calibration.json"))] + known_frames())
    summary = write_report(trace, tmp_path / "out")
    assert summary["calibration"]["bundle_id"] == BUNDLE
    assert set(summary["gain_over_static"]) == {LOCAL, "cut", OFFLOAD}


def test_the_report_compares_with_the_table_the_run_used(tmp_path: Path) -> None:
    from dataclasses import replace

    path = tmp_path / "calibration.json"
    calibration_file.save(tiny_calibration(), path)  # onnx/float32: the run's
    calibration_file.save(replace(tiny_calibration(), backend="tflite", precision="int8", created="2025-06-01T12:00:00+00:00"), path)
    record = {**run_record(str(path)), "calibration_key": ["onnx", "float32"]}
    trace = write_jsonl(tmp_path / "run.jsonl", [record] + known_frames())
    assert write_report(trace, tmp_path / "out")["calibration"]["backend"] == "onnx"
    given = write_report(trace, tmp_path / "out", calibration=calibration_file.load_all(path))
    assert (given["calibration"]["backend"], given["calibration"]["precision"]) == ("onnx", "float32")
    # A run that recorded no table (older traces): the latest.
    trace = write_jsonl(tmp_path / "old.jsonl", [run_record(str(path))] + known_frames())
    assert write_report(trace, tmp_path / "out")["calibration"]["backend"] == "tflite"


def test_a_trace_written_by_trace_writer(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with TraceWriter(path, {"bundle_id": BUNDLE, "policy": "cut", "batch": 1, "calibration": None, "source": "synthetic"}) as w:
        start = time.monotonic()
        for i in range(10):
            dropped = i % 5 == 4
            w.frame(FrameResult(
                index=i, name=f"f{i}", label=None if dropped else "cat", probability=None if dropped else 0.5,
                split="" if dropped else "cut", total_ms=20.0 + i, captured=start + 0.1 * i, rate_bps=8e5,
                dropped=dropped, preprocess_ms=1.0, queue_ms=3.0, slot_ms=2.0, host_queue_ms=1.0,
            ))
    record = json.loads(path.read_text().splitlines()[1])
    assert record["type"] == "frame"
    assert (record["queue_ms"], record["slot_ms"], record["host_queue_ms"]) == (3.0, 2.0, 1.0)
    summary = write_report(path, tmp_path / "out")
    assert (summary["frames"], summary["answered"], summary["drop_rate"]) == (10, 8, 0.2)
    assert summary["duration_s"] == pytest.approx(0.9) and summary["fps"] == pytest.approx(8 / 0.9)
    assert summary["split_changes"] == 0 and summary["per_split"]["cut"]["share"] == 1.0


def test_plot_table(tmp_path: Path) -> None:
    plots.plot_table(tiny_calibration(), tmp_path / "table.png")
    assert_png(tmp_path / "table.png")


def test_graph_order_and_labels() -> None:
    assert plots.graph_order([LOCAL, "features_14", OFFLOAD, "features_4"]) == [OFFLOAD, "features_4", "features_14", LOCAL]
    assert plots.graph_order(["b", "a"], known_order=["b", "a"]) == ["b", "a"]
    assert plots.split_label(LOCAL) == "local (no offload)" and plots.split_label("cut") == "cut"


def test_empty_trace(tmp_path: Path) -> None:
    trace = write_jsonl(tmp_path / "empty.jsonl", [run_record()])
    with pytest.raises(SplitEdgeError, match="no frames in .*empty.jsonl"):
        write_report(trace, tmp_path / "out")


def test_calibration_of_another_bundle(tmp_path: Path) -> None:
    calibration_file.save(tiny_calibration("other-bundle"), tmp_path / "calibration.json")
    trace = write_jsonl(tmp_path / "run.jsonl", [run_record(str(tmp_path / "calibration.json"))] + known_frames())
    with pytest.raises(SplitEdgeError, match=f"other-bundle.*{BUNDLE}"):
        write_report(trace, tmp_path / "out")
    with pytest.raises(SplitEdgeError, match=f"other-bundle.*{BUNDLE}"):
        write_report(write_jsonl(tmp_path / "plain.jsonl", [run_record()] + known_frames()), tmp_path / "out",
                     calibration=tiny_calibration("other-bundle"))


def test_malformed_line_in_the_middle(tmp_path: Path) -> None:
    lines = [json.dumps(r) for r in [run_record()] + known_frames()]
    lines.insert(3, '{"type": "frame", "t": ')
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(SplitEdgeError, match=r"bad.jsonl:4: not JSON"):
        write_report(path, tmp_path / "out")


def test_missing_matplotlib_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    with pytest.raises(SplitEdgeError, match=r"pip install 'splitedge\[report\]'"):
        plots.plot_latency_cdf(known_frames(), tmp_path / "cdf.png")


def test_importing_the_report_does_not_import_matplotlib() -> None:
    code = "import sys, fieldtrial._report; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "False"


def test_split_device_report_and_split_trial_report_take_the_one_definition_of_its_arguments() -> None:
    """Both commands' report takes :func:`splitedge.add_report_arguments`' arguments, and nothing else:
    the names, help and kinds are defined once (the board runtime cannot import fieldtrial)."""
    import argparse

    from device_runtime.cli import build_parser as device_parser
    from fieldtrial.commands import build_parser as trial_parser
    from splitedge.reading import add_report_arguments

    def arguments(parser: argparse.ArgumentParser) -> list[tuple[Any, ...]]:
        return [(a.dest, tuple(a.option_strings), a.help, a.metavar, a.nargs, a.required, type(a).__name__)
                for a in parser._actions if a.dest != "help"]

    def report_of(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        (commands,) = [a for a in parser._actions if a.dest == "command"]
        return commands.choices["report"]

    defined = argparse.ArgumentParser()
    add_report_arguments(defined)
    assert arguments(report_of(device_parser())) == arguments(defined)
    assert arguments(report_of(trial_parser())) == arguments(defined)
