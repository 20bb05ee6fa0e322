"""The host's connection walls of issue 45, attacked on real sockets on 127.0.0.1-9:

1. connections that proved themselves once (one ``ping``) and went idle no longer lock new boards
   out: a full table sheds the least recently active connection of an address beyond its share,
   and never a board alone on its address;
2. TLS handshakes count against the caps from accept, and one never finished is closed at the
   first-frame timeout (asyncio's server counted none of them and gave each 60 s);
3. SIGTERM: the drain deadline counts from the signal, and the drain ends before it by the
   teardown's reserve (the host took 5.1-5.2 s of a 5 s bound);
4. ``profile`` spends at most its budget of the process's CPU, the pool's spin after its runs
   included (an 88-byte request took 120-180 ms of a 100 ms budget).

Bounds are generous (BOUND_S); each test would fail on the code before issue 45 whatever the load.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import numpy as np
import pytest

from device_runtime import Bundle
from device_runtime.link import Credentials
from device_runtime.wire import server_context
from device_runtime.wire._tls import client_context
from host_runtime.cli import _Stop
from host_runtime._profiling import Costs, ProfilePlan, probe, run_profile
from host_runtime._server import teardown_reserve
from splitedge.errors import ProtocolError
from tests.conftest import TEST_SPLITS, start_host
from tests.host_runtime.test_auth import certs, with_client  # noqa: F401 (a fixture)
from tests.host_runtime.test_walls import BOUND_S, closed_by_host, connect_from, eventually, served
from tests.host_runtime.test_walls_27 import a_batch_held, closed

SPLIT = TEST_SPLITS[1]


@pytest.fixture(scope="module")
def bundle(mobilenet_bundle) -> Bundle:
    return Bundle.load(mobilenet_bundle)


def _fill(host, addresses: list[str]) -> list[socket.socket]:
    """One connection from each of ``addresses``, each proven by one ping, in this order."""
    socks = []
    for address in addresses:
        socks.append(connect_from(host, address))
        assert served(socks[-1])
    return socks


def test_connections_that_pinged_once_do_not_lock_a_new_board_out(mobilenet_bundle) -> None:
    """24 places, 8 each from three addresses, each connection pinged once and idle: a new board is
    served, in place of the least recently active connection of an address beyond its share (before:
    ``overloaded: 24 connections open``)."""
    for host in start_host([mobilenet_bundle], max_connections=24, max_connections_per_address=8):
        idle = _fill(host, [f"127.0.0.{2 + i % 3}" for i in range(24)])
        try:
            with connect_from(host, "127.0.0.1") as board:
                assert served(board)
                assert closed_by_host(idle[0])
                assert closed(host, "shed_beyond_share") == 1 and closed(host, "max_connections") == 0
                assert served(board) and served(idle[1])  # the rest are kept
        finally:
            for sock in idle:
                sock.close()


def test_a_board_alone_on_its_address_is_never_shed_for_another(mobilenet_bundle) -> None:
    """The least recently active connection is a board alone on its address: the flood's connection
    next in line is shed for the newcomer, and the board is still served."""
    for host in start_host([mobilenet_bundle], max_connections=24, max_connections_per_address=8):
        socks = _fill(host, ["127.0.0.1"] + [f"127.0.0.{2 + i % 3}" for i in range(23)])
        board, flood = socks[0], socks[1:]
        try:
            with connect_from(host, "127.0.0.5") as newcomer:
                assert served(newcomer)
                assert closed_by_host(flood[0])
                assert served(board)
        finally:
            for sock in socks:
                sock.close()


def test_a_flood_of_unproven_connections_sheds_its_own_not_a_board_alone_on_its_address(mobilenet_bundle) -> None:
    """A board has connected and not yet sent its hello (a handshake a busy host has not got round
    to); a flood from two addresses fills the table: the flood's oldest are shed for its newcomers,
    never the board, which is then served (before, the oldest unproven went first: the board)."""
    for host in start_host([mobilenet_bundle], max_connections=8, first_frame_timeout=600.0):
        board = connect_from(host, "127.0.0.1")
        flood = [connect_from(host, "127.0.0.2")]
        try:
            assert eventually(host, lambda: host.server.gate.total, lambda n: n == 2) == 2  # the board's first
            flood += [connect_from(host, f"127.0.0.{2 + i % 2}") for i in range(1, 12)]
            assert eventually(host, lambda: closed(host, "shed"), lambda n: n == 5) == 5  # 13 connections, 8 places
            assert served(board)
            assert closed_by_host(flood[0])
        finally:
            for sock in (board, *flood):
                sock.close()


def test_tls_handshakes_count_against_the_caps(mobilenet_bundle, bundle, certs) -> None:  # noqa: F811
    """Eight TCP connections to a TLS host that never start their handshake fill its eight places (the
    gauge counts them; it stayed at 0); a board's TLS connection is served in place of the oldest."""
    for host in start_host([mobilenet_bundle], tls=server_context(*certs["host"]), max_connections=8,
                           first_frame_timeout=600.0):
        silent = [connect_from(host, f"127.0.0.{2 + i % 4}") for i in range(8)]
        try:
            assert eventually(host, lambda: host.server.gate.total, lambda n: n == 8) == 8
            assert host.server.stats.as_dict()["connections"] == 8
            credentials = Credentials(tls=client_context(certs["host"][0]))
            assert asyncio.run(with_client(host, lambda c: c.ping(), credentials)) >= 0
            assert closed_by_host(silent[0])
            assert closed(host, "shed") == 1 and closed(host, "max_connections") == 0
        finally:
            for sock in silent:
                sock.close()


def test_a_tls_handshake_never_finished_ends_at_the_first_frame_timeout(mobilenet_bundle, certs) -> None:  # noqa: F811
    """A connection that never finishes its handshake is closed at --first-frame-timeout (asyncio's
    own bound was 60 s), counted as ``tls_handshake``, its place freed."""
    for host in start_host([mobilenet_bundle], tls=server_context(*certs["host"]), first_frame_timeout=0.5):
        with connect_from(host, "127.0.0.2") as silent, connect_from(host, "127.0.0.3") as partial:
            partial.sendall(b"\x16\x03\x01\x02\x00")  # a ClientHello's record header, and nothing after
            assert closed_by_host(silent) and closed_by_host(partial)
        assert eventually(host, lambda: closed(host, "tls_handshake"), lambda n: n == 2) == 2  # counted after the close
        assert eventually(host, lambda: host.server.gate.total, lambda n: n == 0) == 0


# -- SIGTERM: one deadline from the signal -------------------------------------------------------------


def test_the_stop_remembers_when_the_signal_came() -> None:
    """The drain deadline is the signal's time plus --drain-timeout, however long the host takes to
    get round to stopping (it counted from then: 5.1-5.2 s of 5 with everything in flight)."""

    async def go() -> tuple[float, float, float]:
        stop = _Stop()
        stop.set()
        at = stop.at
        await asyncio.sleep(0.05)
        stop.set()  # a second set (the other signal) keeps the first time
        return at, stop.at, stop.deadline(5.0)

    first, kept, deadline = asyncio.run(go())
    assert kept == first and deadline == first + 5.0


def test_the_drain_ends_before_the_deadline_by_the_teardown_reserve(mobilenet_bundle, bundle) -> None:
    """A batch held on the only worker, and the signal one second ago with a 3 s drain: the host is
    stopped within the two seconds left, its drain ending :func:`teardown_reserve` before them."""
    drain = 3.0
    for host in start_host([mobilenet_bundle], workers=1, shutdown_timeout=drain):
        with a_batch_held(host, bundle, SPLIT):
            signalled = host.loop.time() - 1.0  # the loop's clock is time.monotonic
            started = time.monotonic()
            asyncio.run_coroutine_threadsafe(host.server.close(signalled + drain), host.loop).result(3 * drain)
            took = time.monotonic() - started
        assert drain - 1.0 - teardown_reserve(drain) - 0.2 <= took < drain - 1.0 + BOUND_S / 4, took


# -- profile: the budget is the process's CPU, the pool's trail included ---------------------------------


class _Clock:
    """A process CPU clock the fake tail advances: what runs cost, and what the pool spins after."""

    def __init__(self) -> None:
        self.now, self.trailing = 0.0, 0.0

    def __call__(self) -> float:
        return self.now

    def wait(self, seconds: float) -> None:  # the pool spins out while nothing else runs
        self.now, self.trailing = self.now + self.trailing, 0.0


class _Spinning:
    """A tail costing ``per_sample`` s of CPU a sample, whose pool spins ``trail`` s after a run
    unless the next run comes first (as onnxruntime's threads stop spinning when work comes)."""

    input_shape = (None, 8)
    input_dtype = np.float32

    def __init__(self, clock: _Clock, per_sample: float, trail: float) -> None:
        self.clock, self.per_sample, self.trail = clock, per_sample, trail

    def run(self, x: np.ndarray) -> np.ndarray:
        self.clock.now += self.per_sample * len(x)
        self.clock.trailing = self.trail
        return x


@pytest.mark.parametrize("trail", [0.0, 0.03, 0.05])
def test_a_profile_spends_at_most_its_budget_of_process_cpu_trail_included(trail: float) -> None:
    """A tail at 1 ms a sample whose pool spins ``trail`` after each run, asked for batches 1-16 and
    20 repeats under a 100 ms budget: everything the profile costs the process, the spin after its
    last run included, is within the budget (counting its runs alone, an 88-byte request took
    120-180 ms); and it still answers, fewer repeats, or refuses before running anything."""
    clock = _Clock()
    tail = _Spinning(clock, 0.001, trail)
    costs = Costs()
    probe([tail], threading.Event(), costs, cpu=clock, wait=clock.wait, trail_cpu=clock)  # at the host's start
    assert costs.trails[tail] == pytest.approx(trail)
    plan = ProfilePlan({"a": tail}, (1, 2, 4, 8, 16), 20)
    began = clock()
    try:
        times, _ = run_profile(plan, threading.Event(), 0.1, costs, cpu=clock)
    except ProtocolError as exc:
        assert "--profile-budget-ms" in str(exc) and clock() == began  # refused before any run
        return
    assert set(times["a"]) == {"1", "2", "4", "8", "16"}
    assert clock() + clock.trailing - began <= 0.1
