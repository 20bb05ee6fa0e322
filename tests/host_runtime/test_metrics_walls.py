"""The metrics endpoint's walls (issue 45), attacked: it binds 127.0.0.1 unless told, asks for a
token anywhere else, holds no thread per connection, closes every request at one deadline
however slowly it trickles in, caps its connections, and renders once per interval however
many scrapers loop on it.

prometheus_client's server, which it replaces, bound 0.0.0.0, asked for nothing, held a thread
per connection that never timed out (2,000 half-sent requests: 986 threads in 20 s) and rendered
for every scrape (12 scrapers in a loop: the host's infer p99 9.3x).

No assert here depends on how fast this machine is: deadlines are either read from an injected
clock or checked against bounds many times the deadline.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import replace

import pytest

from host_runtime.cli import build_parser, main
from device_runtime.live import Walls
from host_runtime._metrics_http import (METRICS_WALLS, MetricsEndpoint, endpoint_token, is_loopback, metrics_token,
                                       read_token_file)
from host_runtime._procs import serve_summed_metrics
from host_runtime._server import ServerConfig
from splitedge import SplitEdgeError
from tests.conftest import start_host
from tests.device_runtime.live.sockets import GENEROUS_S, Clock, closed_by_peer, exchange, wait_for
from tests.device_runtime.live.sockets import half_open as open_half

KEY = bytes(range(32))
TOKEN = b"a-token-of-its-own-0123456789"
HALF_REQUEST = b"GET /metrics HTTP/1.1\r\nHost: x\r\n"  # no blank line: the request never ends


class Rendered:
    """A render that counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> bytes:
        self.calls += 1
        return f"splitedge_host_renders {self.calls}\n".encode()


@pytest.fixture
def endpoints():
    opened: list[MetricsEndpoint] = []

    def open_endpoint(render=None, address: str = "127.0.0.1", **options) -> MetricsEndpoint:
        walls = {name: options.pop(name) for name in [*options] if name in Walls.__dataclass_fields__}
        endpoint = MetricsEndpoint(render or Rendered(), address, 0, walls=replace(METRICS_WALLS, **walls), **options)
        opened.append(endpoint)
        return endpoint

    yield open_endpoint
    for endpoint in opened:
        endpoint.close()
        assert not endpoint.thread.is_alive()


def get(port: int, target: str = "/metrics", headers: bytes = b"") -> tuple[int, bytes]:
    return exchange(port, b"GET " + target.encode() + b" HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")


def half_open(port: int, count: int) -> list[socket.socket]:
    return open_half(port, count, HALF_REQUEST)


# -- where it listens, and who may read it --------------------------------------------------------


def test_the_metrics_bind_loopback_unless_told(mobilenet_bundle, capsys) -> None:
    args = build_parser().parse_args(["serve", "bundle/", "--metrics-port", "9100"])
    assert args.metrics_interface == "127.0.0.1"
    assert ServerConfig().metrics_host == "127.0.0.1"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--metrics-interface ADDRESS address the metrics listen on (default: 127.0.0.1, this machine only)" in help_text
    # Not on the host's --interface: a host serving boards on every address keeps its metrics local.
    for host in start_host([mobilenet_bundle], metrics_port=0, key=KEY):
        assert host.server.config.host == "127.0.0.1"
        assert host.server.metrics.server_address[0] == "127.0.0.1"
        assert host.server.metrics.token is None  # loopback: no token, even with a key
        assert get(host.server.metrics.port)[0] == 200


def test_off_loopback_without_a_key_or_a_token_is_refused_in_one_line() -> None:
    with pytest.raises(SplitEdgeError, match="--metrics-interface 0.0.0.0 is not loopback: .* pass --key-file or "
                                             "--metrics-token-file"):
        endpoint_token("0.0.0.0", None, None)
    assert endpoint_token("127.0.0.1", None, None) == (None, "")
    assert endpoint_token("::1", KEY, None) == (None, "")
    assert endpoint_token("127.0.0.1", None, TOKEN)[0] == TOKEN  # a token given is asked for wherever it listens
    assert endpoint_token("0.0.0.0", KEY, None)[0] == metrics_token(KEY).encode()
    assert endpoint_token("0.0.0.0", KEY, TOKEN)[0] == TOKEN
    assert is_loopback("localhost") and is_loopback("127.0.0.2") and not is_loopback("metrics.example")


@pytest.mark.parametrize("procs", ["1", "2"])
def test_the_cli_refuses_an_address_without_a_token_before_anything_loads(tmp_path, capsys, procs: str) -> None:
    absent = str(tmp_path / "no-bundle")  # nothing is loaded: the flags are refused first
    with pytest.raises(SystemExit) as exited:
        main(["serve", absent, "--metrics-port", "0", "--metrics-interface", "0.0.0.0", "--procs", procs])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        "split-host: error: --metrics-interface 0.0.0.0 is not loopback: the metrics need a token there; pass "
        "--key-file or --metrics-token-file, or leave --metrics-interface at 127.0.0.1")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(SystemExit):
        main(["serve", absent, "--metrics-port", "0", "--metrics-token-file", str(fifo)])
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"split-host: error: --metrics-token-file {fifo}: not a regular file")


def test_a_metrics_interface_not_of_this_machine_is_one_line_naming_it(mobilenet_bundle, capsys, tmp_path) -> None:
    key_file = tmp_path / "host.key"
    key_file.write_text("ab" * 32 + "\n")
    key_file.chmod(0o600)
    status = main(["serve", str(mobilenet_bundle), "--interface", "127.0.0.1", "--port", "0", "--no-zeroconf",
                   "--metrics-port", "0", "--metrics-interface", "192.0.2.1", "--key-file", str(key_file)])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == ("split-host: error: --metrics-interface 192.0.2.1 is not an address of "
                                            "this machine; give one of its addresses, or 0.0.0.0 for all")


def test_off_loopback_the_host_asks_for_its_token(mobilenet_bundle, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    token = metrics_token(KEY)
    for host in start_host([mobilenet_bundle], metrics_port=0, metrics_host="0.0.0.0", key=KEY):
        endpoint = host.server.metrics
        port = endpoint.port
        assert endpoint.server_address[0] == "0.0.0.0" and token in endpoint.note
        assert get(port)[0] == 401
        assert get(port, "/metrics?token=wrong")[0] == 401
        assert get(port, headers=b"Authorization: Bearer wrong\r\n")[0] == 401
        assert get(port, headers=b"Authorization: Basic " + token.encode() + b"\r\n")[0] == 401
        # Non-ASCII, raw or percent-encoded, in the query or the header: a 401 like any other mismatch.
        assert get(port, "/metrics?token=%C3%A9%E2%82%AC")[0] == 401
        assert exchange(port, b"GET /metrics?token=\xc3\xa9\xff HTTP/1.1\r\n\r\n")[0] == 401
        assert exchange(port, b"GET /metrics HTTP/1.1\r\nAuthorization: Bearer \xe2\x82\xac\xff\r\n\r\n")[0] == 401
        status, body = get(port, "/metrics?token=" + token)
        assert status == 200 and b"splitedge_host_requests_total" in body
        assert get(port, headers=b"Authorization: Bearer " + token.encode() + b"\r\n")[0] == 200
        assert get(port, headers=b"authorization: bearer " + token.encode() + b"\r\n")[0] == 200
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "metrics" in r.name]
    assert "Traceback" not in caplog.text


def test_a_token_of_its_own_from_a_file(endpoints, tmp_path) -> None:
    path = tmp_path / "metrics.token"
    path.write_bytes(TOKEN + b"\n")
    path.chmod(0o644)
    with pytest.raises(SplitEdgeError, match=f"readable by every user \\(mode 644\\); run chmod 600 {path}"):
        read_token_file(str(path))
    path.chmod(0o600)
    token = read_token_file(str(path))
    assert token == TOKEN
    endpoint = endpoints(token=token)
    assert get(endpoint.port)[0] == 401
    assert get(endpoint.port, "/metrics?token=" + TOKEN.decode())[0] == 200
    short = tmp_path / "short"
    short.write_bytes(b"abc\n")
    short.chmod(0o600)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for bad, why in ((short, "16 to 4096 bytes"), (fifo, "not a regular file"), (tmp_path / "absent", "No such file"),
                     (tmp_path, "not a regular file")):
        with pytest.raises(SplitEdgeError, match=why):
            read_token_file(str(bad))


def test_the_summed_endpoint_asks_for_its_token_and_renders_once_per_interval(endpoints) -> None:
    clock = Clock()
    endpoint = serve_summed_metrics("127.0.0.1", 0, [], token=TOKEN, clock=clock)
    try:
        assert get(endpoint.port)[0] == 401
        for _ in range(5):
            status, body = get(endpoint.port, headers=b"Authorization: Bearer " + TOKEN + b"\r\n")
            assert status == 200 and b"splitedge_host_processes_up 0.0" in body
        assert endpoint.renders == 1
    finally:
        endpoint.close()


# -- no thread per connection, one deadline per request ------------------------------------------


def test_half_open_connections_take_no_thread_and_close_at_the_deadline(endpoints) -> None:
    endpoint = endpoints(request_timeout=1.0, max_connections=256)
    threads = threading.active_count()
    socks = half_open(endpoint.port, 220)
    try:
        wait_for(lambda: endpoint.open_connections + endpoint.timed_out >= 220, "accepting 220 connections")
        # prometheus_client's server held a thread for each of them (986 for 2,000).
        assert threading.active_count() <= threads + 2
        for sock in socks:
            assert closed_by_peer(sock, GENEROUS_S), "a half-sent request outlived its deadline"
        assert endpoint.timed_out == 220 and endpoint.open_connections == 0
        assert get(endpoint.port)[0] == 200  # and the endpoint still answers
    finally:
        for sock in socks:
            sock.close()


def test_the_deadline_is_for_the_whole_request_not_each_read(endpoints) -> None:
    clock = Clock()
    endpoint = endpoints(request_timeout=5.0, clock=clock)
    with socket.create_connection(("127.0.0.1", endpoint.port), timeout=GENEROUS_S) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\n")
        wait_for(lambda: endpoint.open_connections == 1, "accepting the connection")
        for second in range(1, 5):  # a header byte every second: each read is recent, the request is not
            clock.now += 1.0
            sock.sendall(b"X")
            assert endpoint.timed_out == 0, f"closed {second} s in, before its 5 s deadline"
        clock.now += 1.0  # 5 s since it was accepted
        assert closed_by_peer(sock, GENEROUS_S)
    assert endpoint.timed_out == 1


def test_a_slow_loris_is_closed_by_the_deadline_in_real_time(endpoints) -> None:
    endpoint = endpoints(request_timeout=1.0)
    start = time.monotonic()
    sent = 0
    with socket.create_connection(("127.0.0.1", endpoint.port), timeout=GENEROUS_S) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
        closed = False
        while time.monotonic() - start < GENEROUS_S:
            readable, _, _ = select.select([sock], [], [], 0.1)  # a byte every 0.1 s, until it is closed
            if readable:
                closed = closed_by_peer(sock, 1.0)
                break
            try:
                sock.sendall(b"a")
                sent += 1
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
    assert closed, f"a sender trickling a byte every 0.1 s was still open after {GENEROUS_S:g} s"
    assert endpoint.timed_out == 1
    assert sent < GENEROUS_S * 10  # it was closed while it kept sending


def test_the_connection_cap_sheds_the_oldest_unanswered(endpoints) -> None:
    endpoint = endpoints(max_connections=8, request_timeout=600.0)
    socks = half_open(endpoint.port, 40)
    try:
        wait_for(lambda: endpoint.shed >= 32, "shedding past the cap")
        assert endpoint.open_connections == 8 and endpoint.shed == 32
        closed = [sock for sock in socks if closed_by_peer(sock, 0.01 if sock in socks[32:] else GENEROUS_S)]
        assert len(closed) == 32 and closed == socks[:32]  # the oldest went, the newest 8 are held
        # A scraper is not locked out by the idle ones: it takes the oldest one's slot.
        status, body = get(endpoint.port)
        assert status == 200 and body.startswith(b"splitedge_host_renders")
        assert endpoint.open_connections == 7 and endpoint.shed == 33
    finally:
        for sock in socks:
            sock.close()


def test_requests_are_bounded_and_answered_in_one_line(endpoints) -> None:
    endpoint = endpoints(max_request_bytes=1024)
    assert exchange(endpoint.port, b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * 4096 + b"\r\n\r\n")[0] == 431
    assert exchange(endpoint.port, b"\xff\xfe garbage\r\n\r\n")[0] == 400
    assert exchange(endpoint.port, b"POST /metrics HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}")[0] == 405
    assert get(endpoint.port, "/elsewhere")[0] == 404
    assert get(endpoint.port, "/")[0] == 200
    status, body = exchange(endpoint.port, b"HEAD /metrics HTTP/1.1\r\n\r\n")
    assert status == 200 and body == b""


def test_a_render_that_fails_is_a_500_and_the_endpoint_goes_on(endpoints, caplog) -> None:
    calls = []

    def render() -> bytes:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a collector broke")
        return b"ok 1\n"

    endpoint = endpoints(render, cache_s=0.0)
    assert get(endpoint.port)[0] == 500
    assert get(endpoint.port) == (200, b"ok 1\n")
    assert "rendering failed: RuntimeError: a collector broke" in caplog.text and "Traceback" not in caplog.text


# -- one render per interval ----------------------------------------------------------------------


def test_scrapers_in_a_loop_cost_one_render_per_interval(endpoints) -> None:
    clock = Clock()
    render = Rendered()
    endpoint = endpoints(render, clock=clock, cache_s=1.0)
    bodies: list[bytes] = []

    def scraper() -> None:
        for _ in range(5):
            with urllib.request.urlopen(endpoint.url, timeout=GENEROUS_S) as response:
                bodies.append(response.read())

    scrapers = [threading.Thread(target=scraper) for _ in range(12)]
    for thread in scrapers:
        thread.start()
    for thread in scrapers:
        thread.join(GENEROUS_S)
    assert len(bodies) == 60 and set(bodies) == {b"splitedge_host_renders 1\n"}
    assert render.calls == endpoint.renders == 1
    clock.now += 0.5  # (halves: exact in binary, so the interval's edge is where the test says)
    assert get(endpoint.port)[1] == b"splitedge_host_renders 1\n"
    clock.now += 0.5  # an interval after the render: the next scrape renders again
    assert get(endpoint.port)[1] == b"splitedge_host_renders 2\n"
    assert render.calls == 2


def test_scrapers_in_a_loop_get_a_bounded_share_of_a_core(endpoints) -> None:
    endpoint = endpoints(max_duty=0.05)
    start = time.monotonic()
    stop = start + 2.0
    answered = []

    def scraper() -> None:
        while time.monotonic() < stop:
            with urllib.request.urlopen(endpoint.url, timeout=GENEROUS_S) as response:
                answered.append(response.status)

    scrapers = [threading.Thread(target=scraper) for _ in range(12)]
    for thread in scrapers:
        thread.start()
    for thread in scrapers:
        thread.join(GENEROUS_S)
    elapsed = time.monotonic() - start
    assert answered and set(answered) == {200}
    # It rests 19 times the CPU time of each turn: at most 5 % of the time (plus the last turn) was its.
    assert endpoint.busy_s <= 0.05 * elapsed + 0.05, (endpoint.busy_s, elapsed, len(answered))


def test_close_stops_the_thread_with_connections_open(endpoints) -> None:
    endpoint = MetricsEndpoint(Rendered(), "127.0.0.1", 0, walls=replace(METRICS_WALLS, request_timeout=600.0))
    socks = half_open(endpoint.port, 5)
    try:
        wait_for(lambda: endpoint.open_connections == 5, "accepting 5 connections")
        endpoint.close()
        assert not endpoint.thread.is_alive()
        assert all(closed_by_peer(sock, GENEROUS_S) for sock in socks)
        with pytest.raises(OSError):
            urllib.request.urlopen(endpoint.url, timeout=5)
    finally:
        for sock in socks:
            sock.close()
