"""The live page server and what the board keeps for it, over real sockets on 127.0.0.1 (no browser).

Bounded everywhere: the rings keep what they hold however long a run lasts, a page that
reconnects gets only what it missed, pictures are encoded at most five times a second whatever
the pages ask, and more event streams than allowed are refused.
"""

from __future__ import annotations

import http.client
import json
import time
from pathlib import Path

import numpy as np
import pytest

from device_runtime.live import LiveBoard, LiveServer, live_token, parse_live_address
from device_runtime.live._board_state import FRAMES_SENT, RESULTS_KEPT
from device_runtime.live._ring import Ring
from device_runtime.live._server import MAX_STREAMS
from device_runtime.stream import Frame, FrameResult, FrameSource
from splitedge import SplitEdgeError


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Frames(FrameSource):
    def __init__(self, count: int) -> None:
        self.count = count

    def __iter__(self):
        for index in range(self.count):
            image = np.full((48, 64, 3), index, dtype=np.uint8)
            yield Frame(index, f"frame{index}", image, captured=float(index))


def _result(index: int, dropped: bool = False, captured: float | None = None) -> FrameResult:
    return FrameResult(index=index, name=f"frame{index}", label=None if dropped else f"label{index}",
                       probability=None if dropped else 0.5, split="" if dropped else "local",
                       captured=float(index) if captured is None else captured, dropped=dropped,
                       rate_bps=float("inf") if index % 2 else 1e6)


def test_addresses_bind_this_machine_unless_given() -> None:
    assert parse_live_address("8080") == ("127.0.0.1", 8080)
    assert parse_live_address("0.0.0.0:0") == ("0.0.0.0", 0)
    assert parse_live_address("[::1]:9000") == ("::1", 9000)
    for bad in ("", "http", "70000", ":80", "host:-1"):
        with pytest.raises(SplitEdgeError, match=r"\[ADDRESS:\]PORT"):
            parse_live_address(bad)


def test_the_token_is_the_keys_and_nobody_elses() -> None:
    token = live_token(b"a" * 32)
    assert len(token) == 64 and token == live_token(b"a" * 32) and token != live_token(b"b" * 32)
    assert b"a" * 32 not in token.encode()


def test_a_ring_keeps_its_capacity_and_reads_from_a_cursor() -> None:
    ring: Ring[int] = Ring(4)
    for n in range(10):
        ring.add(n)
    assert ring.since(None) == ([6, 7, 8, 9], 10)
    assert ring.since(8) == ([8, 9], 10)
    assert ring.since(2) == ([6, 7, 8, 9], 10)  # what was overwritten is gone
    assert ring.since(10) == ([], 10)
    assert ring.since(50) == ([6, 7, 8, 9], 10)  # a cursor from before a restart reads all that is kept


def test_the_board_keeps_a_bounded_history_and_sends_a_capped_window_of_it() -> None:
    clock = _Clock()
    board = LiveBoard(clock=clock)
    for index in range(RESULTS_KEPT + 100):  # 100 frames a second
        board.publish(_result(index, dropped=index % 7 == 3, captured=index / 100))
    clock.now = (RESULTS_KEPT + 100) / 100
    kept, cursor = board._results.since(None)
    assert cursor == RESULTS_KEPT + 100 and len(kept) == RESULTS_KEPT and kept[0].index == 100
    state, cursor = board.state(None)
    assert cursor == RESULTS_KEPT + 100 and len(state["frames"]) == FRAMES_SENT  # the newest, not all kept
    assert [f["seq"] for f in state["frames"]] == list(range(cursor - FRAMES_SENT, cursor))
    json.dumps(state, allow_nan=False)  # no infinite rate, as the page needs
    later, _ = board.state(cursor - 2)
    assert [f["index"] for f in later["frames"]] == [RESULTS_KEPT + 98, RESULTS_KEPT + 99]
    assert len(board.state(0)[0]["frames"]) == FRAMES_SENT  # a poll from an old cursor: capped as well
    clock.now += 55.0  # a new page gets the last minute only
    state, _ = board.state(None)
    assert len(state["frames"]) < FRAMES_SENT
    assert state["frames"][0]["t"] >= clock.now - 60.0 > state["frames"][0]["t"] - 0.011


def test_pictures_are_encoded_at_most_five_times_a_second_and_only_of_answered_frames() -> None:
    pytest.importorskip("cv2", reason="pictures are encoded by OpenCV (the camera extra)")
    clock = _Clock()
    board = LiveBoard(clock=clock)
    frames = iter(board.watch(_Frames(20)))
    assert board.picture() is None
    for _ in range(3):
        next(frames)
    board.publish(_result(0))
    board.publish(_result(1, dropped=True))
    jpeg, headers = board.picture()
    assert headers == {"X-Frame-Index": "0"} and jpeg[:2] == b"\xff\xd8"
    board.publish(_result(2))
    assert board.picture()[1] == {"X-Frame-Index": "0"}  # asked again at once: the same picture
    clock.now += 0.2
    assert board.picture()[1] == {"X-Frame-Index": "2"}
    for _ in range(15):  # a camera far faster than the board: frames 3..17 captured, 3..16 dropped
        next(frames)
    for index in range(3, 17):
        board.publish(_result(index, dropped=True))
    board.publish(_result(17))
    clock.now += 0.2
    assert board.picture()[1] == {"X-Frame-Index": "17"}
    assert board._pending == {}  # every frame's result came: none is held


def _get(port: int, path: str, headers: dict[str, str] | None = None) -> http.client.HTTPResponse:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("GET", path, headers=headers or {})
    return connection.getresponse()


def _event(response: http.client.HTTPResponse) -> tuple[int, dict]:
    lines = []
    while (line := response.fp.readline().decode().rstrip("\n")) != "":
        lines.append(line)
    fields = dict(line.split(": ", 1) for line in lines)
    return int(fields["id"]), json.loads(fields["data"])


def test_events_resume_from_the_last_id_and_streams_are_bounded() -> None:
    board = LiveBoard()
    for index in range(5):
        board.publish(_result(index, captured=time.monotonic()))
    with board.serve("127.0.0.1:0") as server:
        port = server.address[1]
        page = _get(port, "/")
        assert page.status == 200 and "connect-src 'self'" in page.headers["Content-Security-Policy"]
        assert b"<canvas id=rate-chart>" in page.read()
        first = _get(port, "/events")
        assert first.headers["Content-Type"] == "text/event-stream"
        cursor, state = _event(first)
        assert cursor == 5 and [f["index"] for f in state["frames"]] == [0, 1, 2, 3, 4]
        board.publish(_result(5))
        cursor, state = _event(first)
        assert cursor == 6 and [f["index"] for f in state["frames"]] == [5]
        again = _get(port, "/events", {"Last-Event-ID": "4"})  # a page that reconnects
        assert [f["index"] for f in _event(again)[1]["frames"]] == [4, 5]
        others = [_get(port, "/events") for _ in range(MAX_STREAMS - 2)]
        assert all(o.status == 200 for o in others)
        assert _get(port, "/events").status == 503
        for response in (first, again, *others):
            response.close()
        assert _get(port, "/frame.jpg").status == 204  # no frame watched
        assert _get(port, "/nothing").status == 404


def test_a_port_in_use_is_one_line(tmp_path: Path) -> None:
    with LiveServer(LiveBoard(), "page", "127.0.0.1", 0) as taken:
        with pytest.raises(SplitEdgeError, match="cannot listen there"):
            LiveServer(LiveBoard(), "page", "127.0.0.1", taken.address[1])
