"""What ``split-device run`` prints: its start, split changes and summaries by default, and every frame
where the run ends by itself (``--frames N``, a folder, a video file) but not for a live camera; every
frame for any source with ``--verbose``, the final summary alone with ``--quiet``, JSON lines alone on
stdout with ``--json`` (frames there with ``--verbose`` alone); and ``calibrate --json``'s one object.

The runs are real (the test bundle's full model on the photos); the summaries' clock is the test's:
it moves one second each time the run reads it (once per frame), so a 10-second period is ten frames,
whatever the machine's load.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import numpy as np
import pytest

from calibration.calibration_file import FILENAME
from device_runtime.board.run_settings import RunSettings
from device_runtime.cli import main
from device_runtime._run import DEFAULT, QUIET, VERBOSE, Output, run_stream

FRAMES = 40


class Ticks:
    """A clock that moves one second each time it is read."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def _run(bundle: Path, photos: Path, detail: str, as_json: bool = False) -> tuple[list[str], list[str]]:
    """(stdout lines, stderr lines) of a local run of FRAMES frames (``--frames``) over the photos, looped."""
    said: list[str] = []
    warned: list[str] = []
    settings = RunSettings(bundle=str(bundle), camera=str(photos), split="local", frames=FRAMES, loop=True)
    out = Output(say=said.append, warn=warned.append, detail=detail, json=as_json, summary_every_s=10.0,
                 clock=Ticks())
    stats = asyncio.run(run_stream(settings, out))
    assert stats.frames == FRAMES and stats.dropped == 0  # a folder is no live camera: nothing dropped
    return said, warned


FRAME_LINE = re.compile(r"^#\d+\s+\S+\s+.+split=local\s")
FINAL = f"{FRAMES} frames: 0 dropped (0.0%), 0 answered locally after a host failure; by split: local {FRAMES};"


def test_by_default_a_line_per_split_change_and_a_summary_every_period(mobilenet_bundle: Path, photos_dir: Path) -> None:
    """And, this run having ``--frames``, a line per frame: a person reads a run that ends to its end."""
    said, _ = _run(mobilenet_bundle, photos_dir, DEFAULT)
    frames = [line for line in said if FRAME_LINE.match(line)]
    assert len(frames) == FRAMES
    changes = [line for line in said if re.match(r"^#\d+\s+split ", line)]
    assert changes == ["#0    split local: fixed split (--split, or no calibration to choose with)"]
    summaries = [line for line in said if line.startswith("last 10 s: ")]
    assert len(summaries) == FRAMES // 10  # the clock read at frames 10, 20, 30, 40 (it started at 1)
    assert all("10 answered (1.0 fps), 0 dropped, 0 fell back; total p50 " in line and line.endswith(
        "splits local 100%; host local") for line in summaries), summaries
    assert said[-1].startswith(FINAL)
    progress = [line for line in said if line not in (*frames, *changes, *summaries, said[-1])]
    assert len(progress) == 2 and progress[1].startswith("camera: "), progress  # the board and the camera


def test_verbose_prints_every_frame_with_its_reason(mobilenet_bundle: Path, photos_dir: Path) -> None:
    said, _ = _run(mobilenet_bundle, photos_dir, VERBOSE)
    frames = [line for line in said if FRAME_LINE.match(line)]
    assert len(frames) == FRAMES
    assert all(line.endswith("why: fixed split (--split, or no calibration to choose with)") for line in frames)
    assert len([line for line in said if line.startswith("last 10 s: ")]) == FRAMES // 10


def test_quiet_prints_the_final_summary_alone(mobilenet_bundle: Path, photos_dir: Path) -> None:
    said, warned = _run(mobilenet_bundle, photos_dir, QUIET)
    assert len(said) == 1 and said[0].startswith(FINAL) and warned == []


@pytest.mark.parametrize("detail", [DEFAULT, VERBOSE, QUIET])
def test_json_lines_alone_on_stdout(mobilenet_bundle: Path, photos_dir: Path, detail: str) -> None:
    said, warned = _run(mobilenet_bundle, photos_dir, detail, as_json=True)
    events = [json.loads(line) for line in said]  # every line parses
    kinds = [e["event"] for e in events]
    expected = {
        DEFAULT: ["start", "split_change", *["summary"] * (FRAMES // 10), "final"],
        QUIET: ["final"],
    }.get(detail)
    if detail == VERBOSE:
        assert kinds.count("frame") == FRAMES and kinds[0] == "start" and kinds[-1] == "final"
        assert all(e["reason"] == {"kind": "fixed"} for e in events if e["event"] == "frame")
    else:
        assert kinds == expected
    final = events[-1]
    assert (final["frames"], final["answered"], final["dropped"], final["by_split"]) == (FRAMES, FRAMES, 0, {"local": FRAMES})
    assert final["seconds"] == FRAMES + 1.0 and final["fps"] == pytest.approx(FRAMES / (FRAMES + 1.0), abs=1e-3)
    if detail != QUIET:
        start = events[0]
        assert start["policy"] == "local" and start["host"] is None and "4 images" in start["camera"]
        assert any(line.startswith("camera: ") for line in warned)  # progress goes to stderr


@pytest.mark.parametrize(("camera", "frames", "loop", "each"), [
    ("photos", None, False, True),  # a folder, once: it ends by itself
    ("photos", None, True, False),  # looped: it goes on like a camera
    ("photos", 3, True, True),  # --frames ends it
    ("synthetic:30", None, False, False),  # a stand-in for a live camera
    ("synthetic:30", 3, False, True),
    ("synthetic:0", None, False, False),  # unpaced, still endless
])
def test_a_line_per_frame_by_default_where_the_run_ends_by_itself(
    photos_dir: Path, camera: str, frames: int | None, loop: bool, each: bool,
) -> None:
    """By default a run prints each answer where it ends by itself (a person classifying ten photos
    expects ten answers) and not for a live camera (a service's log); ``--verbose`` prints them for
    any source, ``--quiet`` for none, and ``--json`` only with ``--verbose`` (a program asks for them)."""
    from device_runtime._run import _says_each_frame
    from device_runtime.stream._camera import open_source

    settings = RunSettings(bundle="b/", camera=camera, frames=frames, loop=loop)
    with open_source(str(photos_dir) if camera == "photos" else camera, loop=loop) as source:
        assert _says_each_frame(Output(detail=DEFAULT), settings, source) is each
        assert _says_each_frame(Output(detail=VERBOSE), settings, source) is True
        assert _says_each_frame(Output(detail=QUIET), settings, source) is False
        assert _says_each_frame(Output(detail=DEFAULT, json=True), settings, source) is False
        assert _says_each_frame(Output(detail=VERBOSE, json=True), settings, source) is True


def test_a_video_file_ends_by_itself_paced_or_not(tmp_path: Path) -> None:
    from device_runtime.stream._camera import VideoCapture

    cv2 = pytest.importorskip("cv2")
    path = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10.0, (64, 48))
    for _ in range(3):
        writer.write(np.zeros((48, 64, 3), np.uint8))
    writer.release()
    with VideoCapture(str(path)) as video, VideoCapture(str(path), realtime=True) as paced:
        assert video.ends and paced.ends and paced.live  # replayed as a camera, it still ends


def test_a_folder_prints_each_answer_by_default_and_quiet_silences_it(
    mobilenet_bundle: Path, photos_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``split-device run bundle/ --camera photos/``: one line per photo, its label and split, then the summary."""
    run = ["run", str(mobilenet_bundle), "--camera", str(photos_dir), "--split", "local", "--summary-every", "3600"]
    assert main(run) == 0
    lines = capsys.readouterr().out.splitlines()
    frames = [line for line in lines if FRAME_LINE.match(line)]
    assert [line.split()[1] for line in frames] == sorted(p.name for p in photos_dir.glob("*.png")), lines
    assert lines[-1].startswith(f"{len(frames)} frames: 0 dropped")
    assert main([*run, "--quiet"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith(f"{len(frames)} frames: 0 dropped")


def test_the_cli_flags(mobilenet_bundle: Path, photos_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--json`` and ``--quiet`` from the command line; ``--verbose`` and ``--quiet`` exclude each other.
    A summary period of an hour: these runs take seconds, even on a busy machine."""
    run = ["run", str(mobilenet_bundle), "--camera", str(photos_dir), "--split", "local", "--frames", "6", "--loop",
           "--summary-every", "3600"]
    assert main([*run, "--json"]) == 0
    out = capsys.readouterr().out
    assert [json.loads(line)["event"] for line in out.splitlines()] == ["start", "split_change", "final"]
    assert main([*run, "--quiet"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and out.startswith("6 frames: 0 dropped")
    with pytest.raises(SystemExit) as exited:
        main([*run, "--quiet", "--verbose"])
    assert exited.value.code == 2
    with pytest.raises(SystemExit):
        main([*run, "--summary-every", "0"])
    assert "expected seconds above 0 up to 86400, like 10, got '0'" in capsys.readouterr().err


def test_calibrate_json_is_one_object_on_stdout(mobilenet_bundle: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    root = tmp_path / "bundle"
    shutil.copytree(mobilenet_bundle, root)
    (root / FILENAME).unlink(missing_ok=True)
    assert main(["calibrate", str(root), "--no-host", "--batch", "1,2", "--repeats", "2", "--threads", "1",
                 "--json"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)  # the whole of stdout
    assert summary["calibration"] == str(root / FILENAME) and summary["kept"] == []
    assert (summary["backend"], summary["precision"]) == ("onnx", "float32")
    # Without a host every choice is local, at every rate of both batch sizes.
    assert summary["table"] == {b: [{"split": "local", "lo_bps": 1e5, "hi_bps": None}] for b in ("1", "2")}
    assert "best split by batch size and link rate" in captured.err  # the human summary, aside
