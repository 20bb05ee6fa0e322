"""``python -m testbed replay``: the schedule read back from a trace, its alignment with the new run,
the board's command line, and one replay on the kernel link with the real board and host.

Nothing here depends on timing: the schedule is read from records the real writer wrote at known
instants, the alignment is a property of :func:`remaining`, and the end-to-end replay checks
what every replay must do (every step applied and recorded, every frame run on the same input),
not how fast. How closely a replay reproduces its original is measured by bench/replay_fidelity.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from device_runtime import cli as device_cli
from device_runtime.bundle import Bundle
from device_runtime.stream import FrameResult
from device_runtime.stream.trace import LINK_RATE, TraceWriter
from fieldtrial._compare import write_comparison
from splitedge.errors import SplitEdgeError
from testbed import RateSchedule, unavailable_reason
from testbed import __main__ as testbed_main
from testbed._replay import (
    ESTIMATES, LINK_RATES, MEASURED, OWN, RECORD_FILE, RECORDED, TRACE_FILE, board_argv, board_speed, board_times,
    read_trace,
    recorded_link, remaining, replay, replay_source,
)
from testbed._schedule import SET_BY
from tests.conftest import TEST_SPLITS

REASON = unavailable_reason()
needs_namespaces = pytest.mark.skipif(REASON is not None, reason=f"link emulation unavailable: {REASON}")
#: The schedule that shaped the "original" run: it started OFFSET_S after the run did (a testbed
#: starts it at the first frame), and the run went on LINGER_S after it ended.
PRODUCER = "20:2,3:1.5,50:2"
OFFSET_S, LINGER_S = 0.3, 0.45
FPS = 10.0


def run_record(source: str = "synthetic:10", **extra: object) -> dict:
    return {"bundle_id": "b", "policy": "auto", "batch": 1, "calibration": None, "source": source, **extra}


def frame(i: int, captured: float, rate_bps: float | None = 8e6, dropped: bool = False, split: str = "cut",
          head_ms: float = 0.0) -> FrameResult:
    return FrameResult(index=i, name=f"f{i}.png", label=None if dropped else "tram", probability=None, split=split,
                       captured=captured, total_ms=30.0, rate_bps=None if dropped else rate_bps, dropped=dropped,
                       head_ms=head_ms, preprocess_ms=head_ms / 10)


def shaped_run(path: Path, source: str = "synthetic:10", bundle_id: str = "b", split: str = "cut",
               head_ms: float = 0.0) -> RateSchedule:
    """A run of ``bundle_id`` on a link :data:`PRODUCER` shaped, written by the real writer: the
    schedule's ``link_rate`` records at the instants it applied each step, frames of ``split`` at
    :data:`FPS` (their capture times a quarter frame off every step boundary), each head taking
    ``head_ms`` and its preprocessing a tenth of that. Returns the producer."""
    producer = RateSchedule.parse(PRODUCER)
    with TraceWriter(path, run_record(source, bundle_id=bundle_id)) as writer:
        start = time.monotonic()
        boundary = OFFSET_S
        for step in producer.steps:
            writer.link_rate(step.rate_mbit * 1e6, SET_BY, applied=start + boundary)
            boundary += step.duration_s
        for i in range(int((boundary + LINGER_S) * FPS)):
            writer.frame(frame(i, start + (i + 0.25) / FPS, split=split, head_ms=head_ms))
    return producer


def test_the_schedule_read_back_from_a_trace_is_the_one_that_shaped_it(tmp_path: Path) -> None:
    producer = shaped_run(tmp_path / "run.jsonl")
    run, frames, rates = read_trace(tmp_path / "run.jsonl")
    link = recorded_link(frames, rates)
    assert link.rate_from == LINK_RATES
    assert [s.rate_mbit for s in link.schedule.steps] == [s.rate_mbit for s in producer.steps]
    first = rates[0]["t"]  # the schedule's start on the run's clock
    # The first rate held from the run's start (the testbed set it before), the middle steps
    # last as long as they did, the last one until the last frame.
    durations = [s.duration_s for s in link.schedule.steps]
    assert durations[0] == pytest.approx(first + producer.steps[0].duration_s)
    assert durations[1] == pytest.approx(producer.steps[1].duration_s)
    assert sum(durations) == pytest.approx(frames[-1]["t"])
    # Every frame meets the rate the original's frame met at its capture.
    for f in frames:
        assert link.schedule.rate_at(f["t"]) == producer.rate_at(max(f["t"] - first, 0.0)), f["t"]


def test_repeats_instants_and_records_outside_the_run(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with TraceWriter(path, run_record()) as writer:
        start = time.monotonic()
        for at, rate in ((-1.0, 40e6), (-0.5, 10e6), (1.0, 10e6), (2.0, 5e6), (2.0, 7e6), (9.0, 1e6)):
            writer.link_rate(rate, SET_BY, applied=start + at)
        for i in range(30):
            writer.frame(frame(i, start + 0.1 * i + 0.05))
    _, frames, rates = read_trace(path)
    schedule = recorded_link(frames, rates).schedule
    # Before the run: the last rate set holds from t = 0; a repeat is no step; of two at one
    # instant the later holds; a rate set after the last frame changed nothing a frame met.
    assert [s.rate_mbit for s in schedule.steps] == [10.0, 7.0]
    assert [s.duration_s for s in schedule.steps] == pytest.approx([rates[3]["t"], frames[-1]["t"] - rates[3]["t"]])


def test_without_link_rate_records_the_boards_estimates_make_the_schedule(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    estimates = [None, 4e6, 4e6, 9e6, None, 2e6, 2e6, 6e6]  # None: no estimate yet, or a dropped frame
    with TraceWriter(path, run_record()) as writer:
        start = time.monotonic()
        for i, rate in enumerate(estimates):
            writer.frame(frame(i, start + 0.2 * i, rate, dropped=rate is None and i > 0))
    _, frames, rates = read_trace(path)
    link = recorded_link(frames, rates)
    assert link.rate_from == ESTIMATES
    assert [s.rate_mbit for s in link.schedule.steps] == [4.0, 9.0, 2.0, 6.0]
    for f in frames:
        if f.get("rate_bps"):
            assert link.schedule.rate_at(f["t"]) == f["rate_bps"] / 1e6


def test_a_trace_with_no_rate_at_all_cannot_be_replayed(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with TraceWriter(path, run_record()) as writer:
        writer.frame(frame(0, time.monotonic(), None))
    with pytest.raises(SplitEdgeError, match="no link to replay"):
        recorded_link(*read_trace(path)[1:])


def test_what_remains_of_a_schedule_keeps_its_rates_at_their_times() -> None:
    schedule = RateSchedule.parse("20:2,3:1.5,50:2")
    grid = [k * 0.05 + 0.01 for k in range(120)]  # never on a boundary
    for elapsed in (0.0, 0.5, 2.0, 3.49, 5.4):
        rest = remaining(schedule, elapsed)
        assert rest is not None
        assert [rest.rate_at(t) for t in grid if elapsed + t < schedule.duration_s] == \
            [schedule.rate_at(elapsed + t) for t in grid if elapsed + t < schedule.duration_s]
        assert rest.duration_s == pytest.approx(schedule.duration_s - elapsed)
    assert remaining(schedule, 5.5) is None and remaining(schedule, 60.0) is None


def test_the_input_is_the_originals_file_or_folder_else_the_one_given(tmp_path: Path) -> None:
    assert replay_source(run_record(str(tmp_path)), None) == str(tmp_path)
    assert replay_source(run_record(str(tmp_path)), "synthetic:5") == "synthetic:5"
    for camera in ("synthetic:10", "picam", "0"):
        with pytest.raises(SplitEdgeError, match="live camera or synthetic frames.*give --source"):
            replay_source(run_record(camera), None)
    with pytest.raises(SplitEdgeError, match="is not here.*give --source"):
        replay_source(run_record(str(tmp_path / "gone.mp4")), None)


def test_the_boards_command_line_is_the_originals_stream_and_parses(tmp_path: Path) -> None:
    record = run_record("clip.mp4", batch=2, queue=3, drop="newest", realtime=True, threads=1, transmit="float32")
    argv = board_argv(record, 40, "bundle", "local", "clip.mp4", "10.0.0.2:7767", tmp_path / "r.jsonl")
    args = device_cli.build_parser().parse_args(argv)
    assert (args.bundle, args.camera, args.split, args.frames, args.batch, args.queue, args.drop, args.realtime) == (
        "bundle", "clip.mp4", "local", 40, 2, 3, "newest", True)
    assert (args.threads, args.transmit) == (1, "float32")  # the trial's runtime, where its trace says
    assert args.trace == str(tmp_path / "r.jsonl") and not args.loop
    assert device_cli.build_parser().parse_args(board_argv(run_record("clip.mp4"), 4, "b", "auto", "clip.mp4", "h:1",
                                                           tmp_path / "r.jsonl")).threads is None
    folder = board_argv(run_record(str(tmp_path)), 9, "bundle", "auto", str(tmp_path), "h:1", tmp_path / "r.jsonl")
    assert device_cli.build_parser().parse_args(folder).loop  # a folder's images again, up to --frames


def test_the_trials_bundle_decides_with_the_trials_head_times_another_with_its_own(tmp_path: Path) -> None:
    """Recorded by default where the bundle is the trial's and the trace has them; measured when
    asked, for another bundle (saying so) and for a trace without them; nothing for a fixed split."""
    trial = run_record(schema="splitedge.trace/5")
    assert board_times(trial, True, "b", "auto") == (RECORDED, board_times(trial, True, "b", "auto", RECORDED)[1])
    assert "the trial's head times" in board_times(trial, True, "b", "auto")[1]
    assert board_times(trial, True, "b", "auto", MEASURED)[0] == MEASURED
    times, why = board_times(trial, True, "other-123", "auto")
    assert times == MEASURED and "another bundle (b, not other-123)" in why and "times its own heads" in why
    times, why = board_times({**trial, "schema": "splitedge.trace/4"}, False, "b", "auto")
    assert times == MEASURED and "no head times (trace schema 'splitedge.trace/4'" in why
    assert board_times(trial, True, "b", "cut")[0] is None
    for run, recorded, bundle, policy in ((trial, True, "other", "auto"), (trial, False, "b", "auto"),
                                          (trial, True, "b", "cut")):
        with pytest.raises(SplitEdgeError, match="board-times recorded"):
            board_times(run, recorded, bundle, policy, RECORDED)
    argv = board_argv(trial, 9, "bundle", "auto", "clip.mp4", "h:1", tmp_path / "r.jsonl", tmp_path / "trial.jsonl")
    assert device_cli.build_parser().parse_args(argv).head_times == str(tmp_path / "trial.jsonl")
    assert device_cli.build_parser().parse_args(argv[:-2]).head_times is None


def test_the_trials_bundle_runs_at_the_trials_boards_speed_another_at_its_own(tmp_path: Path) -> None:
    """Held to the trial's stage times by default where the bundle is the trial's, whatever the
    policy; at its own speed when asked and for another bundle (saying so)."""
    trial = run_record()
    assert board_speed(trial, "b") == (RECORDED, board_speed(trial, "b", RECORDED)[1])
    assert "held to the time it took on the trial's board" in board_speed(trial, "b")[1]
    assert board_speed(trial, "b", OWN)[0] == OWN
    speed, why = board_speed(trial, "other-123")
    assert speed == OWN and "another bundle (b, not other-123)" in why
    with pytest.raises(SplitEdgeError, match="--board-speed recorded: the trial ran another bundle"):
        board_speed(trial, "other-123", RECORDED)
    argv = board_argv(trial, 9, "bundle", "cut", "clip.mp4", "h:1", tmp_path / "r.jsonl", None, tmp_path / "t.jsonl")
    args = device_cli.build_parser().parse_args(argv)
    assert (args.pace, args.head_times) == (str(tmp_path / "t.jsonl"), None)
    assert device_cli.build_parser().parse_args(argv[:-2]).pace is None


def test_replay_needs_a_trace() -> None:
    assert testbed_main.main(["replay", "/nonexistent/run.jsonl", "--bundle", "b"]) == 2


@needs_namespaces
def test_a_replay_applies_every_step_and_runs_every_frame_on_the_same_input(
    tmp_path: Path, mobilenet_bundle: Path, photos_dir: Path,
) -> None:
    """The real board and host over the kernel link: every step of the original's link applied and
    recorded in the new trace, in order; every frame of the original run again on the same
    images, each stage held to the original's time for it (its board took 40 ms a head); and the
    two traces compared by ``report``."""
    original = tmp_path / "original.jsonl"
    producer = shaped_run(original, source=str(photos_dir), bundle_id=Bundle.load(mobilenet_bundle, roles=()).id,
                          split=TEST_SPLITS[-1], head_ms=40.0)
    record = replay(original, mobilenet_bundle, tmp_path / "replay", policy=TEST_SPLITS[-1])
    assert record["rate_from"] == LINK_RATES and "not in the trace" in record["rtt"]
    assert record["board_speed"] == RECORDED and "--pace" in record["board_argv"]
    assert record["source"] == str(photos_dir)  # the original's folder, found again
    _, frames, rates = read_trace(tmp_path / "replay" / TRACE_FILE)
    # From the step in force when the new run started (the first, unless its start took seconds)
    # every step, in order, each recorded as the replay's.
    applied, steps = [r["rate_bps"] / 1e6 for r in rates], [s.rate_mbit for s in producer.steps]
    assert applied and applied == steps[len(steps) - len(applied):]
    assert all(r["type"] == LINK_RATE and "original.jsonl" in r["set_by"] for r in rates)
    _, original_frames, _ = read_trace(original)
    assert [f["index"] for f in frames] == [f["index"] for f in original_frames]
    images = sorted(p.name for p in photos_dir.glob("*.png"))
    names = [Path(f["name"]).name for f in frames]
    assert set(names) == set(images) and all(names[i] == names[i % len(images)] for i in range(len(names)))
    assert all(f["split"] == TEST_SPLITS[-1] and not f["dropped"] for f in frames)
    assert all(f["head_ms"] >= 40.0 and f["preprocess_ms"] >= 4.0 for f in frames)  # the original board's times
    assert json.loads((tmp_path / "replay" / RECORD_FILE).read_text()) == record
    compared = write_comparison([original, tmp_path / "replay" / TRACE_FILE], tmp_path / "compare")
    assert compared["against_first"][0]["answered_in_both"] == len(frames)
    assert (tmp_path / "compare" / "report.html").is_file()
