"""The host's walls under attack (issue 27), in one run: what each attack costs the host, and a good board.

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

Then the host's CPU for a few ``profile`` requests (one tail at batches 1-4 and 1-16, 20 repeats;
issue 27's 90-byte one of the full model) and one ``links`` (2 peers x 4 MiB, to a second host),
read from /proc (10 ms ticks); and the time
from SIGTERM to exit under issue 27's load (two 106-sample offload requests queued behind a
running one, a chain hop and a ``links`` to a peer that accepts and never answers).

    .venv-device/bin/python bench/walls.py --bundle build/test-bundle --out build/bench/walls.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import resource
import signal
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import msgpack
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from device_runtime import OFFLOAD, Bundle  # noqa: E402
from device_runtime.wire import PROTOCOL_VERSION, HelloReply, Hop, HostClient, encode_bytes, encode_message  # noqa: E402

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
def host(bundle: Path, *args: str) -> Iterator[tuple[subprocess.Popen, int]]:
    """``split-host serve`` on 127.0.0.1, a free port; (process, port)."""
    log = Path(f"/tmp/walls-host-{os.getpid()}-{time.monotonic_ns()}.log")
    command = [sys.executable, "-m", "host_runtime.cli", "serve", str(bundle), "--interface", "127.0.0.1", "--port", "0",
               "--no-zeroconf", "--threads", "1", *args]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            lines = [line for line in log.read_text().splitlines() if line.startswith("listening on ")]
            if lines:
                yield process, int(lines[0].split()[2].rstrip(";").rsplit(":", 1)[1])
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


def summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {"p50_ms": statistics.median(ordered), "p99_ms": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]}


def open_idle(port: int, count: int) -> list[socket.socket]:
    socks = []
    for i in range(count):
        socks.append(socket.create_connection(("127.0.0.1", port), timeout=30,
                                              source_address=(f"127.0.0.{2 + i % 40}", 0)))
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
        result = {"phase": name, **summary(board_latencies(port, bundle, requests)), "rss_mb": max(rss_before, rss_mb(pid))}
        if isinstance(extra, dict):
            result.update(extra)
    print(f"  {name}: {result}", flush=True)
    return result


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

    time.sleep(0.5)
    before = cpu_s(pid)
    reply = asyncio.run(go())
    time.sleep(0.3)  # the reply leaves before the host's last bookkeeping
    return (cpu_s(pid) - before) * 1000, reply


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
            pending.append(asyncio.ensure_future(client.infer(bundle.id, CHAIN, cut, 120.0, stage=1,
                                                              route=(Hop(peer, CHAIN, 2),))))
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, default=Path("build/test-bundle"))
    parser.add_argument("--requests", type=int, default=300, help="board infers per phase")
    parser.add_argument("--idle", type=int, default=10_000)
    parser.add_argument("--slow", type=int, default=200)
    parser.add_argument("--out", type=Path, default=Path("build/bench/walls.json"))
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the idle connections' sockets, on this side
    bundle = Bundle.load(args.bundle)
    results: dict[str, Any] = {"machine": platform.platform(), "cpus": os.cpu_count(),
                               "load_average": os.getloadavg(), "phases": []}
    with host(args.bundle) as (_, peer_port), host(
        args.bundle, "--max-connections", str(args.idle + 64), "--first-frame-timeout", "600", "--max-batch", "1",
        "--peer", f"127.0.0.1:{peer_port}",
    ) as (process, port):
        pid = process.pid
        results["phases"].append(phase("quiet", pid, port, bundle, args.requests, contextlib.nullcontext))

        @contextlib.contextmanager
        def idle() -> Iterator[dict[str, Any]]:
            before = rss_mb(pid)
            socks = open_idle(port, args.idle)
            try:
                time.sleep(1.0)
                yield {"connections": len(socks), "rss_added_mb": rss_mb(pid) - before}
            finally:
                for sock in socks:
                    sock.close()

        results["phases"].append(phase(f"{args.idle} idle connections", pid, port, bundle, args.requests, idle))
        time.sleep(2.0)
        results["phases"].append(phase(f"{args.slow} slow-loris", pid, port, bundle, args.requests,
                                       lambda: trickling(port, args.slow)))
        time.sleep(2.0)
        results["phases"].append(phase("decode bombs (16 MiB)", pid, port, bundle, args.requests, lambda: bombing(port)))
        profile_ms, profile_reply = request_cpu(pid, port, {"op": "profile", "bundle": bundle.id, "splits": [SPLITS[1]],
                                                            "batches": [1, 2, 4, 8, 16], "repeats": 20})
        small_ms, small_reply = request_cpu(pid, port, {"op": "profile", "bundle": bundle.id, "splits": [SPLITS[1]],
                                                        "batches": [1, 2, 4], "repeats": 20})
        links_ms, links_reply = request_cpu(pid, port, {"op": "links", "peers": [f"127.0.0.1:{peer_port}"] * 2,
                                                        "bytes": 4 * MiB})
        big_ms, big_reply = request_cpu(pid, port, {"op": "profile", "bundle": bundle.id, "splits": [OFFLOAD],
                                                    "batches": [64, 63, 27], "repeats": 50})
    results["requests"] = {
        "profile (1 tail, batches 1-4, 20 repeats)": {"host_cpu_ms": small_ms, "ok": "tail_ms" in small_reply,
                                                     "reply": str(small_reply)[:160]},
        "profile (1 tail, batches 1-16, 20 repeats)": {"host_cpu_ms": profile_ms, "ok": "tail_ms" in profile_reply,
                                                      "reply": str(profile_reply)[:160]},
        "profile (offload, batches 64,63,27, 50 repeats)": {"host_cpu_ms": big_ms, "ok": "tail_ms" in big_reply,
                                                           "reply": str(big_reply)[:160]},
        "links (2 peers x 4 MiB)": {"host_cpu_ms": links_ms, "ok": "links" in links_reply,
                                    "reply": str(links_reply)[:160]},
    }
    results["shutdown"] = shutdown_time(args.bundle, bundle)
    quiet = results["phases"][0]
    print(f"\n{'phase':28s} {'p50 ms':>8s} {'p99 ms':>8s} {'p99/quiet':>9s} {'host RSS MB':>11s}")
    for p in results["phases"]:
        print(f"{p['phase']:28s} {p['p50_ms']:8.2f} {p['p99_ms']:8.2f} {p['p99_ms'] / quiet['p99_ms']:9.2f} "
              f"{p['rss_mb']:11.1f}")
    for name, r in results["requests"].items():
        print(f"{name:50s} host CPU {r['host_cpu_ms']:8.1f} ms  ({'answered' if r['ok'] else 'refused'})")
    print(f"shutdown under issue 27's load: {results['shutdown']['shutdown_s']:.2f} s, "
          f"exit status {results['shutdown']['exit_status']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, default=str))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
