"""The board's live page says the run's drops against their forecast from the stage times measured,
and the stage behind them (issue 43.5), as the summaries do: the state the page reads carries the
run's :class:`~device_runtime.stream._summary.DropWatch` state, and the page shows it as text."""

from __future__ import annotations

import json
import time
from typing import Any

from device_runtime.bundle import LOCAL
from device_runtime.live import LiveBoard
from device_runtime.stream import FrameResult, RunEvents
from device_runtime.stream._results import DROP_QUEUE_FULL
from tests.device_runtime.live.browser import browser, read, until  # noqa: F401 (browser: a fixture)

SHOWN = {"forecast": "forecast", "bottleneck": "bottleneck", "index": "index"}


def _result(index: int, dropped: bool = False) -> FrameResult:
    if dropped:
        return FrameResult(index=index, name=f"f{index}", label=None, probability=None, split="", dropped=True,
                           drop_reason=DROP_QUEUE_FULL, captured=time.monotonic())
    return FrameResult(index=index, name=f"f{index}", label="cat", probability=0.9, split=LOCAL, preprocess_ms=12.0,
                       head_ms=200.0, total_ms=212.0, captured=time.monotonic())


def _board_of_a_run(frames: int) -> tuple[LiveBoard, RunEvents]:
    """A live board following a run's drops (as ``split-device run --live`` wires it) over a 10 fps
    camera, fed ``frames`` results of which one in two is answered, in 212 ms."""
    board, events = LiveBoard(), RunEvents(every_s=3600.0, frame_interval_s=0.1)
    board.drops(events.drops.state)
    for index in range(frames):
        result = _result(index, dropped=index % 2 == 1)
        events.frame(result)
        board.publish(result)
    return board, events


def test_the_state_carries_the_drops_so_far_and_their_forecast() -> None:
    assert LiveBoard().state(None)[0]["drops"] is None  # a board no run told of its drops
    board, events = _board_of_a_run(20)
    state, _ = board.state(None)
    drops = json.loads(json.dumps(state))["drops"]  # strict JSON, as the page gets it
    assert (drops["frames"], drops["dropped"], drops["drop_share"]) == (20, 10, 0.5)
    forecast = drops["forecast"]
    assert forecast["drop_share"] == round(1.0 - 100.0 / 212.0, 4) and forecast["measured_frames"] == 10
    assert forecast["cause"] == "board compute 212 ms a frame (preprocess 12 + head 200) against a 100 ms frame interval"
    assert forecast == events.final()["forecast"]  # the summaries' fields, the same


def test_the_page_shows_the_forecast_and_its_cause(browser: Any) -> None:
    board, _ = _board_of_a_run(20)
    with board.serve("127.0.0.1:0") as server:
        browser.get(server.url)
        until(browser, lambda d: read(d, SHOWN)["index"].startswith("#"), "an answered frame")
        shown = until(browser, lambda d: (lambda s: s if s["forecast"] != "—" else None)(read(d, SHOWN)), "the forecast")
    assert shown["forecast"] == "53 % forecast from the last 10 answered; 50.0 % dropped in the run so far"
    assert shown["bottleneck"] == "board compute 212 ms a frame (preprocess 12 + head 200) against a 100 ms frame interval"


def test_the_page_shows_a_cause_as_text_never_as_markup(browser: Any) -> None:
    """Whatever the state says is text on the page: a cause holding markup is shown, not run."""
    board = LiveBoard()
    markup = "<img src=x onerror=\"document.title='owned'\">"
    board.drops(lambda: {"frames": 4, "dropped": 3, "drop_share": 0.75, "forecast": {
        "drop_share": 0.7, "measured_frames": 1, "cause": markup}})
    with board.serve("127.0.0.1:0") as server:
        browser.get(server.url)
        until(browser, lambda d: read(d, SHOWN)["bottleneck"] == markup, "the cause")
        assert browser.execute_script("return document.querySelectorAll('#bottleneck *').length") == 0
        assert browser.title != "owned"
