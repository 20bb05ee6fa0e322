"""Names read from a trace are text a picture can draw (issue 45: traces are untrusted input). JSON
can spell a lone surrogate (``"\\ud800"``), which is no text: a split named so ended the report in a
TypeError traceback from matplotlib's font code. It is refused in one line naming its line and field;
a name JSON spells with a surrogate pair (an emoji, as ``json.dumps`` writes it) is text, and drawn."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fieldtrial._compare import write_comparison
from fieldtrial._page import PAGE
from fieldtrial._report import SUMMARY_FILE
from tests.fieldtrial.test_hostile_traces import one_line, report
from tests.fieldtrial.test_report import known_frames, run_record, write_jsonl

LONE = "\ud800"


@pytest.mark.parametrize(("line", "field"), [(3, "split"), (4, "drop_reason"), (2, "error"), (2, "reason")])
def test_a_lone_surrogate_in_a_frame_isone_line(tmp_path: Path, line: int, field: str) -> None:
    frames = known_frames()
    frame = frames[line - 2]
    frame[field] = {"kind": LONE} if field == "reason" else LONE
    code, err, _ = report(tmp_path, [run_record()] + frames)
    assert code == 2 and f"run.jsonl:{line}: a frame record's {field} must be" in one_line(err)


def test_a_lone_surrogate_in_the_run_record_or_a_link_rate_isone_line(tmp_path: Path) -> None:
    code, err, _ = report(tmp_path, [{**run_record(), "bundle_id": LONE}] + known_frames())
    assert code == 2 and "run.jsonl:1: the run record's bundle_id" in one_line(err)
    rate = {"type": "link_rate", "t": 0.0, "rate_bps": 1e6, "set_by": LONE}
    code, err, _ = report(tmp_path, [run_record(), rate] + known_frames())
    assert code == 2 and "run.jsonl:2: a link_rate record's set_by" in one_line(err)


def test_a_name_spelled_with_a_surrogate_pair_is_text_and_drawn(tmp_path: Path) -> None:
    frames = known_frames()
    frames[1]["split"] = frames[3]["split"] = "cut \U0001F600"  # json.dumps writes "\ud83d\ude00"
    code, err, out = report(tmp_path, [run_record()] + frames)
    assert code == 0, err
    assert "cut \U0001F600" in json.loads((out / SUMMARY_FILE).read_text(encoding="utf-8"))["per_split"]


def test_a_trace_file_name_that_is_not_utf8_labels_its_run_readably(tmp_path: Path) -> None:
    """A file name's bytes that are not UTF-8 reach Python as surrogate escapes (``\\udcff``): the run's
    label, its legends and its page have them written out, not a TypeError from matplotlib."""
    odd = Path(os.fsdecode(os.fsencode(str(tmp_path)) + b"/\xff.jsonl"))
    write_jsonl(odd, [run_record()] + known_frames())
    other = write_jsonl(tmp_path / "b.jsonl", [run_record()] + known_frames())
    summary = write_comparison([odd, other], tmp_path / "out")
    assert [r["label"] for r in summary["runs"]] == ["\\udcff", "b"]
    assert "\\udcff" in (tmp_path / "out" / PAGE).read_text(encoding="utf-8")
