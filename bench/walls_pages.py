"""Observers for bench/walls.py (issue 45): pollers, scrapers, event streams and half-open
connections against a live page or the metrics endpoint, in a process of their own, and the
board's frame rate while they watch.

The observers run in a forked child so that their threads never take the GIL of whatever is
measured in the bench's process (the good board's infers); the child's CPU seconds are reported
with its counts, since on a 2-core machine the watchers' own work is part of what the run pays.

- a poller: ``GET path`` (one request per connection, ``Connection: close``) again as soon as
  the last one is answered;
- a stream: ``GET /events``, read for as long as the server sends, reconnected when closed;
- a half-open connection: sends ``GET /state.json HTTP/1.1`` and one header line, and never the
  blank line that ends the request; one closed by the server is opened again a second later,
  so ``half_open`` of them are being attempted throughout.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import resource
import selectors
import signal
import statistics
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator

ROOT = Path(__file__).resolve().parents[1]
HALF_REQUEST = b"GET /state.json HTTP/1.1\r\nHost: 127.0.0.1\r\n"
CAMERA_FPS = 200  # the synthetic camera's rate: above what the board answers, so it is CPU-bound
#: ``--pin``'s CPUs: the side measured (the host or the board) and its watchers, as if on other
#: machines; None leaves both where the scheduler puts them.
CPUS: dict[str, set[int] | None] = {"measured": None, "watchers": None}


def place(role: str) -> None:
    """Keep this process (and what it starts) on ``role``'s CPUs, where ``--pin`` named them."""
    if CPUS[role] is not None:
        os.sched_setaffinity(0, CPUS[role])


@contextlib.contextmanager
def busy(cpus: list[int]) -> Iterator[None]:
    """A process spinning on each CPU in ``cpus`` while the block runs: ``--pin``'s two busy
    processes, one beside the side measured and one beside its watchers, so the scheduler cannot
    move one load onto the other's CPU between phases."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=lambda cpu=cpu: os.sched_setaffinity(0, {cpu}))
                for cpu in cpus]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait(10)


def http_get(port: int, path: str, timeout: float = 10.0) -> tuple[int, int]:
    """One ``GET`` to 127.0.0.1:port: (status, bytes of the answer); status 0 where it failed."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
            data = bytearray()
            while chunk := sock.recv(1 << 16):
                data += chunk
    except OSError:
        return 0, 0
    try:
        return int(bytes(data[9:12])), len(data)
    except ValueError:
        return 0, len(data)


def first_answer_s(port: int, path: str, timeout: float = 30.0) -> float | None:
    """Seconds until a fresh ``GET path`` is answered 200 (tried again at once if refused); None past ``timeout``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if http_get(port, path, timeout)[0] == 200:
            return time.monotonic() - started
        time.sleep(0.01)
    return None


def _observe(port: int, path: str, pollers: int, streams: int, half_open: int, stop: Any, report: Any,
             ready: Any) -> None:
    place("watchers")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    done = threading.Event()
    counts: dict[str, float] = {"polls": 0, "polls_failed": 0, "poll_bytes": 0, "stream_bytes": 0, "streams_opened": 0,
                                "half_open_opened": 0}
    lock = threading.Lock()

    def add(**values: int) -> None:
        with lock:
            for key, value in values.items():
                counts[key] += value

    def poll() -> None:
        while not done.is_set():
            status, size = http_get(port, path)
            add(polls=status == 200, polls_failed=status != 200, poll_bytes=size)
            if status != 200:
                done.wait(0.05)

    def stream() -> None:
        while not done.is_set():
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock:
                    sock.sendall(b"GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                    add(streams_opened=1)
                    while not done.is_set():
                        try:
                            chunk = sock.recv(1 << 16)
                        except socket.timeout:
                            continue
                        if not chunk:
                            break
                        add(stream_bytes=len(chunk))
            except OSError:
                pass
            done.wait(0.2)

    def half() -> None:
        selector = selectors.DefaultSelector()
        missing = half_open
        while not done.is_set():
            for _ in range(missing):
                try:
                    sock = socket.create_connection(("127.0.0.1", port), timeout=5.0)
                    sock.setblocking(False)
                    sock.send(HALF_REQUEST)
                    selector.register(sock, selectors.EVENT_READ)
                    add(half_open_opened=1)
                except OSError:
                    pass
            missing = 0
            if not ready.is_set():
                counts["half_open_opened_in_s"] = time.monotonic() - started
                ready.set()
            deadline = time.monotonic() + 1.0
            while not done.is_set() and time.monotonic() < deadline:
                for key, _ in selector.select(0.2):
                    try:
                        data = key.fileobj.recv(4096)
                    except OSError:
                        data = b""
                    if not data:  # closed (or shed) by the server: opened again next round
                        selector.unregister(key.fileobj)
                        key.fileobj.close()
                        missing += 1
        for key in list(selector.get_map().values()):
            key.fileobj.close()

    started = time.monotonic()
    if not half_open:
        ready.set()
    threads = [threading.Thread(target=poll, daemon=True) for _ in range(pollers)]
    threads += [threading.Thread(target=stream, daemon=True) for _ in range(streams)]
    if half_open:
        threads.append(threading.Thread(target=half, daemon=True))
    for thread in threads:
        thread.start()
    stop.recv()
    done.set()
    for thread in threads:
        thread.join(12)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    report.send({**counts, "observer_cpu_s": usage.ru_utime + usage.ru_stime})


@contextlib.contextmanager
def observers(port: int, path: str = "/state.json", pollers: int = 0, streams: int = 0,
              half_open: int = 0) -> Iterator[dict[str, Any]]:
    """Watchers of 127.0.0.1:port in a child process while the block runs; the dict yielded is
    filled with their counts (and the child's CPU seconds) when it ends."""
    context = multiprocessing.get_context("fork")
    stop_here, stop_there = context.Pipe()
    report_there, report_here = context.Pipe()
    ready = context.Event()
    child = context.Process(target=_observe, args=(port, path, pollers, streams, half_open, stop_there, report_there,
                                                   ready), daemon=True)
    child.start()
    result: dict[str, Any] = {"pollers": pollers, "streams": streams, "half_open": half_open}
    started = time.monotonic()
    try:
        ready.wait(120)  # the half-open connections all opened once (SYNs past a full backlog are retried)
        yield result
    finally:
        stop_here.send(None)
        if report_here.poll(30):
            result.update(report_here.recv())
        result["seconds"] = time.monotonic() - started
        child.join(10)
        if child.is_alive():
            child.kill()


class _Copy:
    """A page's source standing in for the board: the state the board served a new page, again."""

    def __init__(self, state: dict[str, Any]) -> None:
        self._state = state

    def state(self, since: int | None) -> tuple[dict[str, Any], int]:
        return self._state, 0

    def picture(self) -> None:
        return None


def _serve_copy(body: bytes, port: Any, stop: Any, cpus: set[int] | None) -> None:
    from device_runtime.live import LiveServer

    if cpus is not None:  # a spawned child: the watchers' CPUs come as an argument
        os.sched_setaffinity(0, cpus)

    with LiveServer(_Copy(json.loads(body)), "<!doctype html><title>copy</title>") as server:
        port.send(server.address[1])
        stop.recv()


def http_body(port: int, path: str, timeout: float = 10.0) -> bytes:
    """The body of one ``GET path`` answered 200 by 127.0.0.1:port."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        data = bytearray()
        while chunk := sock.recv(1 << 16):
            data += chunk
    head, _, body = bytes(data).partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"GET {path}: {head[:80]!r}")
    return body


@contextlib.contextmanager
def copy_of_page(board_port: int) -> Iterator[int]:
    """The board's page as a new page gets it, served by the same ``LiveServer`` (its walls, its
    duty) from a process of its own: pollers of it cost this machine what pollers of the board's
    page do (their own threads, the copies through loopback, the server's turns), but the board
    nothing. The board's frames a second with its own page polled, over those with this copy
    polled, is what serving the page costs the board, apart from what watching costs a machine
    that is both the board and its twenty watchers (issue 45)."""
    body = http_body(board_port, "/state.json")
    context = multiprocessing.get_context("spawn")
    port_here, port_there = context.Pipe()
    stop_here, stop_there = context.Pipe()
    child = context.Process(target=_serve_copy, args=(body, port_there, stop_there, CPUS["watchers"]),
                            daemon=True)
    child.start()
    try:
        if not port_here.poll(60):
            raise RuntimeError("the copy of the page did not start")
        yield port_here.recv()
    finally:
        stop_here.send(None)
        child.join(10)
        if child.is_alive():
            child.kill()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def board_fps(bundle_dir: Path, watch: Callable[[int], ContextManager[Any]], window_s: float = 6.0,
              settle_s: float = 2.0) -> dict[str, Any]:
    """A board (``split-device run --split local``, the synthetic camera at :data:`CAMERA_FPS`, a live
    page on 127.0.0.1) watched by ``watch(page port)``: frames answered a second and their p99
    capture-to-answer ms over ``window_s``, after ``settle_s`` of the watchers."""
    port = free_port()
    trace = Path(f"/tmp/walls-board-{os.getpid()}-{time.monotonic_ns()}.jsonl")
    frames = int(CAMERA_FPS * (window_s + settle_s + 60))
    command = [sys.executable, "-m", "device_runtime.cli", "run", str(bundle_dir.resolve()), "--camera", f"synthetic:{CAMERA_FPS}",
               "--split", "local", "--live", f"127.0.0.1:{port}", "--frames", str(frames), "--trace", str(trace),
               "--quiet"]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               stdin=subprocess.DEVNULL, preexec_fn=lambda: place("measured"))
    extra: dict[str, Any] = {}
    try:
        if first_answer_s(port, "/state.json", 60) is None:
            raise RuntimeError(f"the board's page did not answer: {process.stderr.read(4000) if process.poll() is not None else ''}")
        time.sleep(2.0)  # warmed up
        with watch(port) as extra:
            time.sleep(settle_s)
            window = (time.time(), time.time() + window_s)
            time.sleep(window_s)
            if isinstance(extra, dict) and extra.get("half_open"):
                extra["new_poller_answered_s"] = first_answer_s(port, "/state.json")
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
    started, answered = 0.0, []
    for line in trace.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("type") == "run":
            started = record["started_unix"]
        elif record.get("type") == "frame" and not record.get("dropped") and not record.get("error"):
            at = started + record["t"] + record["total_ms"] / 1000
            if window[0] <= at <= window[1]:
                answered.append(record["total_ms"])
    trace.unlink(missing_ok=True)
    return {"fps": len(answered) / window_s, "frames": len(answered), "window_s": window_s, **summary(answered),
            "times": answered, **(extra if isinstance(extra, dict) else {})}


def summary(times: list[float]) -> dict[str, float | None]:
    ordered = sorted(times)
    if not ordered:
        return {"p50_ms": None, "p99_ms": None}
    return {"p50_ms": statistics.median(ordered), "p99_ms": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]}


def alternate(kinds: list[tuple[str, Callable[[str], dict[str, Any]]]], rounds: int) -> tuple[list[dict], list[dict]]:
    """Each kind measured once a round, in turn, ``rounds`` times (so a quiet kind is never far
    from the others on a machine whose load drifts): every round's figures, and per kind its times
    pooled (p50/p99 over all rounds; frames a second over all windows) with its last round's counts."""
    each: list[dict[str, Any]] = []
    times: dict[str, list[float]] = {name: [] for name, _ in kinds}
    for round_ in range(rounds):
        for name, measure in kinds:
            result = measure(f"{name}, round {round_ + 1}")
            times[name] += result.pop("times")
            each.append({**result, "kind": name})
    pooled = []
    for name, _ in kinds:
        mine = [e for e in each if e["kind"] == name]
        row = {**mine[-1], "phase": name, **summary(times[name]), "rounds": rounds,
               "p99_each_ms": [e["p99_ms"] for e in mine]}
        if "frames" in row:
            row.update(fps=sum(e["frames"] for e in mine) / sum(e["window_s"] for e in mine),
                       fps_each=[e["fps"] for e in mine], frames=sum(e["frames"] for e in mine))
        if "rss_mb" in row:
            row["rss_mb"] = max(e["rss_mb"] for e in mine)
        pooled.append(row)
    for row in pooled:  # each round against that round's first kind (the quiet one): the drift between rounds cancels
        mine = [e for e in each if e["kind"] == row["phase"]]
        for key in ("p99_ms", "fps"):
            if key in row:
                row[f"{key}_ratio_each"] = [e[key] / q[key] for e, q in zip(mine, each[::len(kinds)])]
                row[f"{key}_ratio_median"] = statistics.median(row[f"{key}_ratio_each"])
    return each, pooled
