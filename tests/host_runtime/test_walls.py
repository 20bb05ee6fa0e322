"""The host's walls (issue 13, "what probing the running host found"), one test per finding:

1. a ``profile`` is bounded in total work, runs beside the tail workers and one at a time;
2. a stopping host refuses new work at once and stops a running profile within one tail run;
3. before authenticating, a peer makes the host hold no frame buffer, and the frames still
   arriving on all connections together stay within the host's budget;
4. connections are capped in all and per address, and closed when a frame stays unfinished
   or the connection idle past its timeout, each with a log line naming the peer and the limit;
5. a port in use is one line of error, exit status 2.

Only 127.0.0.1 (and 127.0.0.2/.3, the same loopback, as other peers' addresses). Every read
has a timeout; timeouts are configured small and checked against generous bounds, never
measured.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from device_runtime.bundle import OFFLOAD, Bundle
from device_runtime.link import Credentials, HostClient
from device_runtime.wire._protocol import decode, encode_bytes
from host_runtime import _limits as limits
from host_runtime.cli import main
from host_runtime._limits import ACCEPT_WARNING_PERIOD_S, AcceptFailures
from host_runtime._profiling import MAX_PROFILE_SAMPLES, PROFILE_WARMUP
from splitedge.errors import HostUnavailableError
from tests.conftest import TEST_SPLITS, RunningHost, start_host
from tests.host_runtime.helpers import cut, port_from_log, serve_process
from tests.host_runtime.test_admission import infer_frame
from tests.host_runtime.test_auth import KEY, read_body
from tests.host_runtime.test_server import raw_connection, read_reply

EARLY, LATE = TEST_SPLITS
MiB = 1 << 20
BOUND_S = 10.0  # what "at once" and "within its timeout" are checked against on a busy 2-core machine
#: The full model at batch 64, 53 runs (50 timed, 3 warm-up): 3,392 samples, within the
#: per-request budget, and about a minute of a core on the build machine.
LONG_PROFILE = {"op": "profile", "splits": [OFFLOAD], "batches": [64], "repeats": 50}


@pytest.fixture(scope="module")
def bundle(mobilenet_bundle) -> Bundle:
    return Bundle.load(mobilenet_bundle)


def frame(message: dict[str, Any]) -> bytes:
    return encode_bytes(message)


def eventually(host: RunningHost, read: Callable[[], Any], until: Callable[[Any], bool]) -> Any:
    """``read()`` on the host's loop until ``until`` holds of it (or BOUND_S passed): its last value."""

    async def on_loop() -> Any:
        return read()

    deadline = time.monotonic() + BOUND_S
    while True:
        value = host.call(on_loop)
        if until(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.02)


def closed_by_host(sock: socket.socket) -> bool:
    """True once the host closes ``sock`` (within BOUND_S), whatever it said first (a refused
    connection is told why); False if it is still open then."""
    sock.settimeout(BOUND_S)
    try:
        while sock.recv(1 << 16):
            pass
        return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def connect_from(host: RunningHost, address: str) -> socket.socket:
    """A connection to the host from ``address`` (a loopback address of this machine)."""
    return socket.create_connection((host.host, host.port), timeout=BOUND_S, source_address=(address, 0))


def served(sock: socket.socket) -> bool:
    sock.sendall(frame({"id": "p", "op": "ping"}))
    return read_reply(sock)["ok"] is True


# -- 1. profile ----------------------------------------------------------------------------------


def test_infer_is_answered_while_a_long_profile_runs(mobilenet_bundle, bundle) -> None:
    """One tail worker, and a profile of about a minute (its budget raised for it): an infer sent behind
    it is answered while the profile still runs (it has a thread of its own), and a second profile on
    the same connection is refused at once."""
    for host in start_host([mobilenet_bundle], workers=1, profile_budget_s=600.0):
        with raw_connection(host) as sock:
            sock.sendall(frame({"id": 1, "bundle": bundle.id, **LONG_PROFILE}))
            sock.sendall(frame({"id": 2, "op": "profile", "bundle": bundle.id, "splits": [LATE], "batches": [1],
                                "repeats": 1}))
            sock.sendall(infer_frame(bundle, 3, LATE, cut(bundle, LATE, 1)))
            replies = {r["id"]: r for r in (read_reply(sock), read_reply(sock))}
            assert replies[3]["ok"] is True and replies[3]["batch"] == 1
            assert replies[2]["error"]["code"] == "overloaded", replies[2]
            assert "one at a time per connection" in replies[2]["error"]["message"]
            assert eventually(host, lambda: host.server.profiler.busy, bool), "the long profile ended first"


def test_a_profile_past_its_budget_is_refused_before_it_runs(mobilenet_bundle, bundle) -> None:
    """Every tail at batches 64 and 32, 50 repeats (and 3 warm-up runs): each entry within its own
    bound, the whole 5 × 96 × 53 samples. Refused at once, naming the limit; what is named twice
    runs once."""
    for host in start_host([mobilenet_bundle]):
        tails = len(host.server.registry.served()[bundle.id])  # 2 cuts, offload, the chain's 2 stages
        with raw_connection(host) as sock:
            sock.sendall(frame({"id": 1, "op": "profile", "bundle": bundle.id, "batches": [64, 32], "repeats": 50}))
            reply = read_reply(sock)
            assert reply["error"]["code"] == "bad_request", reply
            assert tails == 5 and f"profile of {tails * 96 * (50 + PROFILE_WARMUP)} samples" in reply["error"]["message"]
            assert f"limit of {MAX_PROFILE_SAMPLES} per request" in reply["error"]["message"]
            sock.sendall(frame({"id": 2, "op": "profile", "bundle": bundle.id, "splits": [LATE] * 3,
                                "batches": [1] * 3, "repeats": 1}))
            times = read_reply(sock)["tail_ms"]
            assert list(times) == [LATE] and list(times[LATE]) == ["1"] and times[LATE]["1"] > 0


# -- 2. shutdown ----------------------------------------------------------------------------------


def test_sigterm_during_a_profile_stops_the_host_within_its_bound(mobilenet_bundle: Path, tmp_path: Path) -> None:
    """``split-host serve`` timing the full model for about a minute: SIGTERM ends the process
    within the shutdown timeout (5 s) plus a tail run, and the profile is answered ``overloaded``."""
    log = tmp_path / "host.log"
    process = serve_process(mobilenet_bundle, log, "--workers", "1", "--threads", "1", "--profile-budget-ms", "600000")
    try:
        port = port_from_log(process, log)
        with socket.create_connection(("127.0.0.1", port), timeout=BOUND_S) as sock:
            bundle_id = Bundle.load(mobilenet_bundle).id
            sock.sendall(frame({"id": 1, "bundle": bundle_id, **LONG_PROFILE}) + frame({"id": 2, "op": "ping"}))
            assert read_reply(sock)["id"] == 2  # the profile's frame was read before it: its run has begun
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(5.0 + BOUND_S)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"the host did not stop within {5.0 + BOUND_S:g} s of SIGTERM:\n"
                                     f"{log.read_text()}") from None
            reply = read_reply(sock)
        assert process.returncode == 128 + signal.SIGTERM, log.read_text()
        assert log.read_text().splitlines()[-1] == "host stopped (SIGTERM)"
        assert reply["id"] == 1 and reply["error"]["code"] == "overloaded", reply
        assert "shutting down" in reply["error"]["message"]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(5)


def test_a_stopping_host_refuses_new_work_at_once(mobilenet_bundle, bundle) -> None:
    """While a 64-sample batch runs on the only worker the host starts stopping: an infer that
    arrives then is answered ``overloaded`` at once, and the batch in flight still gets its answer."""
    for host in start_host([mobilenet_bundle], workers=1):
        with raw_connection(host) as sock:
            sock.sendall(infer_frame(bundle, 1, EARLY, cut(bundle, EARLY, 64)))
            assert eventually(host, lambda: host.server.batcher.running, lambda n: n == 64) == 64
            closing = asyncio.run_coroutine_threadsafe(host.server.close(), host.loop)

            def refused() -> bool:
                try:
                    socket.create_connection((host.host, host.port), timeout=1).close()
                except ConnectionRefusedError:
                    return True
                return False

            deadline = time.monotonic() + BOUND_S
            while not refused() and time.monotonic() < deadline:  # closing: no longer accepting
                time.sleep(0.01)
            sock.sendall(infer_frame(bundle, 2, LATE, cut(bundle, LATE, 1)))
            replies = {r["id"]: r for r in (read_reply(sock), read_reply(sock))}
            closing.result(BOUND_S)
        assert replies[2]["error"]["code"] == "overloaded" and "shutting down" in replies[2]["error"]["message"]
        assert replies[1]["ok"] is True and replies[1]["batch"] == 64


# -- 3. memory held for frames still arriving -----------------------------------------------------


def test_unauthenticated_length_prefixes_make_the_host_hold_nothing(mobilenet_bundle) -> None:
    """With a key, twenty peers each announce a 60 MiB frame before authenticating: each is refused
    from its length prefix and closed, and the host holds no byte for any of them."""
    for host in start_host([mobilenet_bundle], key=KEY):
        peers = [socket.create_connection((host.host, host.port), timeout=BOUND_S) for _ in range(20)]
        try:
            for sock in peers:
                assert read_body(sock) is not None  # the challenge
                sock.sendall(struct.pack(">I", 60 * MiB) + b"\xc1" + bytes(40))  # the start of an envelope
            for sock in peers:
                reply = decode(read_body(sock))
                assert reply["ok"] is False and reply["error"]["code"] == "unauthorized"
                assert "before the handshake is complete" in reply["error"]["message"]
                assert read_body(sock) is None  # closed
        finally:
            for sock in peers:
                sock.close()
        held = eventually(host, lambda: (host.server.budget.held, [c.decoder.held for c in host.server.connections]),
                          lambda h: h == (0, []))
        assert held == (0, [])
        assert host.server.stats.as_dict()["frames_refused"]["handshake"] == 20


def test_frames_arriving_on_all_connections_together_stay_within_the_budget(mobilenet_bundle, bundle) -> None:
    """No key, a budget of 128 MiB: six peers announce 60 MiB frames and send a few bytes. Two are
    given their buffers, four wait unread, so the host holds 120 MiB, not 360; when they go, it
    holds nothing. (A board's frame never waits behind them: tests/host_runtime/test_walls_27.py.)"""
    for host in start_host([mobilenet_bundle], max_partial_bytes=128 * MiB):
        hogs = [raw_connection(host) for _ in range(6)]
        try:
            for sock in hogs:
                sock.sendall(struct.pack(">I", 60 * MiB) + bytes(1000))

            def state() -> tuple[int, int, int]:
                budget = host.server.budget
                return budget.held, budget.waiting, sum(c.decoder.held for c in host.server.connections)

            assert eventually(host, state, lambda s: s[1] == 4) == (120 * MiB, 4, 120 * MiB)
        finally:
            for sock in hogs:
                sock.close()
        assert eventually(host, state, lambda s: s == (0, 0, 0)) == (0, 0, 0)


def test_a_profile_counts_against_admission_and_load_like_other_work() -> None:
    """A profile is admitted as an infer of its largest batch would be, and the host announces its
    load while it runs: refused when the queue is full, counted in ``load()`` meanwhile."""
    from concurrent.futures import ThreadPoolExecutor

    from host_runtime._batcher import BatchConfig, Batcher
    from splitedge.errors import ProtocolError

    with ThreadPoolExecutor(1) as executor:
        batcher = Batcher(BatchConfig(max_queue=8), executor, workers=2, on_batch=lambda n: None)
        with batcher.other_work(4):
            batcher.load()  # the window starts with the profile running
            assert batcher.load() == pytest.approx(4 / 2)  # samples per worker, as an infer batch would count
        batcher.load()
        assert batcher.load() == 0.0
        with pytest.raises(ProtocolError, match="can never fit this host's queue of 8") as never:
            with batcher.other_work(9):
                pass
        batcher.queued = 6  # six samples of infers waiting (as submit counts them)
        with pytest.raises(ProtocolError, match="host queue is full: 6 samples waiting") as full:
            with batcher.other_work(4):
                pass
    assert never.value.code == full.value.code == "overloaded" and batcher.other == 0


# -- 4. connection caps and timeouts --------------------------------------------------------------


def test_connections_past_the_caps_are_refused_with_a_log_line(mobilenet_bundle, caplog) -> None:
    """Two connections per address, four in all: the third from one address is refused; a new
    address takes the place of the least recently active connection of the address beyond its
    share (issue 45); once every address holds its share, the next is refused; a freed place is
    taken again."""
    caplog.set_level(logging.INFO, logger="splitedge.host")
    for host in start_host([mobilenet_bundle], max_connections=4, max_connections_per_address=2):
        kept = [connect_from(host, "127.0.0.1"), connect_from(host, "127.0.0.1")]
        try:
            assert all(served(sock) for sock in kept)
            with connect_from(host, "127.0.0.1") as third:
                assert closed_by_host(third)
            kept += [connect_from(host, "127.0.0.2"), connect_from(host, "127.0.0.3")]
            assert all(served(sock) for sock in kept[1:])  # kept[0] is now the least recently active
            kept.append(connect_from(host, "127.0.0.4"))
            assert served(kept[-1])
            assert closed_by_host(kept.pop(0))  # 127.0.0.1 held two of four places among four addresses
            with connect_from(host, "127.0.0.5") as sixth:
                assert closed_by_host(sixth)
            kept.pop(0).close()
            assert eventually(host, lambda: host.server.gate.total, lambda n: n == 3) == 3
            kept.append(connect_from(host, "127.0.0.1"))
            assert served(kept[-1])
        finally:
            for sock in kept:
                sock.close()
        closed = host.server.stats.as_dict()["connections_closed"]
        assert closed["max_connections_per_address"] == 1 and closed["max_connections"] == 1
        assert closed["shed_beyond_share"] == 1
    text = caplog.text
    assert "refused a connection from ('127.0.0.1'" in text and "(--max-connections-per-address 2)" in text
    assert "shed the connection from 127.0.0.1: the table is full (--max-connections 4)" in text
    assert "refused a connection from ('127.0.0.5'" in text and "4 connections open (--max-connections 4)" in text


@pytest.mark.parametrize("key", [None, KEY], ids=["plain", "keyed"])
def test_a_device_past_the_caps_is_told_which_limit(mobilenet_bundle, key) -> None:
    """The refusal is said, in the clear and before any handshake: a device reports the limit,
    not a lost connection (nor a guess at TLS)."""
    for host in start_host([mobilenet_bundle], key=key, max_connections_per_address=1):

        async def second_device() -> str:
            credentials = Credentials(key=key)
            first = await HostClient.connect(host.host, host.port, timeout=5, credentials=credentials)
            try:
                with pytest.raises(HostUnavailableError) as caught:
                    await HostClient.connect(host.host, host.port, timeout=5, credentials=credentials)
                return str(caught.value)
            finally:
                await first.close()

        message = asyncio.run(second_device())
    assert "refused the connection: 1 connections from 127.0.0.1 open (--max-connections-per-address 1)" in message
    assert "try another host or later" in message and "TLS" not in message


def test_a_frame_left_unfinished_is_closed_after_the_frame_timeout(mobilenet_bundle, caplog) -> None:
    """A frame begun and never finished (slowloris) is closed after ``frame_timeout``; a connection
    with no frame begun is none of its business and is still served."""
    caplog.set_level(logging.WARNING, logger="splitedge.host")
    for host in start_host([mobilenet_bundle], frame_timeout=0.3):
        with raw_connection(host) as slow, raw_connection(host) as quiet:
            slow.sendall(struct.pack(">I", 1000) + b"\x80")
            assert closed_by_host(slow)
            assert served(quiet)
        assert host.server.stats.as_dict()["connections_closed"]["frame_timeout"] == 1
    assert "is unfinished (--frame-timeout 0.3)" in caplog.text and "closed the connection from ('127.0.0.1'" in caplog.text


def test_an_idle_connection_is_closed_after_the_idle_timeout(mobilenet_bundle) -> None:
    for host in start_host([mobilenet_bundle], idle_timeout=0.3):
        with raw_connection(host) as idle:
            assert served(idle)
            assert closed_by_host(idle)
        assert host.server.stats.as_dict()["connections_closed"]["idle_timeout"] == 1


def test_accept_failures_for_want_of_descriptors_are_one_warning_a_period(caplog) -> None:
    """asyncio reports each failed accept() (hundreds a second at the descriptor limit); the host
    says it once per period, with what to do, and passes anything else to the handler before it."""
    caplog.set_level(logging.WARNING, logger="splitedge.host")
    now = [100.0]
    others: list[dict[str, Any]] = []
    handler = AcceptFailures(lambda loop, context: others.append(context), clock=lambda: now[0])
    emfile = {"message": AcceptFailures.MESSAGE, "exception": OSError(24, "Too many open files")}
    for step in (0.0, 1.0, ACCEPT_WARNING_PERIOD_S):
        now[0] += step
        handler(None, emfile)
    handler(None, {"message": "something else"})
    warnings = [r.getMessage() for r in caplog.records if "cannot accept connections" in r.getMessage()]
    assert len(warnings) == 2 and "ulimit -n" in warnings[0] and "(2 failed accepts)" in warnings[1]
    assert others == [{"message": "something else"}]


def test_the_connection_cap_is_lowered_to_what_the_descriptor_limit_allows(monkeypatch) -> None:
    monkeypatch.setattr(limits.resource, "getrlimit", lambda which: (256, 256))
    monkeypatch.setattr(limits.resource, "setrlimit", lambda which, value: None)
    allowed, warning = limits.fit_fd_limit(1024)
    assert allowed == 256 - limits.FD_HEADROOM
    assert warning is not None and "allows 192 connections, not --max-connections 1024" in warning
    assert limits.fit_fd_limit(100) == (100, None)


# -- 5. the CLI -----------------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["--port", "--metrics-port"])
def test_a_port_in_use_is_one_line_and_status_2(mobilenet_bundle: Path, capsys, flag: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        ports = ["--port", str(port)] if flag == "--port" else ["--port", "0", "--metrics-port", str(port)]
        status = main(["serve", str(mobilenet_bundle), "--interface", "127.0.0.1", "--no-zeroconf", *ports])
    err = capsys.readouterr().err
    assert status == 2
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        f"split-host: error: port {port} on 127.0.0.1 is in use; stop the other host or pass {flag} 0 for a free one"
    )
