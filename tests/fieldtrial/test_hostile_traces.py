"""Traces are untrusted input (issue 45): a hostile trace ends ``split-device report`` in one line
naming its line and field, or is reported with what it could not show grouped and counted; never a
traceback, a hang, unbounded memory or a ``summary.json`` other tools refuse."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from device_runtime.bundle import LOCAL
from fieldtrial import commands
from fieldtrial._report import SUMMARY_FILE
from fieldtrial._trace import MAX_LINE_BYTES, MAX_SHOWN, OTHER, load_trace
from tests.fieldtrial.test_report import known_frames, run_record, write_jsonl
from tests.signals import sigterm_ends_it

ROOT = Path(__file__).resolve().parents[2]
MATHTEXT = "$\\frac{a}{$"  # matplotlib's mathtext raised ParseSyntaxException on it


def _no_constants(name: str) -> Any:
    raise AssertionError(f"summary.json holds {name}: not strict JSON")


def strict(path: Path) -> Any:
    """The JSON at ``path``, refusing NaN and the infinities as a strict parser does."""
    return json.loads(path.read_text(encoding="utf-8"), parse_constant=_no_constants)


def report(tmp_path: Path, records: list[dict[str, Any]] | None = None, raw: str | None = None,
           name: str = "run") -> tuple[int, str, Path]:
    """``split-trial report`` in this process: its exit status, what it said on stderr, its folder."""
    path = tmp_path / f"{name}.jsonl"
    if raw is not None:
        path.write_text(raw, encoding="utf-8")
    else:
        write_jsonl(path, records or [])
    out = tmp_path / f"out-{name}"
    import io
    from contextlib import redirect_stderr, redirect_stdout
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        code = commands.main(["report", str(path), "--out", str(out)])
    return code, err.getvalue(), out


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


def report_in_a_process(tmp_path: Path, records: list[dict[str, Any]], timeout: float) -> subprocess.CompletedProcess:
    """``split-trial report`` as a command (a hang or a memory blow-up must not take the suite with it)."""
    path = write_jsonl(tmp_path / "run.jsonl", records)
    code = "import sys; from fieldtrial.commands import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, "report", str(path), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_a_split_named_in_mathtext_is_drawn_as_written(tmp_path: Path) -> None:
    frames = known_frames()
    for f in frames:
        if f["split"] == "cut":
            f["split"] = MATHTEXT
    code, err, out = report(tmp_path, [run_record()] + frames)
    assert code == 0, err
    assert MATHTEXT in strict(out / SUMMARY_FILE)["per_split"]
    assert (out / "latency_cdf.png").stat().st_size > 10_000


def test_a_mathtext_label_and_split_in_a_comparison(tmp_path: Path) -> None:
    frames = known_frames()
    frames[1]["split"] = MATHTEXT
    a = write_jsonl(tmp_path / "a.jsonl", [run_record()] + frames)
    b = write_jsonl(tmp_path / "b.jsonl", [run_record()] + known_frames())
    code = commands.main(["report", str(a), str(b), "--label", "$x^{$", "--label", "<b>&", "--out",
                          str(tmp_path / "cmp")])
    assert code == 0
    page = (tmp_path / "cmp" / "report.html").read_text(encoding="utf-8")
    assert "<b>&" not in page and "&lt;b&gt;&amp;" in page
    strict(tmp_path / "cmp" / SUMMARY_FILE)


@pytest.mark.parametrize("field, value", [("started_unix", "NaN"), ("batch", "Infinity"), ("policy", "-Infinity")])
def test_a_run_record_with_nan_is_one_line(tmp_path: Path, field: str, value: str) -> None:
    run = json.dumps({**run_record(), field: 0}).replace(f'"{field}": 0', f'"{field}": {value}')
    raw = run + "\n" + "".join(json.dumps(f) + "\n" for f in known_frames())
    code, err, out = report(tmp_path, raw=raw)
    assert code == 2 and f"run.jsonl:1: the run record's {field}" in one_line(err)
    assert not (out / SUMMARY_FILE).exists()


def test_a_frame_with_nan_is_one_line(tmp_path: Path) -> None:
    lines = [json.dumps(r) for r in [run_record()] + known_frames()]
    lines[2] = lines[2].replace('"total_ms": 40.0', '"total_ms": NaN')
    code, err, _ = report(tmp_path, raw="\n".join(lines) + "\n")
    assert code == 2 and "run.jsonl:3: a frame record's total_ms" in one_line(err)


def test_a_link_rate_set_by_nan_is_one_line(tmp_path: Path) -> None:
    lines = [json.dumps(r) for r in [run_record()] + known_frames()]
    lines.append('{"type": "link_rate", "t": 1.0, "rate_bps": 1e6, "set_by": NaN}')
    code, err, out = report(tmp_path, raw="\n".join(lines) + "\n")
    assert code == 2 and "run.jsonl:10: a link_rate record's set_by" in one_line(err)
    assert not (out / SUMMARY_FILE).exists()


@pytest.mark.parametrize("field", ["t", "index"])
def test_a_frame_without_its_time_or_index_is_one_line(tmp_path: Path, field: str) -> None:
    frames = known_frames()
    del frames[1][field]
    code, err, _ = report(tmp_path, [run_record()] + frames)
    assert code == 2 and f"run.jsonl:3: a frame record's {field}" in one_line(err)


def test_the_summary_is_strict_json(tmp_path: Path) -> None:
    code, err, out = report(tmp_path, [run_record()] + known_frames())
    assert code == 0, err
    summary = strict(out / SUMMARY_FILE)
    assert summary["grouped"] == {}


def test_a_calibration_that_is_dev_zero_is_refused(tmp_path: Path) -> None:
    started = time.monotonic()
    done = report_in_a_process(tmp_path, [run_record("/dev/zero")] + known_frames(), timeout=120)
    assert done.returncode == 2, done.stderr
    assert "/dev/zero" in one_line(done.stderr) and "not a regular file" in done.stderr
    assert time.monotonic() - started < 60


def test_a_calibration_that_is_a_fifo_is_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "calibration.json"
    os.mkfifo(fifo)
    done = report_in_a_process(tmp_path, [run_record(str(fifo))] + known_frames(), timeout=120)  # was: hung
    assert done.returncode == 2, done.stderr
    assert "not a regular file (a FIFO)" in one_line(done.stderr)


def test_a_calibration_named_by_a_number_is_left_alone(tmp_path: Path) -> None:
    code, err, out = report(tmp_path, [{**run_record(), "calibration": 7}] + known_frames())
    assert code == 0, err and strict(out / SUMMARY_FILE)["calibration"] is None


def test_100000_distinct_splits_are_grouped_in_bounded_time(tmp_path: Path) -> None:
    base = known_frames()[1]
    frames = [{**base, "t": i * 0.001, "index": i, "split": LOCAL if i % 10 == 0 else f"s{i}"} for i in range(100_000)]
    started = time.monotonic()
    done = report_in_a_process(tmp_path, [run_record()] + frames, timeout=600)  # was: over 900 s of CPU, no report
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    summary = strict(tmp_path / "out" / SUMMARY_FILE)
    assert len(summary["per_split"]) <= MAX_SHOWN and OTHER in summary["per_split"] and LOCAL in summary["per_split"]
    assert summary["grouped"]["split"]["frames"] == summary["per_split"][OTHER]["frames"]
    assert sum(s["frames"] for s in summary["per_split"].values()) == 100_000
    assert f"shown as '{OTHER}'" in done.stdout
    assert elapsed < 300, f"{elapsed:.0f} s"


def test_distinct_drop_reasons_are_grouped(tmp_path: Path) -> None:
    frames = known_frames() + [
        {**known_frames()[2], "t": 5.0 + i * 0.01, "index": 100 + i, "drop_reason": f"why_{i}"} for i in range(200)]
    trace = load_trace(write_jsonl(tmp_path / "r.jsonl", [run_record()] + frames))
    assert len({f["drop_reason"] for f in trace.frames if f["dropped"] and "drop_reason" in f}) <= MAX_SHOWN
    assert trace.grouped["drop_reason"]["values"] > 0


def test_a_line_past_the_cap_is_one_line_and_not_read_whole(tmp_path: Path) -> None:
    lines = [json.dumps(r) for r in [run_record()] + known_frames()]
    lines.insert(2, json.dumps({"type": "note", "text": "x" * (2 * MAX_LINE_BYTES)}))
    code, err, _ = report(tmp_path, raw="\n".join(lines) + "\n")
    assert code == 2 and "run.jsonl:3: a line longer than" in one_line(err)


def test_a_cut_short_last_line_is_still_left_out(tmp_path: Path) -> None:
    lines = [json.dumps(r) for r in [run_record()] + known_frames()]
    code, err, out = report(tmp_path, raw="\n".join(lines) + '\n{"type": "frame", "t": \n\n')
    assert code == 0, err and strict(out / SUMMARY_FILE)["frames"] == len(known_frames())


def test_sigterm_ends_a_long_report_within_5_s(tmp_path: Path) -> None:
    base = known_frames()[1]
    frames = [{**base, "t": i * 0.01, "index": i, "split": ("cut", LOCAL)[i % 2]} for i in range(200_000)]
    path = write_jsonl(tmp_path / "run.jsonl", [run_record()] + frames)
    code = "import sys; from fieldtrial.commands import main; sys.exit(main(sys.argv[1:]))"
    reporting = subprocess.Popen([sys.executable, "-c", code, "report", str(path), "--out", str(tmp_path / "out")],
                                 cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = sigterm_ends_it(reporting, lambda: time.sleep(3.0))
    assert reporting.returncode == 143 and "stopped by SIGTERM" in one_line(err)


def test_the_reasons_that_tell_a_fallback_are_never_grouped(tmp_path: Path) -> None:
    base = {**known_frames()[1], "split": LOCAL}
    frames = [{**base, "t": i * 0.01, "index": i, "reason": {"kind": f"k{i}"}} for i in range(100)]
    frames.append({**base, "t": 2.0, "index": 100, "reason": {"kind": "fallback"}, "error": "host went away"})
    trace = load_trace(write_jsonl(tmp_path / "r.jsonl", [run_record()] + frames))
    assert trace.frames[-1]["reason"]["kind"] == "fallback" and trace.grouped["reason"]["frames"] > 0
