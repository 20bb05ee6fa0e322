"""The host's live page with a thousand boards connected (issue 45): it lists the boards most
recently heard from, says how many there are, and reads the host at most once a period however
many pages and streams ask (the whole list, read for every poll, raised infer p99 8.6x)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from host_runtime._limits import Activity
from host_runtime._live import BOARDS_SHOWN, STATE_EVERY_S, HostLive
from tests.device_runtime.live.sockets import Clock


class _Stats:
    def __init__(self) -> None:
        self.reads = 0

    def as_dict(self) -> dict:
        self.reads += 1
        return {"errors": {"deadline_exceeded": 0, "overloaded": 0}, "batch_size": {"count": 0, "sum": 0},
                "queue_depth": 0, "in_flight": 0, "padded_samples": 0, "host_seconds": {}, "compute_seconds": {},
                "queue_seconds": {}}


def _host(boards: int) -> SimpleNamespace:
    connections = [SimpleNamespace(transport=None, address=f"board{n}", splits={"s": 1}, in_flight=0,
                                   activity=Activity(last_read=float(n), opened=0.0)) for n in range(boards)]
    return SimpleNamespace(stats=_Stats(), clock=lambda: 2000.0, connections=connections,
                           registry=SimpleNamespace(device="cpu"))


def test_a_thousand_boards_are_counted_the_most_recent_listed_and_read_once_a_period() -> None:
    clock, host = Clock(), _host(1000)
    live = HostLive(host, clock=clock)
    state, cursor = live.state(None)
    assert state["connections"] == 1000 and len(state["boards"]) == BOARDS_SHOWN
    assert {b["address"] for b in state["boards"]} == {f"board{n}" for n in range(1000 - BOARDS_SHOWN, 1000)}
    assert len(json.dumps(state)) < 200 * BOARDS_SHOWN
    for since in (None, 0, cursor, 10**6):  # pages and streams at any cursor, within the period: the same state
        assert live.state(since) == (state, cursor)
    assert host.stats.reads == 1
    clock.now += STATE_EVERY_S * 0.99
    assert live.state(cursor) == (state, cursor) and host.stats.reads == 1
    clock.now += STATE_EVERY_S * 0.02
    assert live.state(cursor)[1] == cursor + 1 and host.stats.reads == 2
