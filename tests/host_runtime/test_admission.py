"""What the host refuses, and when: a full queue is ``overloaded`` at once and the host
recovers; a deadline that cannot be met is refused at once, one that passes in the queue is
answered without running; a connection past its in-flight limit is not read."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from device_runtime.bundle import Bundle
from device_runtime.wire._protocol import encode_bytes
from host_runtime._batcher import BatchConfig
from tests.conftest import TEST_SPLITS, start_host
from tests.host_runtime.helpers import Held, cut, infer, run_with_client, unbatched
from tests.host_runtime.test_server import raw_connection, read_reply

EARLY, LATE = TEST_SPLITS


@pytest.fixture(scope="module")
def bundle(mobilenet_bundle) -> Bundle:
    return Bundle.load(mobilenet_bundle)


def infer_frame(bundle: Bundle, request_id: int, split_id: str, tensor: np.ndarray, **fields) -> bytes:
    return encode_bytes({"op": "infer", "id": request_id, "bundle": bundle.id, "split": split_id, **fields}, tensor)


def test_flood_is_answered_overloaded_at_once_and_the_host_recovers(mobilenet_bundle, bundle) -> None:
    """64 requests in one write to a host that holds 2 samples in its queue: most are refused
    with ``overloaded``, every one is answered, those that ran are right, and afterwards the
    same host serves every request again."""
    tensor = cut(bundle, LATE, 1)
    (expected,) = unbatched(bundle, LATE, [tensor])
    for host in start_host([mobilenet_bundle], workers=1, batching=BatchConfig(max_batch=1, max_queue=2)):
        with raw_connection(host) as sock:
            sock.sendall(b"".join(infer_frame(bundle, i, LATE, tensor) for i in range(64)))
            replies = [read_reply(sock) for _ in range(64)]
            overloaded = [r for r in replies if not r["ok"]]
            assert {r["error"]["code"] for r in overloaded} == {"overloaded"}
            assert len(overloaded) >= 32 and "host queue is full" in overloaded[0]["error"]["message"]
            ran = [r for r in replies if r["ok"]]
            assert ran, "the queue's own requests still run"
            for reply in ran:
                np.testing.assert_allclose(reply["tensor"], expected, atol=1e-5, rtol=0)
            assert sorted(r["id"] for r in replies) == list(range(64))
            # Load gone: requests one after another all succeed, on the same connection.
            for i in range(100, 105):
                sock.sendall(infer_frame(bundle, i, LATE, tensor))
                assert read_reply(sock)["ok"] is True
        stats = host.server.stats.as_dict()
        assert stats["errors"]["overloaded"] == len(overloaded)
        assert stats["queue_depth"] == 0 and stats["in_flight"] == 0


def test_requests_that_could_never_run_are_refused(mobilenet_bundle, bundle) -> None:
    for host in start_host([mobilenet_bundle], batching=BatchConfig(max_queue=4)):
        with raw_connection(host) as sock:
            sock.sendall(infer_frame(bundle, 1, LATE, cut(bundle, LATE, 0)))
            reply = read_reply(sock)
            assert reply["error"]["code"] == "bad_request" and "at least one sample" in reply["error"]["message"]
            sock.sendall(infer_frame(bundle, 2, LATE, cut(bundle, LATE, 5)))
            reply = read_reply(sock)
            assert reply["error"]["code"] == "overloaded" and "can never fit" in reply["error"]["message"]
            sock.sendall(infer_frame(bundle, 3, LATE, cut(bundle, LATE, 4)))  # exactly the queue: it runs
            assert read_reply(sock)["batch"] == 4


def test_deadline_that_cannot_be_met_is_refused_at_once(mobilenet_bundle, bundle) -> None:
    """Twenty requests queued on one worker, then one with 5 ms to live: the tail's measured
    time per sample says it cannot finish, so it is answered before the queue ahead of it."""
    tensor = cut(bundle, LATE, 1)
    for host in start_host([mobilenet_bundle], workers=1, batching=BatchConfig(max_batch=1)):
        with raw_connection(host) as sock:
            sock.sendall(infer_frame(bundle, 0, LATE, tensor))
            assert read_reply(sock)["ok"]  # the tail has run once: it has a time per sample now
            backlog = b"".join(infer_frame(bundle, i, LATE, tensor) for i in range(1, 21))
            sock.sendall(backlog + infer_frame(bundle, 99, LATE, tensor, deadline_ms=5))
            order = [read_reply(sock) for _ in range(21)]
            late = next(i for i, r in enumerate(order) if r["id"] == 99)
            assert order[late]["error"]["code"] == "deadline_exceeded"
            assert "deadline cannot be met" in order[late]["error"]["message"]
            assert late < 10, f"refused only after {late} of the 20 requests ahead of it had run"
            assert all(r["ok"] for r in order if r["id"] != 99)
            # A budget already spent, and one that is not a number.
            sock.sendall(infer_frame(bundle, 100, LATE, tensor, deadline_ms=0))
            assert read_reply(sock)["error"]["code"] == "deadline_exceeded"
            sock.sendall(infer_frame(bundle, 101, LATE, tensor, deadline_ms="soon"))
            reply = read_reply(sock)
            assert reply["error"]["code"] == "bad_request" and "deadline_ms must be a number" in reply["error"]["message"]


def test_a_deadline_is_weighed_against_the_board_s_own_alternative(mobilenet_bundle, bundle) -> None:
    """Twenty requests queued on one worker, then two with 5 ms to live: one whose board would take
    a minute itself is kept and answered (late, but sooner than the board's own answer: issue 43's
    board ran its full model for 300-600 ms after a refusal for 1.5 ms); one whose board would
    answer in 1 ms is refused at once, as a request without an alternative is."""
    tensor = cut(bundle, LATE, 1)
    (expected,) = unbatched(bundle, LATE, [tensor])
    for host in start_host([mobilenet_bundle], workers=1, batching=BatchConfig(max_batch=1)):
        with raw_connection(host) as sock:
            sock.sendall(infer_frame(bundle, 0, LATE, tensor))
            assert read_reply(sock)["ok"]  # the tail has run once: it has a time per sample now
            backlog = b"".join(infer_frame(bundle, i, LATE, tensor) for i in range(1, 21))
            sock.sendall(backlog + infer_frame(bundle, 98, LATE, tensor, deadline_ms=5, alternative="local",
                                               alternative_ms=60_000.0)
                         + infer_frame(bundle, 99, LATE, tensor, deadline_ms=5, alternative="local", alternative_ms=1.0))
            replies = {r["id"]: r for r in (read_reply(sock) for _ in range(22))}
            assert replies[98]["ok"], replies[98]
            np.testing.assert_allclose(replies[98]["tensor"], expected, atol=1e-5, rtol=0)
            assert replies[99]["error"]["code"] == "deadline_exceeded"
            assert "deadline cannot be met" in replies[99]["error"]["message"]


@pytest.mark.parametrize("alternative_ms, says", [
    (float("nan"), "expected a finite number"), (-1.0, "expected a finite number >= 0"),
    (1e12, "at most 60000 ms"), ("soon", "expected a number"),
])
def test_a_forged_alternative_is_refused_in_one_line(mobilenet_bundle, bundle, alternative_ms, says) -> None:
    """A board's alternative keeps a host working past a deadline: one that is no time, or claims
    hours (to hold the queue), is a ``bad_request`` naming the field, and the connection serves on."""
    tensor = cut(bundle, LATE, 1)
    for host in start_host([mobilenet_bundle], workers=1):
        with raw_connection(host) as sock:
            sock.sendall(infer_frame(bundle, 1, LATE, tensor, deadline_ms=50, alternative_ms=alternative_ms))
            reply = read_reply(sock)
            assert reply["error"]["code"] == "bad_request", reply
            assert "infer.alternative_ms" in reply["error"]["message"] and says in reply["error"]["message"]
            sock.sendall(infer_frame(bundle, 2, LATE, tensor))
            assert read_reply(sock)["ok"]


def test_deadline_passing_in_the_queue_is_answered_then_without_running(mobilenet_bundle, bundle) -> None:
    """A 64-sample batch holds the only worker; a request for another tail (no time estimate
    yet, so admitted) has 40 ms: it is answered ``deadline_exceeded`` while the big batch still
    runs, and its tail never runs."""
    big = cut(bundle, LATE, 64)
    for host in start_host([mobilenet_bundle], workers=1):
        registry = host.server.registry
        held = registry.tails[bundle.id, LATE] = Held(registry.tails[bundle.id, LATE])
        with raw_connection(host) as sock:
            sock.sendall(infer_frame(bundle, 1, LATE, big))
            assert held.started.wait(30)  # the big batch has the worker
            sent = time.perf_counter()
            sock.sendall(infer_frame(bundle, 2, EARLY, cut(bundle, EARLY, 1), deadline_ms=40))
            first = read_reply(sock)
            waited_ms = (time.perf_counter() - sent) * 1000
            held.go.set()
            second = read_reply(sock)
        assert first["id"] == 2 and first["error"]["code"] == "deadline_exceeded"
        assert "deadline passed after" in first["error"]["message"]
        assert waited_ms >= 39  # its 40 ms, less a timer's hair
        assert second["id"] == 1 and second["ok"] and second["batch"] == 64
        stats = host.server.stats.as_dict()
        assert f"{bundle.id}/{EARLY}" not in stats["compute_seconds"]  # never ran
        assert stats["errors"]["deadline_exceeded"] == 1


def test_each_deadline_in_a_queue_is_kept_whatever_order_they_come_in(mobilenet_bundle, bundle) -> None:
    """The host keeps one timer per tail, for the soonest deadline queued: a request that comes
    later with a sooner deadline (80 ms behind one of 5 s) is refused at its own, the next one
    (160 ms) at its own after that, and the 5 s request, still queued, runs once the worker is free."""
    for host in start_host([mobilenet_bundle], workers=1):
        registry = host.server.registry
        held = registry.tails[bundle.id, LATE] = Held(registry.tails[bundle.id, LATE])
        with raw_connection(host) as sock:
            sock.sendall(infer_frame(bundle, 1, LATE, cut(bundle, LATE, 1)))
            assert held.started.wait(30)  # the only worker is taken until the test lets it go
            sent = time.perf_counter()
            for request_id, deadline_ms in ((2, 5000), (3, 80), (4, 160)):
                sock.sendall(infer_frame(bundle, request_id, EARLY, cut(bundle, EARLY, 1), deadline_ms=deadline_ms))
            refused = []
            for _ in range(2):
                refused.append((read_reply(sock), (time.perf_counter() - sent) * 1000))
            held.go.set()
            rest = sorted((read_reply(sock) for _ in range(2)), key=lambda reply: reply["id"])
        assert [reply["id"] for reply, _ in refused] == [3, 4]
        assert all(reply["error"]["code"] == "deadline_exceeded" for reply, _ in refused)
        assert refused[0][1] >= 79 and refused[1][1] >= 159  # each at its own deadline, less a timer's hair
        assert [reply["id"] for reply in rest] == [1, 2] and all(reply["ok"] for reply in rest)
        assert host.server.stats.as_dict()["errors"]["deadline_exceeded"] == 2


def test_a_free_worker_takes_the_tail_whose_oldest_request_has_waited_longest(mobilenet_bundle, bundle) -> None:
    """Batches go oldest request first across tails, not a turn per tail: behind a held worker,
    requests 2 and 3 for one tail, 4 for the other and 5 for the first run in the order they came."""
    from tests.host_runtime.test_walls import eventually

    for host in start_host([mobilenet_bundle], workers=1, batching=BatchConfig(max_batch=1)):
        registry = host.server.registry
        held = registry.tails[bundle.id, LATE] = Held(registry.tails[bundle.id, LATE])
        with raw_connection(host) as sock:
            sock.sendall(infer_frame(bundle, 1, LATE, cut(bundle, LATE, 1)))
            assert held.started.wait(30)  # the only worker is taken until the test lets it go
            for request_id, split in ((2, EARLY), (3, EARLY), (4, LATE), (5, EARLY)):
                sock.sendall(infer_frame(bundle, request_id, split, cut(bundle, split, 1)))
            assert eventually(host, lambda: host.server.batcher.queued, lambda n: n == 4) == 4
            held.go.set()
            replies = [read_reply(sock) for _ in range(5)]  # one worker: replies in the order batches ran
        assert [reply["id"] for reply in replies] == [1, 2, 3, 4, 5] and all(reply["ok"] for reply in replies)


def test_a_worker_that_ends_a_batch_takes_the_next_without_waiting_for_the_loop(mobilenet_bundle, bundle) -> None:
    """With requests queued, the worker goes on to the next batch itself: requests 2 and 3 run
    while the host's loop is held busy, before it could have handed the worker anything."""
    import threading

    from tests.host_runtime.test_walls import eventually

    class Timed(Held):
        def __init__(self, tail) -> None:
            super().__init__(tail)
            self.starts: list[float] = []

        def run(self, x: np.ndarray) -> np.ndarray:
            self.starts.append(time.perf_counter())
            return super().run(x)

    for host in start_host([mobilenet_bundle], workers=1, batching=BatchConfig(max_batch=1)):
        registry = host.server.registry
        timed = registry.tails[bundle.id, LATE] = Timed(registry.tails[bundle.id, LATE])
        busy, freed = threading.Event(), []

        async def hold_the_loop() -> None:
            busy.set()
            time.sleep(1.0)  # on the loop itself: nothing else of the host's runs meanwhile
            freed.append(time.perf_counter())

        with raw_connection(host) as sock:
            for request_id in (1, 2, 3):
                sock.sendall(infer_frame(bundle, request_id, LATE, cut(bundle, LATE, 1, seed=request_id)))
            assert timed.started.wait(30)
            assert eventually(host, lambda: host.server.batcher.queued, lambda n: n == 2) == 2
            holder = threading.Thread(target=host.call, args=(hold_the_loop,))
            holder.start()
            assert busy.wait(10)
            timed.go.set()
            holder.join(30)
            replies = [read_reply(sock) for _ in range(3)]
        assert len(timed.starts) == 3 and timed.starts[2] < freed[0]  # 2 and 3 ran while the loop was held
        assert [reply["id"] for reply in replies] == [1, 2, 3] and all(reply["ok"] for reply in replies)


@pytest.mark.parametrize("share, sizes", [(True, [1, 2, 2, 3, 3, 3]), (False, [6] * 6)])
def test_a_worker_takes_its_share_of_the_queue_and_leaves_the_rest_to_the_next(
    mobilenet_bundle, bundle, share: bool, sizes: list[int]
) -> None:
    """Behind two workers held by a batch each, six requests queue. With ``share`` the first
    worker to come free takes 3 of them (ceil(6 / 2)), the next 2 of the 3 left, the next the
    last: whichever comes free next finds work. Without it the first takes all six and the
    other worker idles. Either way each request gets its own answer."""
    from tests.host_runtime.test_walls import eventually

    tensors = [cut(bundle, LATE, 1, seed=i) for i in range(8)]
    for host in start_host([mobilenet_bundle], workers=2, batching=BatchConfig(max_batch=8, share=share)):
        registry = host.server.registry
        held = registry.tails[bundle.id, LATE] = Held(registry.tails[bundle.id, LATE])
        with raw_connection(host) as sock:
            for request_id in (1, 2):  # one at a time: a worker each
                sock.sendall(infer_frame(bundle, request_id, LATE, tensors[request_id - 1]))
                assert eventually(host, lambda: host.server.batcher.running, lambda n: n == request_id) == request_id
            for request_id in range(3, 9):
                sock.sendall(infer_frame(bundle, request_id, LATE, tensors[request_id - 1]))
            assert eventually(host, lambda: host.server.batcher.queued, lambda n: n == 6) == 6
            held.go.set()
            replies = sorted((read_reply(sock) for _ in range(8)), key=lambda reply: reply["id"])
    assert [reply["batch"] for reply in replies[:2]] == [1, 1]
    assert sorted(reply["batch"] for reply in replies[2:]) == sizes
    for reply, alone in zip(replies, unbatched(bundle, LATE, tensors)):
        np.testing.assert_allclose(reply["tensor"], alone, atol=1e-5, rtol=0)


def test_a_host_shares_its_queue_among_workers_on_the_cpu_and_not_on_cuda(mobilenet_bundle) -> None:
    """Unless told, the host decides by its tails' device: on CUDA a launch costs about as much
    whatever its batch, so a worker takes all it may there."""
    from host_runtime._server import HostServer, ServerConfig
    from host_runtime._tails import TailRegistry

    registry = TailRegistry.from_paths([mobilenet_bundle], threads=1, device="cpu")
    assert HostServer(registry, ServerConfig()).batcher.config.share is True
    registry.device = "cuda"  # as a registry whose tails all run on CUDA says
    assert HostServer(registry, ServerConfig()).batcher.config.share is False
    assert HostServer(registry, ServerConfig(batching=BatchConfig(share=True))).batcher.config.share is True


def test_connection_past_max_in_flight_is_not_read(mobilenet_bundle, bundle) -> None:
    """Per-connection backpressure under batching: with 2 requests in flight allowed, six sent
    at once cannot all be read into one batch, however long the batcher waits for company.
    (The early cut's 100 KB frames each complete in a read of their own; small frames that
    arrive together in one read are all taken before the pause applies.)"""
    tensors = [cut(bundle, EARLY, 1, seed=i) for i in range(6)]
    for host in start_host([mobilenet_bundle], max_in_flight=2, batching=BatchConfig(max_batch=8, max_wait_ms=100)):
        replies = run_with_client(host, lambda c: asyncio.gather(*(infer(c, bundle.id, EARLY, t) for t in tensors)))
    assert [r["batch"] for r in replies] == [2] * 6
    for reply, alone in zip(replies, unbatched(bundle, EARLY, tensors)):
        np.testing.assert_allclose(reply["tensor"], alone, atol=1e-5, rtol=0)


def test_a_deadline_of_0_on_the_wire_is_spent_and_none_is_no_deadline(mobilenet_bundle, bundle) -> None:
    """On the wire 0 (or less) is a budget already spent: refused ``deadline_exceeded`` at once, even on
    a tail with no time per sample yet, and never run; no ``deadline_ms``, or an infinite one, is no
    deadline (None in the host's code), admitted and answered, while a spent one beside them is refused."""
    tensor = cut(bundle, LATE, 1)
    for host in start_host([mobilenet_bundle], workers=1):
        with raw_connection(host) as sock:
            for i, budget in enumerate([0, 0.0, -1.0]):
                sock.sendall(infer_frame(bundle, i, LATE, tensor, deadline_ms=budget))
                reply = read_reply(sock)
                assert reply["error"]["code"] == "deadline_exceeded", reply
                assert "deadline cannot be met: 0.0 ms left" in reply["error"]["message"]
            sock.sendall(infer_frame(bundle, 10, LATE, tensor) + infer_frame(bundle, 11, LATE, tensor, deadline_ms=float("inf"))
                         + infer_frame(bundle, 12, LATE, tensor, deadline_ms=0))
            replies = {r["id"]: r for r in (read_reply(sock) for _ in range(3))}
            ran = [i for i in (10, 11) if replies[i]["ok"]]
            assert ran == [10, 11] and replies[12]["error"]["code"] == "deadline_exceeded"
        stats = host.server.stats.as_dict()
        assert stats["errors"]["deadline_exceeded"] == 4 and stats["queue_depth"] == 0
