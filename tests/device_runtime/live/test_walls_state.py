"""What the live page server sends, and what it costs (issue 45): a state per cursor and period
whatever the number of pollers, a new page's window capped in bytes, event streams capped, and
a stream whose client stops reading dropped.

12 pollers of ``/state.json`` (0.5 to 1 MB of JSON each, computed for each request) and 4 event
streams took a board from 23 to 3.3 fps. The clock is injected: periods move when the test says.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from dataclasses import replace

import pytest

import device_runtime.live._board_state as board_state
from device_runtime.live import LiveBoard, LiveServer
from device_runtime.live._board_state import FRAMES_SENT, FRAMES_SENT_BYTES
from device_runtime.live._server import LIVE_WALLS, WHOLE_STATE_S
from device_runtime.stream import FrameResult
from tests.device_runtime.live.sockets import GENEROUS_S, Clock, Counted, exchange, wait_for


def poll(port: int, target: str) -> tuple[int, bytes]:
    return exchange(port, f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())


def test_pollers_within_a_period_cost_one_state_per_cursor() -> None:
    clock, source = Clock(), Counted(moving=True)
    with LiveServer(source, "page", clock=clock, walls=replace(LIVE_WALLS, events_hz=4.0)) as server:
        port = server.address[1]
        answers: list[tuple[int, bytes]] = []

        def poller() -> None:
            for target in ("/state.json", "/state.json?since=5") * 3:
                answers.append(poll(port, target))

        pollers = [threading.Thread(target=poller) for _ in range(12)]
        for thread in pollers:
            thread.start()
        for thread in pollers:
            thread.join(GENEROUS_S)
        assert len(answers) == 72 and {status for status, _ in answers} == {200}
        assert source.calls == 2  # one state for new pages, one after cursor 5: not 72
        clock.now += 0.25  # a period later: a cursor's state is asked again, a new page's whole window not yet
        assert json.loads(poll(port, "/state.json?since=5")[1]) == {"since": 5, "padding": ""}
        assert json.loads(poll(port, "/state.json")[1]) == {"since": None, "padding": ""}
        assert source.calls == 3
        clock.now += WHOLE_STATE_S  # a second later: the whole window too
        assert json.loads(poll(port, "/state.json")[1]) == {"since": None, "padding": ""}
        assert source.calls == 4


def test_a_new_page_gets_a_window_capped_in_bytes_then_deltas() -> None:
    board = LiveBoard()
    now = time.monotonic()
    for index in range(3000):  # 50 s at 60 fps, each record over 1 KB of JSON: 3 MB in the last minute
        board.publish(FrameResult(index=index, name=f"frame{index}", label=None, probability=None, split="local",
                                  captured=now - 50.0 + index / 60.0, error="e" * 800))
    with board.serve("127.0.0.1:0") as server:
        port = server.address[1]
        status, body = poll(port, "/state.json")
        frames = json.loads(body)["frames"]
        assert status == 200 and len(body) <= FRAMES_SENT_BYTES + 4096
        assert 0 < len(frames) < FRAMES_SENT and frames[-1]["index"] == 2999  # the newest
        status, body = poll(port, "/state.json?since=2990")
        assert [f["index"] for f in json.loads(body)["frames"]] == list(range(2990, 3000))


def test_a_result_is_made_a_record_once_whatever_the_windows_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new page's window is built each second from up to 600 results: each is made a record (and
    measured as JSON) once, at its first window, not once a window (the GIL it held cost a loaded
    board up to a fifth of its frames under 20 pollers)."""
    made: list[int] = []
    real = board_state._record
    monkeypatch.setattr(board_state, "_record", lambda seq, result: made.append(seq) or real(seq, result))
    board, now = LiveBoard(), time.monotonic()
    for index in range(FRAMES_SENT):
        board.publish(FrameResult(index=index, name=f"frame{index}", label=None, probability=None, split="local",
                                  captured=now - 5.0 + index / 120.0))
    first, cursor = board.state(None)
    assert len(first["frames"]) == FRAMES_SENT and sorted(made) == list(range(FRAMES_SENT))
    for index in range(FRAMES_SENT, FRAMES_SENT + 10):
        board.publish(FrameResult(index=index, name=f"frame{index}", label=None, probability=None, split="local",
                                  captured=now))
    again, _ = board.state(None)
    assert [f["index"] for f in again["frames"]] == list(range(10, FRAMES_SENT + 10))  # the newest 600
    assert len(made) == FRAMES_SENT + 10  # the ten new ones made, the rest as they were
    assert again["frames"][0] == first["frames"][10]
    assert board.state(cursor)[0]["frames"] == again["frames"][-10:] and len(made) == FRAMES_SENT + 10


def test_streams_are_capped_and_one_that_stops_reading_is_dropped() -> None:
    clock, source = Clock(), Counted(padding=1 << 20, moving=True)  # 1 MB an event: a client that does not read fills up fast
    with LiveServer(source, "page", clock=clock, walls=replace(LIVE_WALLS, events_hz=4.0, max_streams=1, stall_timeout=1.0)) as server:
        port = server.address[1]
        stalled = socket.socket()
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect(("127.0.0.1", port))
        stalled.sendall(b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n")  # and never reads
        try:
            wait_for(lambda: source.calls >= 1, "the stream's first event")
            assert poll(port, "/events")[0] == 503  # the one stream allowed is taken

            def a_period_passes() -> bool:
                clock.now += 0.25
                time.sleep(0.02)
                return server.stalled == 1

            wait_for(a_period_passes, "the stalled stream dropped")
            assert server.timed_out == 0
            stalled.settimeout(GENEROUS_S)
            with contextlib.suppress(ConnectionResetError):  # the end (a reset is one too)
                while stalled.recv(1 << 20):  # what it was sent first
                    pass
        finally:
            stalled.close()
        source.padding = ""
        with socket.create_connection(("127.0.0.1", port), timeout=GENEROUS_S) as reader:  # its slot is free again
            reader.sendall(b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
            received = b""
            while b"\n\n" not in received.partition(b"\r\n\r\n")[2]:
                clock.now += 0.25
                received += reader.recv(65536)
            assert received.startswith(b"HTTP/1.1 200 OK\r\n") and b"Content-Type: text/event-stream" in received
            assert b"\r\n\r\nid: " in received
