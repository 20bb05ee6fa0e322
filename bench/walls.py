"""The host's and the board's walls under attack (issues 27 and 45), in one run: what each attack costs them.

A real ``split-host serve`` (a process of its own, the test bundle, keyless, on 127.0.0.1) and,
in this process, a good board: one connection sending infers of the early cut (a frame over
64 KB, so it needs the memory budget) one after another. For each phase the board's p50/p99
latency over ``--requests`` infers and the host's RSS are taken:

- quiet: nothing else;
- idle: 10,000 connections from 127.0.0.2-41 that send nothing (``--max-connections 10000``;
  ``--first-frame-timeout`` raised so they stay for the measurement);
- slow-loris: 200 connections that each announce a 64 MiB frame and then send a byte a second;
- decode bomb: another connection sends, again and again, a 16 MiB frame of empty arrays
  inside one array header (``{"id", "op": "ping", "x": [[]] * 16Mi}``).

Issue 45's observers, on the same host (``--metrics-port 0 --live 127.0.0.1:0``), each phase against
the same quiet one (the watchers run in a process of their own: bench/walls_pages.py):

- 20 scrapers of ``/metrics`` in a loop;
- the host's live page: 1,000 idle boards (each sent a ``ping`` and read its answer) and 20 pollers
  of ``/state.json`` in a loop and 4 event streams;
- 2,000 half-open page connections (a request line and a header, never the blank line; reopened
  when closed), and the seconds a new poller then waits for its answer.

Then a board, ``split-device run --split local`` on the synthetic camera at 200 fps (more than it
answers: CPU-bound) with its live page: frames answered a second and their p99 over a window,
quiet, with 20 pollers and 4 streams, and with 2,000 half-open connections. Then, each on a host
of its own: the lockout (1,100 connections from 127.0.0.2-9 that ping once and go idle, at the
default cap of 1,024; then a new board from 127.0.0.1), TLS handshakes (5,000 TCP connections that
never start one: the connections gauge, the host's descriptors and RSS, when they are closed, a
TLS board meanwhile) and a 64 MiB uint8 ``infer offload`` while another connection pings every
5 ms.

Then the host's CPU for a few ``profile`` requests (one tail at batches 1-4 and 1-16, 20 repeats;
issue 27's 90-byte one of the full model) and one ``links`` (2 peers x 4 MiB, to a second host),
read from /proc (10 ms ticks), each the most of three, with its bytes and CPU per KB, on the
``--threads 1`` host and on one with the product's default pool (onnxruntime's, spinning); and the time
from SIGTERM to exit under issue 27's load (two 106-sample offload requests queued behind a
running one, a chain hop and a ``links`` to a peer that accepts and never answers).

    .venv-device/bin/python bench/walls.py --bundle build/test-bundle --out build/bench/walls.json

``--pin`` makes the two busy processes the bench's own, one pinned to each CPU, and keeps the side
measured on CPU 0 and every watcher on CPU 1: on a 2-core machine the twenty watchers' own CPU
otherwise falls on the board or host they watch, which a page watched from other machines never
costs it, and the scheduler moves the busy processes between the phases.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing
import os
import platform
import re
import resource
import selectors
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

import msgpack
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from device_runtime import OFFLOAD, Bundle  # noqa: E402
from device_runtime.link import Credentials, HostClient, Leg  # noqa: E402
from device_runtime.wire import PROTOCOL_VERSION, client_context, encode_bytes, encode_message  # noqa: E402
from device_runtime.wire.ops import HelloReply, Hop  # noqa: E402
from host_runtime._metrics import stats_from  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from walls_pages import CPUS, ROOT, alternate, board_fps, busy, copy_of_page, first_answer_s, observers, place, summary  # noqa: E402

SPLITS = ("features_4_conv_2", "features_14_conv_2")  # the test bundle's cuts (tests/conftest.py)
CHAIN = "+".join(SPLITS)
MiB = 1 << 20


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def host(bundle: Path, *args: str, threads: str | None = "1",
         pages: dict[str, int] | None = None) -> Iterator[tuple[subprocess.Popen, int]]:
    """``split-host serve`` on 127.0.0.1, a free port; (process, port). ``threads`` None: the
    product's default pool. ``pages`` is filled with the ports of ``metrics`` and ``live`` where
    ``--metrics-port``/``--live`` are among ``args``."""
    log = Path(f"/tmp/walls-host-{os.getpid()}-{time.monotonic_ns()}.log")
    command = [sys.executable, "-m", "host_runtime.cli", "serve", str(bundle.resolve()), "--interface", "127.0.0.1", "--port", "0",
               "--no-zeroconf", *(("--threads", threads) if threads else ()), *args]
    wanted = {"listening on ": "port", **{f"{name} on ": name.split()[0] for name, flag in
                                          (("metrics", "--metrics-port"), ("live page", "--live")) if flag in args}}
    with log.open("wb") as out:
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   preexec_fn=lambda: place("measured"))
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            found = {key: int(re.match(r"\D*?(?:http://)?[\d.]+:(\d+)", line).group(1))
                     for line in log.read_text().splitlines() for start, key in wanted.items() if line.startswith(start)}
            if len(found) == len(wanted):
                if pages is not None:
                    pages.update(found)
                yield process, found["port"]
                break
            if process.poll() is not None:
                raise RuntimeError(f"the host exited:\n{log.read_text()}")
            time.sleep(0.05)
        else:
            raise RuntimeError(f"the host did not listen:\n{log.read_text()}")
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)
        log.unlink(missing_ok=True)


def board_latencies(port: int, bundle: Bundle, requests: int) -> list[float]:
    """``requests`` infers of the early cut, one at a time, from a fresh connection: ms each."""
    x = np.random.default_rng(0).standard_normal((1, *bundle.manifest.split(SPLITS[0]).tensor.shape), dtype=np.float32)

    async def go() -> list[float]:
        client = await HostClient.connect("127.0.0.1", port, timeout=30)
        try:
            times = []
            for _ in range(requests):
                started = time.perf_counter()
                await client.request({"op": "infer", "bundle": bundle.id, "split": SPLITS[0]}, 60.0, x)
                times.append((time.perf_counter() - started) * 1000)
            return times
        finally:
            await client.close()

    return asyncio.run(go())


PING = encode_bytes({"op": "ping", "id": 1})


def open_idle(port: int, count: int, first: bytes | None = None, sources: int = 40) -> list[socket.socket]:
    """``count`` connections from 127.0.0.2 onwards (``sources`` addresses, in turn); with ``first``,
    each sends that frame and reads one reply before the next opens (one the host closes is left out)."""
    socks = []
    for i in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(f"127.0.0.{2 + i % sources}", 0))
        if first is not None:
            try:
                sock.sendall(first)
                (length,) = struct.unpack(">I", _exactly(sock, 4))
                _exactly(sock, length)
            except (OSError, ConnectionError):
                sock.close()
                continue
        socks.append(sock)
    return socks


@contextlib.contextmanager
def trickling(port: int, count: int) -> Iterator[None]:
    """``count`` connections that announce a 64 MiB frame, then send a byte a second each."""
    socks = [socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(f"127.0.0.{2 + i % 40}", 0))
             for i in range(count)]
    for sock in socks:
        sock.sendall(struct.pack(">I", 64 * MiB) + b"\x00")
    stop = threading.Event()

    def trickle() -> None:
        while not stop.wait(1.0):
            for sock in socks:
                with contextlib.suppress(OSError):
                    sock.send(b"\x00")

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)
        for sock in socks:
            sock.close()


@contextlib.contextmanager
def bombing(port: int) -> Iterator[dict[str, int]]:
    """A connection sending decode bombs, one after another, each after the last one's answer."""
    body = b"\x83\xa2id\x01\xa2op\xa4ping\xa1x\xdd" + (1 << 24).to_bytes(4, "big") + b"\x90" * (1 << 24)
    frame = struct.pack(">I", len(body)) + body
    stop, sent = threading.Event(), {"bombs": 0}

    def bomb() -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
            while not stop.is_set():
                sock.sendall(frame)
                (length,) = struct.unpack(">I", _exactly(sock, 4))
                _exactly(sock, length)
                sent["bombs"] += 1

    thread = threading.Thread(target=bomb, daemon=True)
    thread.start()
    try:
        yield sent
    finally:
        stop.set()
        thread.join(120)


def _exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


@contextlib.contextmanager
def silent_peer() -> Iterator[str]:
    """Answers hello, then nothing."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    hello = b"".join(bytes(b) for b in encode_message(HelloReply(1, PROTOCOL_VERSION, {}, False, MiB, "cpu")))

    def serve(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(0.5)
            answered = False
            while not stop.is_set():
                try:
                    if not conn.recv(1 << 16):
                        return
                except socket.timeout:
                    continue
                except OSError:
                    return
                if not answered:
                    conn.sendall(hello)
                    answered = True

    def accept() -> None:
        server.settimeout(0.5)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except socket.timeout:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        server.close()


def phase(name: str, pid: int, port: int, bundle: Bundle, requests: int, during: Callable[[], Any]) -> dict[str, Any]:
    with during() as extra:
        time.sleep(1.0)
        rss_before = rss_mb(pid)
        times = board_latencies(port, bundle, requests)
        result = {"phase": name, **summary(times), "rss_mb": max(rss_before, rss_mb(pid))}
    if isinstance(extra, dict):  # after the block: observers count what they did as they stop
        result.update(extra)
    print(f"  {name}: {result}", flush=True)
    return {**result, "times": times}


def settle(pid: int, limit_s: float = 30.0) -> None:
    """Until the host takes under two ticks of CPU in half a second (its start's warm-ups done)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        before = cpu_s(pid)
        time.sleep(0.5)
        if cpu_s(pid) - before < 0.015:
            return


def request_cpu(pid: int, port: int, message: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    async def go() -> dict[str, Any]:
        client = await HostClient.connect("127.0.0.1", port, timeout=30)
        try:
            try:
                return await client.request(message, 120.0)
            except Exception as exc:  # a typed refusal is a figure too
                return {"error": str(exc)}
        finally:
            await client.close()

    settle(pid)
    before = cpu_s(pid)
    reply = asyncio.run(go())
    time.sleep(0.3)  # the reply leaves before the host's last bookkeeping
    return (cpu_s(pid) - before) * 1000, reply


def first_ping_s(port: int, credentials: Credentials = Credentials()) -> dict[str, Any]:
    """A new board from 127.0.0.1: seconds from connecting to its first ping's answer, or why not."""
    async def go() -> dict[str, Any]:
        started = time.monotonic()
        try:
            client = await HostClient.connect("127.0.0.1", port, timeout=30, credentials=credentials)
        except Exception as exc:
            return {"admitted": False, "error": str(exc)[:160], "s": time.monotonic() - started}
        try:
            await client.ping(timeout=30)
            return {"admitted": True, "s": time.monotonic() - started}
        except Exception as exc:
            return {"admitted": False, "error": str(exc)[:160], "s": time.monotonic() - started}
        finally:
            await client.close()

    return asyncio.run(go())


def scraped(metrics_port: int) -> dict[str, Any]:
    """The host's figures from its ``/metrics`` (plain HTTP: neither the cap nor TLS stands in the way)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30) as answer:
        return stats_from(text_string_to_metric_families(answer.read().decode()))


def admitted_within(port: int, credentials: Credentials, limit_s: float = 15.0) -> dict[str, Any]:
    """A board that tries again at once where it is refused: its first try, and the seconds until one is admitted."""
    started, tries = time.monotonic(), []
    while time.monotonic() - started < limit_s:
        tries.append(first_ping_s(port, credentials))
        if tries[-1]["admitted"]:
            break
    return {"first_try": tries[0], "tries": len(tries),
            "admitted_after_s": time.monotonic() - started if tries[-1]["admitted"] else None}


def lockout(bundle_dir: Path, proven: int) -> dict[str, Any]:
    """The default cap (1,024): ``proven`` connections from 127.0.0.2-9 each ping once, read the
    answer and go idle; then a new board from 127.0.0.1."""
    pages: dict[str, int] = {}
    with host(bundle_dir, "--metrics-port", "0", pages=pages) as (process, port):
        socks = open_idle(port, proven, first=PING, sources=8)
        try:
            time.sleep(1.0)
            board = first_ping_s(port)
            stats = scraped(pages["metrics"])
            closed = stats.get("connections_closed", {})
            return {"proven": proven, "answered_ping": len(socks), "new_board_admitted": board["admitted"],
                    "new_board_first_ping_s": board["s"], "error": board.get("error"),
                    "shed_beyond_share": closed.get("shed_beyond_share"), "connections": stats.get("connections"),
                    "closed": closed}
        finally:
            for sock in socks:
                sock.close()


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def tls_handshakes(bundle_dir: Path, count: int) -> dict[str, Any]:
    """A TLS host (a self-signed certificate made now); ``count`` TCP connections from 127.0.0.2-41
    that never start the handshake: the host's connections gauge, its file descriptors and RSS,
    a TLS board admitted meanwhile, and seconds until the host has closed every one of them."""
    from tests.host_runtime.test_auth import make_cert  # the tests' openssl call, not a copy

    with tempfile.TemporaryDirectory() as folder:
        cert, key = make_cert(Path(folder), "host", "IP:127.0.0.1")
        credentials = Credentials(tls=client_context(cert))
        pages: dict[str, int] = {}
        with host(bundle_dir, "--tls-cert", str(cert), "--tls-key", str(key), "--metrics-port", "0",
                  pages=pages) as (process, port):
            pid = process.pid
            time.sleep(0.5)
            before = {"fds": fds(pid), "rss_mb": rss_mb(pid)}
            started, socks, opened = time.monotonic(), [], []

            def open_all() -> None:
                socks.extend(open_idle(port, count))
                opened.append(time.monotonic() - started)

            opening = threading.Thread(target=open_all, daemon=True)
            opening.start()
            time.sleep(5.0)
            board_opening = admitted_within(port, credentials)  # while they are still being opened
            opening.join()
            opened_s = opened[0]
            time.sleep(1.0)
            during = {"fds": fds(pid), "rss_mb": rss_mb(pid)}
            stats = scraped(pages["metrics"])
            board = admitted_within(port, credentials)
            selector = selectors.DefaultSelector()
            for sock in socks:
                sock.setblocking(False)
                selector.register(sock, selectors.EVENT_READ)
            open_count, last_closed = len(socks), None
            while open_count and time.monotonic() - started < 90:
                for key_, _ in selector.select(0.5):
                    with contextlib.suppress(OSError):
                        if key_.fileobj.recv(4096):
                            continue
                    selector.unregister(key_.fileobj)
                    open_count -= 1
                    last_closed = time.monotonic() - started
            for sock in socks:
                sock.close()
            after = scraped(pages["metrics"])
            return {"connections": count, "opened_in_s": opened_s, "gauge_connections": stats.get("connections"),
                    "host_fds": during["fds"], "host_fds_before": before["fds"],
                    "rss_added_mb": during["rss_mb"] - before["rss_mb"], "tls_board": board,
                    "tls_board_while_opening": board_opening,
                    "all_closed_s": last_closed if open_count == 0 else None, "still_open": open_count,
                    "all_closed_after_last_open_s": last_closed - opened_s if open_count == 0 else None,
                    "closed": after.get("connections_closed", {}), "gauge_after": after.get("connections")}


def _send_big(port: int, frame: bytes, report: Any) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        started = time.monotonic()
        sock.sendall(frame)
        sent = time.monotonic()
        (length,) = struct.unpack(">I", _exactly(sock, 4))
        reply = _exactly(sock, length)
        report.send({"send_s": sent - started, "answer_s": time.monotonic() - started,
                     "reply": str({k: v for k, v in msgpack.unpackb(reply).items() if k != "tensor"})[:160]})


def big_frame(bundle_dir: Path, bundle: Bundle, samples: int, quiet_s: float = 3.0) -> dict[str, Any]:
    """An ``infer offload`` of a uint8 tensor of ``samples`` images (445: 63.9 MiB) sent by a
    process of its own while this one pings the host every 5 ms on another connection: each
    ping's round trip, quiet (before) and during (from the first byte sent to the answer)."""
    shape = (samples, *bundle.manifest.model.input_shape)
    tensor = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
    frame = encode_bytes({"op": "infer", "id": 1, "bundle": bundle.id, "split": OFFLOAD}, tensor,
                         scale=1 / 255, zero_point=0)
    del tensor
    with host(bundle_dir, "--max-frame-mb", "80", "--max-queue", str(samples + 64), "--max-batch", "64") as (_, port):
        async def pings(until: Callable[[], bool]) -> list[float]:
            client = await HostClient.connect("127.0.0.1", port, timeout=30)
            try:
                times = []
                while not until():
                    times.append(await client.ping(timeout=60))
                    await asyncio.sleep(0.005)
                return times
            finally:
                await client.close()

        end = time.monotonic() + quiet_s
        quiet = asyncio.run(pings(lambda: time.monotonic() > end))
        context = multiprocessing.get_context("fork")
        report_there, report_here = context.Pipe()
        sender = context.Process(target=_send_big, args=(port, frame, report_there), daemon=True)
        sender.start()
        during = asyncio.run(pings(lambda: report_here.poll() or not sender.is_alive()))
        sent = report_here.recv() if report_here.poll(5) else {"error": f"sender exit {sender.exitcode}"}
        sender.join(10)
    return {"frame_mib": len(frame) / MiB, "samples": samples, "quiet": ping_summary(quiet),
            "during": ping_summary(during), **sent}


def ping_summary(times: list[float]) -> dict[str, Any]:
    return {"pings": len(times), **summary(times), "max_ms": max(times)} if times else {"pings": 0}


def request_bytes(message: dict[str, Any]) -> int:
    return len(encode_bytes({**message, "id": 1}))


def profile_rows(pid: int, port: int, bundle: Bundle, peer_port: int | None, repeats: int = 3) -> dict[str, Any]:
    """Host CPU (from /proc, the host idle before each) for issue 27's ``profile`` requests (and a
    ``links``, with a peer), each sent ``repeats`` times on a fresh connection: the most of them,
    with the request's bytes on the wire, its CPU per KB and its budget (100 ms per KB begun)."""
    requests = {
        "profile (1 tail, batches 1-4, 20 repeats)": {"op": "profile", "bundle": bundle.id, "splits": [SPLITS[1]],
                                                     "batches": [1, 2, 4], "repeats": 20},
        "profile (1 tail, batches 1-16, 20 repeats)": {"op": "profile", "bundle": bundle.id, "splits": [SPLITS[1]],
                                                      "batches": [1, 2, 4, 8, 16], "repeats": 20},
        "profile (offload, batches 64,63,27, 50 repeats)": {"op": "profile", "bundle": bundle.id, "splits": [OFFLOAD],
                                                           "batches": [64, 63, 27], "repeats": 50},
    }
    if peer_port is not None:
        requests["links (2 peers x 4 MiB)"] = {"op": "links", "peers": [f"127.0.0.1:{peer_port}"] * 2,
                                               "bytes": 4 * MiB}
    rows = {}
    for name, message in requests.items():
        tries = [request_cpu(pid, port, message) for _ in range(repeats)]
        ms = max(t[0] for t in tries)
        size = request_bytes(message)
        rows[name] = {"host_cpu_ms": ms, "host_cpu_ms_each": [t[0] for t in tries], "bytes": size,
                      "ms_per_kb": ms / (size / 1024), "budget_ms": 100 * math.ceil(size / 1024),
                      "answered": sum("tail_ms" in t[1] or "links" in t[1] for t in tries),
                      "replies": [str(t[1])[:160] for t in tries]}
    return rows


def shutdown_time(bundle_dir: Path, bundle: Bundle) -> dict[str, Any]:
    """SIGTERM with issue 27's load pending: queued offload batches, a chain hop and a links request
    to a silent peer. Seconds from the signal to the exit."""
    with silent_peer() as peer, host(bundle_dir, "--workers", "1", "--max-batch", "128", "--max-queue", "512",
                                     "--peer", peer) as (process, port):
        x = np.random.default_rng(0).standard_normal((106, *bundle.manifest.model.input_shape), dtype=np.float32)
        cut = np.random.default_rng(0).standard_normal((1, *bundle.manifest.split(SPLITS[0]).tensor.shape),
                                                        dtype=np.float32)

        async def load() -> float:
            client = await HostClient.connect("127.0.0.1", port, timeout=30)
            pending = [asyncio.ensure_future(client.request({"op": "infer", "bundle": bundle.id, "split": OFFLOAD},
                                                              120.0, x)) for _ in range(3)]
            pending.append(asyncio.ensure_future(client.infer(bundle.id, CHAIN, cut, 120.0,
                                                              leg=Leg(1, (Hop(peer, CHAIN, 2),)))))
            other = await HostClient.connect("127.0.0.1", port, timeout=30)
            pending.append(asyncio.ensure_future(other.request({"op": "links", "peers": [peer], "bytes": 1024}, 120.0)))
            await asyncio.sleep(1.5)  # everything read and pending
            started = time.monotonic()
            process.send_signal(signal.SIGTERM)
            while process.poll() is None:
                await asyncio.sleep(0.01)
            took = time.monotonic() - started
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            return took

        took = asyncio.run(load())
        return {"shutdown_s": took, "exit_status": process.returncode}


@contextlib.contextmanager
def half_open(port: int, count: int) -> Iterator[dict[str, Any]]:
    """``count`` half-open connections to a page, and how long a new poller then waits for its answer."""
    with observers(port, half_open=count) as counts:
        yield counts
        counts["new_poller_answered_s"] = first_answer_s(port, "/state.json")


def measure_host(args: argparse.Namespace, bundle: Bundle, results: dict[str, Any]) -> None:
    """The host's rows: issue 27's phases, issue 45's watched phases, the profile requests, the
    lockout by proven connections, TLS handshakes, a 64 MiB frame and the shutdown."""
    pages: dict[str, int] = {}
    with host(args.bundle) as (_, peer_port), host(
        args.bundle, "--max-connections", str(args.idle + 64), "--first-frame-timeout", "600", "--max-batch", "1",
        "--peer", f"127.0.0.1:{peer_port}", "--metrics-port", "0", "--live", "127.0.0.1:0", pages=pages,
    ) as (process, port):
        pid = process.pid

        def run(name: str, during: Callable[[], Any]) -> None:
            results["phases"].append(measure(name, during))
            results["phases"][-1].pop("times")

        def measure(name: str, during: Callable[[], Any]) -> dict[str, Any]:
            try:
                return phase(name, pid, port, bundle, args.requests, during)
            finally:
                time.sleep(2.0)

        run("quiet", contextlib.nullcontext)

        @contextlib.contextmanager
        def idle() -> Iterator[dict[str, Any]]:
            before = rss_mb(pid)
            started = time.monotonic()
            socks = open_idle(port, args.idle)
            opened_s = time.monotonic() - started
            try:
                time.sleep(1.0)
                yield {"connections": len(socks), "opened_in_s": opened_s, "rss_added_mb": rss_mb(pid) - before}
            finally:
                for sock in socks:
                    sock.close()

        run(f"{args.idle} idle connections", idle)
        run(f"{args.slow} slow-loris", lambda: trickling(port, args.slow))
        run("decode bombs (16 MiB)", lambda: bombing(port))

        @contextlib.contextmanager
        def watched_page() -> Iterator[dict[str, Any]]:
            with observers(pages["live"], pollers=args.watchers, streams=args.streams) as counts:
                socks = open_idle(port, args.boards, first=PING)
                try:
                    time.sleep(1.0)
                    counts["boards"] = len(socks)
                    yield counts
                finally:
                    for sock in socks:
                        sock.close()


        watched = [("quiet", contextlib.nullcontext),
                   (f"{args.watchers} metrics scrapers",
                    lambda: observers(pages["metrics"], "/metrics", pollers=args.watchers)),
                   (f"page: {args.boards} boards, {args.watchers} pollers, {args.streams} streams", watched_page),
                   (f"page: {args.half_open} half-open", lambda: half_open(pages["live"], args.half_open))]
        results["watched_rounds"], results["watched"] = alternate(
            [(name, lambda label, during=during: measure(label, during)) for name, during in watched], args.rounds)
        results["load_average"].append(os.getloadavg())
        results["requests"] = profile_rows(pid, port, bundle, peer_port)
    with host(args.bundle, threads=None) as (process, port):  # the product's default pool, spinning
        results["requests_default_threads"] = profile_rows(process.pid, port, bundle, None)
    results["lockout"] = lockout(args.bundle, args.proven)
    print(f"  lockout: {results['lockout']}", flush=True)
    results["tls"] = tls_handshakes(args.bundle, args.handshakes)
    print(f"  tls: {results['tls']}", flush=True)
    results["big_frame"] = big_frame(args.bundle, bundle, args.big_samples)
    print(f"  big frame: {results['big_frame']}", flush=True)
    results["shutdown"] = shutdown_time(args.bundle, bundle)


def measure_board(args: argparse.Namespace, bundle: Bundle, results: dict[str, Any]) -> None:
    """The board's rows: its frames a second watched (its own page polled, a copy of it polled from
    another process, half-open page connections)."""

    @contextlib.contextmanager
    def pollers_of_a_copy(board_port: int) -> Iterator[dict[str, Any]]:
        with copy_of_page(board_port) as port_, observers(port_, pollers=args.watchers, streams=args.streams) as counts:
            yield counts

    board = [("quiet", contextlib.nullcontext),
             (f"{args.watchers} pollers, {args.streams} streams",
              lambda p: observers(p, pollers=args.watchers, streams=args.streams)),
             (f"{args.watchers} pollers, {args.streams} streams of a copy", pollers_of_a_copy),
             (f"{args.half_open} half-open", lambda p: half_open(p, args.half_open))]

    def board_phase(label: str, watch: Callable[[int], Any]) -> dict[str, Any]:
        result = {"phase": label, **board_fps(args.bundle, watch, window_s=args.window)}
        print(f"  board, {label}: { {k: v for k, v in result.items() if k != 'times'} }", flush=True)
        return result

    results["board_rounds"], results["board"] = alternate(
        [(name, lambda label, watch=watch: board_phase(label, watch)) for name, watch in board], args.rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, default=Path("build/test-bundle"))
    parser.add_argument("--requests", type=int, default=300, help="board infers per phase")
    parser.add_argument("--idle", type=int, default=10_000)
    parser.add_argument("--slow", type=int, default=200)
    parser.add_argument("--watchers", type=int, default=20, help="pollers (or scrapers) in a loop")
    parser.add_argument("--streams", type=int, default=4, help="event streams beside the pollers")
    parser.add_argument("--boards", type=int, default=1000, help="idle boards on the host beside its page's pollers")
    parser.add_argument("--half-open", type=int, default=2000, help="half-open page connections")
    parser.add_argument("--proven", type=int, default=1100, help="connections that ping once and go idle")
    parser.add_argument("--handshakes", type=int, default=5000, help="TCP connections that never start TLS")
    parser.add_argument("--big-samples", type=int, default=445, help="images in the uint8 offload frame (445: 63.9 MiB)")
    parser.add_argument("--window", type=float, default=6.0, help="seconds the board's frames are counted per phase")
    parser.add_argument("--rounds", type=int, default=3, help="issue 45's phases (and a quiet one) in turn, this often")
    parser.add_argument("--only", choices=("host", "board"), default=None,
                        help="measure only the host's rows or only the board's (default: both)")
    parser.add_argument("--pin", action="store_true",
                        help="start two busy processes, one on each of CPUs 0 and 1; run the side measured (the host "
                             "and the good board, or the board) on CPU 0 and every watcher on CPU 1, as watchers on "
                             "other machines would be (run it without busy processes of your own)")
    parser.add_argument("--out", type=Path, default=Path("build/bench/walls.json"))
    args = parser.parse_args()
    if args.pin:
        CPUS.update(measured={0}, watchers={1})
        place("measured")  # this process times the good board's infers
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the idle connections' sockets, on this side
    bundle = Bundle.load(args.bundle)
    results: dict[str, Any] = {"machine": platform.platform(), "cpus": os.cpu_count(), "args": vars(args),
                               "load_average": [os.getloadavg()], "phases": []}
    with busy([0, 1]) if args.pin else contextlib.nullcontext():
        if args.only != "board":
            measure_host(args, bundle, results)
        if args.only != "host":
            measure_board(args, bundle, results)
    results["load_average"].append(os.getloadavg())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, default=str))
    print_table(results)
    print(f"wrote {args.out}")


def print_table(results: dict[str, Any]) -> None:
    if "watched" in results:
        print_host(results)
    if "board" in results:
        print_board(results)


def print_host(results: dict[str, Any]) -> None:
    for title, phases in (("host phase, issue 27 (a board infers)", results["phases"]),
                          (f"host phase, issue 45 ({results['args']['rounds']} rounds pooled)", results["watched"])):
        quiet = phases[0]
        print(f"\n{title:50s} {'p50 ms':>8s} {'p99 ms':>8s} {'p99/quiet':>9s} {'host RSS MB':>11s}  p99 each round"
              " (ratio to its round's quiet, median)")
        for p in phases:
            ratios = " ".join(f"{x:.2f}" for x in p.get("p99_ms_ratio_each", []))
            print(f"{p['phase']:50s} {p['p50_ms']:8.2f} {p['p99_ms']:8.2f} {p['p99_ms'] / quiet['p99_ms']:9.2f} "
                  f"{p['rss_mb']:11.1f}  {' '.join(f'{x:.1f}' for x in p.get('p99_each_ms', []))}"
                  + (f" ({ratios}; {p['p99_ms_ratio_median']:.2f})" if ratios else ""))
    for title, rows in (("--threads 1", results["requests"]), ("default threads", results["requests_default_threads"])):
        print(f"\n{'request, host ' + title:50s} {'bytes':>6s} {'CPU ms':>7s} {'ms/KB':>7s} {'budget':>7s}  (the most of 3)")
        for name, r in rows.items():
            print(f"{name:50s} {r['bytes']:6d} {r['host_cpu_ms']:7.1f} {r['ms_per_kb']:7.1f} {r['budget_ms']:7d}  "
                  f"{r['answered']} of {len(r['replies'])} answered; each {r['host_cpu_ms_each']}")
    lock, tls, big = results["lockout"], results["tls"], results["big_frame"]
    print(f"\nlockout: {lock['answered_ping']} of {lock['proven']} proven connections idle; a new board "
          f"{'admitted' if lock['new_board_admitted'] else 'REFUSED'}, first ping answered at "
          f"{lock['new_board_first_ping_s']:.3f} s; shed beyond share: {lock['shed_beyond_share']}, refused at the cap: "
          f"{lock['closed'].get('max_connections')}")
    print(f"TLS: {tls['connections']} handshakes never started: gauge {tls['gauge_connections']}, host fds "
          f"{tls['host_fds']} (before {tls['host_fds_before']}), RSS +{tls['rss_added_mb']:.1f} MB, opened in "
          f"{tls['opened_in_s']:.1f} s, all closed {tls['all_closed_after_last_open_s']} s after the last opened "
          f"({tls['still_open']} left; closed by the host: {tls['closed']}); a TLS board meanwhile: first try "
          f"{'admitted' if tls['tls_board']['first_try']['admitted'] else 'REFUSED'} in {tls['tls_board']['first_try']['s']:.3f} s "
          f"({tls['tls_board']['first_try'].get('error')}), admitted after {tls['tls_board']['admitted_after_s']} s, "
          f"{tls['tls_board']['tries']} tries; while they were being opened: first try "
          f"{'admitted' if tls['tls_board_while_opening']['first_try']['admitted'] else 'REFUSED'} in "
          f"{tls['tls_board_while_opening']['first_try']['s']:.3f} s")
    print(f"{big['frame_mib']:.1f} MiB uint8 frame: another connection's ping p99/max {big['during'].get('p99_ms', 0):.1f}/"
          f"{big['during'].get('max_ms', 0):.1f} ms against {big['quiet']['p99_ms']:.1f}/{big['quiet']['max_ms']:.1f} quiet; "
          f"(the most added to the quiet median: {big['during'].get('max_ms', 0) - big['quiet']['p50_ms']:.1f} ms); "
          f"sent in {big.get('send_s', 0):.2f} s, answered at {big.get('answer_s', 0):.2f} s: {big.get('reply')}")
    print(f"shutdown under issue 27's load: {results['shutdown']['shutdown_s']:.2f} s, "
          f"exit status {results['shutdown']['exit_status']}")



def print_board(results: dict[str, Any]) -> None:
    quiet = results["board"][0]
    print(f"\n{'board phase (--split local, live page)':50s} {'fps':>8s} {'fps/quiet':>9s} {'p99 ms':>8s} {'p99/quiet':>9s}"
          "  fps each round (ratio to its round's quiet, median)")
    for p in results["board"]:
        print(f"{p['phase']:50s} {p['fps']:8.1f} {p['fps'] / quiet['fps']:9.2f} {p['p99_ms']:8.1f} "
              f"{p['p99_ms'] / quiet['p99_ms']:9.2f}  {' '.join(f'{x:.1f}' for x in p['fps_each'])} "
              f"({' '.join(f'{x:.2f}' for x in p['fps_ratio_each'])}; {p['fps_ratio_median']:.2f})")
    own = next(p for p in results["board"] if p["phase"].endswith("streams"))
    copy = next(p for p in results["board"] if p["phase"].endswith("of a copy"))
    ratios = [a / b for a, b in zip(own["fps_each"], copy["fps_each"])]
    print(f"{'pollers of its own page / pollers of a copy':50s} {own['fps'] / copy['fps']:8.2f}  each round "
          f"{' '.join(f'{x:.2f}' for x in ratios)}; median {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
