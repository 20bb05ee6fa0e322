"""The drop forecast as the run goes (issue 43.5): made again from the stage times the stream
measured over its last frames, in the start-up forecast's model, and said against the real drop
share with the stage behind it, in the summary lines, the JSON events and the live page's state.

A field trial's board on a quarter core ran its head 5-10 times slower than calibrated: the
start-up forecast said 34 % would drop and 79 % did. Here the results are made by hand and the
summaries' clock is the test's, so the shares are exact.
"""

from __future__ import annotations

import json
import tracemalloc

import pytest

from device_runtime.bundle import LOCAL
from device_runtime._run import _event_line, drop_forecast
from device_runtime.stream import DropForecast, FrameResult, FrameSource
from device_runtime.stream._reason import TABLE, Reason
from device_runtime.stream._results import DROP_QUEUE_FULL
from device_runtime.stream import _summary as summary_module
from device_runtime.stream._summary import FORECAST_FRAMES, DropWatch, RunEvents
from tests.device_runtime.stream.test_drop_forecast import calibrated

INTERVAL_S = 0.06  # the camera's: 16.7 fps
CUT = "features_14_conv_2"


class Clock:
    """The summaries' clock: moved by the test, one camera frame interval per frame."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Camera(FrameSource):
    """A live camera at one frame every :data:`INTERVAL_S` (it never needs to give a frame here)."""

    live = True
    frame_interval_s = INTERVAL_S


def _answered(index: int, head_ms: float, preprocess_ms: float = 10.0, **fields) -> FrameResult:
    return FrameResult(index=index, name=f"f{index}", label="cat", probability=0.9, split=fields.pop("split", LOCAL),
                       preprocess_ms=preprocess_ms, head_ms=head_ms, total_ms=head_ms + preprocess_ms,
                       reason=Reason(TABLE), **fields)


def _dropped(index: int) -> FrameResult:
    return FrameResult(index=index, name=f"f{index}", label=None, probability=None, split="", dropped=True,
                       drop_reason=DROP_QUEUE_FULL)


def _feed(events: RunEvents, clock: Clock, start: int, cycles: int, answered: int, every: int,
          head_ms: float) -> list[dict]:
    """``cycles`` rounds of ``every`` camera frames of which the first ``answered`` are answered
    (a head of ``head_ms``) and the rest dropped; the events they made."""
    made = []
    for n in range(cycles * every):
        clock.now += INTERVAL_S
        index = start + n
        result = _answered(index, head_ms) if n % every < answered else _dropped(index)
        made.extend(events.frame(result))
    return made


def test_the_forecast_follows_a_head_three_times_slower_than_calibrated() -> None:
    """As calibrated, preprocessing 10 + head 90 ms against a 60 ms frame interval: 40 % dropped,
    at start and while the head keeps that time. The head then takes 270 ms: the forecast follows
    the measured times to 1 - 60/280 (79 %) and names the board's compute behind the drops."""
    start_up = drop_forecast(calibrated(10.0, 90.0), LOCAL, 1, Camera())
    assert start_up == ("this board answers about 10 fps of this 16.7 fps camera; 40 % of frames will be dropped "
                        "(local, batch 1: board compute 100 ms a frame (preprocess 10 + head 90) against a 60 ms "
                        "frame interval, as calibrated)")
    clock = Clock()
    events = RunEvents(every_s=5.0, clock=clock, frame_interval_s=INTERVAL_S)
    made = _feed(events, clock, 0, cycles=20, answered=3, every=5, head_ms=90.0)  # 100 frames, 40 % dropped
    (calibrated_summary,) = [e for e in made if e["event"] == "summary"]
    assert calibrated_summary["forecast"]["drop_share"] == pytest.approx(0.4)
    assert calibrated_summary["drop_share"] == pytest.approx(0.4, abs=0.02)

    made = _feed(events, clock, 100, cycles=14, answered=3, every=14, head_ms=270.0)  # 42 answered, 78.6 % dropped
    summary = [e for e in made if e["event"] == "summary"][-1]
    forecast = summary["forecast"]
    assert forecast["drop_share"] == pytest.approx(1.0 - 60.0 / 280.0, abs=1e-4)  # every frame of its window slow
    assert forecast["bottleneck"] == "board" and forecast["measured_frames"] == FORECAST_FRAMES
    assert forecast["stages_ms"] == {"preprocess": 10.0, "head": 270.0, "link": 0.0, "tail": 0.0}
    assert forecast["answered_fps"] == pytest.approx(1000.0 / 280.0, abs=1e-3) and forecast["camera_fps"] == 16.667
    cause = "board compute 280 ms a frame (preprocess 10 + head 270) against a 60 ms frame interval"
    assert forecast["cause"] == cause
    assert summary["drop_share"] == pytest.approx(11 / 14, abs=0.02)
    assert _event_line(summary).endswith(f"; 79% dropped, 79% forecast from the last 32 answered: {cause}")

    clock.now += 1.0
    final = events.final()  # the run's real share (40 % then 79 %) against the forecast of its last frames
    assert final["drop_share"] == pytest.approx((40 + 11 * 14) / (100 + 14 * 14), abs=1e-4)
    assert final["forecast"]["cause"] == cause
    assert _event_line(final).endswith(f"; 66% dropped, 79% forecast from the last 32 answered: {cause}")
    assert json.loads(json.dumps([summary, final])) == [summary, final]  # the JSON events carry the same fields


@pytest.mark.parametrize(("result", "bottleneck", "cause"), [
    # 100 kB a frame at 8 Mbit/s: 100 ms on the link, whose round trip (in transfer_ms) overlaps the next request's
    (_answered(0, 40.0, 5.0, split=CUT, batch=2, bytes=100_000, rate_bps=8e6, transfer_ms=260.0, tail_ms=20.0,
               where="remote", host="h:1"),
     "link", "the link 100 ms a frame against a 60 ms frame interval"),
    (_answered(0, 20.0, 5.0, split=CUT, bytes=1000, rate_bps=8e6, transfer_ms=3.0, tail_ms=150.0, where="remote",
               host="h:1"),
     "host", "the host's tail 150 ms a frame against a 60 ms frame interval"),
])
def test_the_cause_is_the_slowest_stage_wherever_it_is(result: FrameResult, bottleneck: str, cause: str) -> None:
    watch = DropWatch(INTERVAL_S)
    watch.add(result)
    forecast = watch.fields()
    assert forecast is not None and (forecast["bottleneck"], forecast["cause"]) == (bottleneck, cause)


def test_splits_answering_in_turn_are_forecast_from_their_mean_times() -> None:
    """Half the frames local (200 ms of head), half a cut (40 ms of head, 30 ms on the link): the
    board holds 10 + 120 ms a frame on average, 2.2 frames of 60 ms each."""
    watch = DropWatch(INTERVAL_S)
    for index in range(FORECAST_FRAMES):
        watch.add(_answered(index, 200.0) if index % 2 else _answered(
            index, 40.0, split=CUT, bytes=30_000, rate_bps=8e6, where="remote", host="h:1"))
    forecast = watch.fields()
    assert forecast is not None and forecast["stages_ms"] == {"preprocess": 10.0, "head": 120.0, "link": 15.0,
                                                              "tail": 0.0}
    assert forecast["drop_share"] == pytest.approx(1.0 - 60.0 / 130.0, abs=1e-4)
    assert forecast == {**DropForecast(10.0, 120.0, 15.0, 0.0, 60.0).as_dict(), "measured_frames": FORECAST_FRAMES}


def test_the_window_is_bounded_and_forgets_the_old_times() -> None:
    """Twenty thousand fast frames, then a window's worth of slow ones: the forecast is the slow
    frames' alone, and what the watch holds does not grow with the run."""
    watch = DropWatch(INTERVAL_S)
    for index in range(1000):
        watch.add(_answered(index, 20.0))
    kept = (tracemalloc.Filter(True, summary_module.__file__),)  # what the watch allocates, not the test's own results
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot().filter_traces(kept)
        for index in range(1000, 20_000):
            watch.add(_answered(index, 20.0) if index % 3 else _dropped(index))
        grown = sum(stat.size_diff for stat in tracemalloc.take_snapshot().filter_traces(kept).compare_to(before, "filename"))
    finally:
        tracemalloc.stop()
    assert grown < 16_000, f"the watch grew by {grown} bytes over 19,000 frames"
    fast = watch.fields()
    assert fast is not None and fast["drop_share"] == 0.0 and fast["measured_frames"] == FORECAST_FRAMES
    for index in range(FORECAST_FRAMES):
        watch.add(_answered(20_000 + index, 290.0))
    slow = watch.fields()
    assert slow is not None and slow["stages_ms"]["head"] == 290.0 and slow["drop_share"] == pytest.approx(0.8)
    state = watch.state()
    assert (state["frames"], state["dropped"]) == (20_000 + FORECAST_FRAMES, len(range(1002, 20_000, 3)))
    assert state["forecast"] == slow


def test_without_a_camera_frame_rate_nothing_is_forecast_nor_said() -> None:
    """A folder of images or a video read as fast as the board reads it drops nothing for speed:
    its summaries carry no forecast, and their lines say nothing of one."""
    clock = Clock()
    events = RunEvents(every_s=1.0, clock=clock)
    made = []
    for index in range(30):
        clock.now += INTERVAL_S
        made.extend(events.frame(_answered(index, 290.0)))
    summary = [e for e in made if e["event"] == "summary"][-1]
    assert summary["forecast"] is None and summary["drop_share"] == 0.0
    assert _event_line(summary).endswith("host local")
    assert DropWatch(None).state() == {"frames": 0, "dropped": 0, "drop_share": None, "forecast": None}


def test_a_board_that_keeps_up_says_nothing_of_drops_in_its_lines() -> None:
    clock = Clock()
    events = RunEvents(every_s=1.0, clock=clock, frame_interval_s=INTERVAL_S)
    made = []
    for index in range(30):
        clock.now += INTERVAL_S
        made.extend(events.frame(_answered(index, 30.0)))
    summary = [e for e in made if e["event"] == "summary"][-1]
    assert summary["forecast"]["drop_share"] == 0.0 and summary["forecast"]["cause"] == (
        "board compute 40 ms a frame (preprocess 10 + head 30) against a 60 ms frame interval")
    assert _event_line(summary).endswith("host local")
