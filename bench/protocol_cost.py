"""Protocol cost: encode + send + receive + decode of a cut tensor, against raw bytes on a plain socket.

Both sides run in the same way in the same run: a server process on 127.0.0.1 and a client
here, in two modes:

- latency: one request at a time, each waiting for its small acknowledgement (median);
- throughput: a stream of requests with up to ``--window`` in flight (the raw client sends
  from one thread and reads acknowledgements in another), bytes per second over the stream.

- splitedge: the real ``HostClient`` sends ``ping`` with the tensor (the frame is built by the
  codec, the tensor written from a memoryview); the real ``HostServer`` reassembles the frame,
  decodes the msgpack map and views the tensor, then replies.
- raw: a blocking socket sends a 4-byte length and the tensor's bytes; a blocking server
  reads exactly that many bytes and answers one byte. No framing work, no event loop.

Targets (issue 2): at least 0.8 of raw throughput for 1x32x112x112, at most 100 µs of added
time per request for 1x1280x7x7 (latency mode).

    python bench/protocol_cost.py --out build/bench/protocol_cost.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import platform
import socket
import statistics
import struct
import threading
import time
from pathlib import Path

import numpy as np

from device_runtime.link import HostClient
from host_runtime._server import HostServer, ServerConfig
from host_runtime._tails import TailRegistry

SHAPES = {"1x32x112x112": (1, 32, 112, 112), "1x1280x7x7": (1, 1280, 7, 7)}


def _serve_splitedge(ready: mp.Queue) -> None:
    async def main() -> None:
        server = HostServer(TailRegistry([]), ServerConfig(host="127.0.0.1", port=0, workers=1))
        _, port = await server.start()
        ready.put(port)
        await asyncio.Event().wait()

    asyncio.run(main())


def _serve_raw(ready: mp.Queue) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    ready.put(listener.getsockname()[1])
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buffer = bytearray(64 << 20)
    view = memoryview(buffer)
    while True:
        header = conn.recv(4, socket.MSG_WAITALL)
        if len(header) < 4:
            return
        (length,) = struct.unpack(">I", header)
        # MSG_WAITALL: the kernel fills the whole body in one call, the fastest a plain socket reads.
        got = 0
        while got < length:
            got += conn.recv_into(view[got:length], length - got, socket.MSG_WAITALL)
        conn.sendall(b"\x01")


def _start(target) -> tuple[mp.Process, int]:
    ready: mp.Queue = mp.Queue()
    process = mp.Process(target=target, args=(ready,), daemon=True)
    process.start()
    return process, ready.get(timeout=30)


def time_splitedge(port: int, tensor: np.ndarray, repeats: int, warmup: int) -> list[float]:
    async def main() -> list[float]:
        client = await HostClient.connect("127.0.0.1", port)
        times = []
        for i in range(warmup + repeats):
            start = time.perf_counter()
            await client.request({"op": "ping"}, 10.0, tensor)
            if i >= warmup:
                times.append(time.perf_counter() - start)
        await client.close()
        return times

    return asyncio.run(main())


def stream_splitedge(port: int, tensor: np.ndarray, count: int, window: int) -> float:
    """Seconds to push ``count`` requests with at most ``window`` in flight."""

    async def main() -> float:
        client = await HostClient.connect("127.0.0.1", port)
        slots = asyncio.Semaphore(window)

        async def one() -> None:
            async with slots:
                await client.request({"op": "ping"}, 30.0, tensor)

        start = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(count)))
        elapsed = time.perf_counter() - start
        await client.close()
        return elapsed

    return asyncio.run(main())


def stream_raw(port: int, tensor: np.ndarray, count: int) -> float:
    """Seconds to push ``count`` length-prefixed frames and read their ``count`` acknowledgements."""
    data = memoryview(tensor.reshape(-1).view(np.uint8))
    header = struct.pack(">I", data.nbytes)
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def send_all() -> None:
            for _ in range(count):
                sock.sendall(header)
                sock.sendall(data)

        start = time.perf_counter()
        sender = threading.Thread(target=send_all)
        sender.start()
        acks = 0
        while acks < count:
            acks += len(sock.recv(count - acks))
        sender.join()
        return time.perf_counter() - start


def time_raw(port: int, tensor: np.ndarray, repeats: int, warmup: int) -> list[float]:
    data = memoryview(tensor.reshape(-1).view(np.uint8))
    header = struct.pack(">I", data.nbytes)
    times = []
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(warmup + repeats):
            start = time.perf_counter()
            sent = sock.sendmsg([header, data])  # one syscall for both, as a tuned sender would
            if sent < len(header):
                sock.sendall(header[sent:])
            sock.sendall(data[max(sent - len(header), 0) :])
            if sock.recv(1) != b"\x01":
                raise RuntimeError("raw server went away")
            if i >= warmup:
                times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--stream", type=int, default=2000, help="requests in the throughput stream")
    parser.add_argument("--window", type=int, default=8, help="requests in flight in the throughput stream")
    parser.add_argument("--out", type=Path, default=Path("build/bench/protocol_cost.json"))
    args = parser.parse_args()

    rows = []
    for name, shape in SHAPES.items():
        tensor = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
        # Fresh servers per case so one case's buffers do not warm the other's. The raw server
        # serves one connection, so the latency and the throughput runs each get their own.
        proto_server, proto_port = _start(_serve_splitedge)
        raw_servers = [_start(_serve_raw) for _ in range(2)]
        try:
            proto = time_splitedge(proto_port, tensor, args.repeats, args.warmup)
            raw = time_raw(raw_servers[0][1], tensor, args.repeats, args.warmup)
            proto_stream = stream_splitedge(proto_port, tensor, args.stream, args.window)
            raw_stream = stream_raw(raw_servers[1][1], tensor, args.stream)
        finally:
            for process in (proto_server, *(p for p, _ in raw_servers)):
                process.terminate()
        p_med, r_med = statistics.median(proto), statistics.median(raw)
        rows.append({
            "tensor": name,
            "bytes": tensor.nbytes,
            "splitedge_median_us": p_med * 1e6,
            "raw_median_us": r_med * 1e6,
            "overhead_us": (p_med - r_med) * 1e6,
            "splitedge_stream_MBps": tensor.nbytes * args.stream / proto_stream / 1e6,
            "raw_stream_MBps": tensor.nbytes * args.stream / raw_stream / 1e6,
            "throughput_ratio": raw_stream / proto_stream,
        })

    print(f"{'tensor':14s} {'bytes':>9s} | {'latency µs: splitedge':>21s} {'raw':>7s} {'overhead':>9s} | "
          f"{'stream MB/s: splitedge':>22s} {'raw':>7s} {'ratio':>6s}")
    for r in rows:
        print(f"{r['tensor']:14s} {r['bytes']:9d} | {r['splitedge_median_us']:21.1f} {r['raw_median_us']:7.1f} "
              f"{r['overhead_us']:9.1f} | {r['splitedge_stream_MBps']:22.1f} {r['raw_stream_MBps']:7.1f} "
              f"{r['throughput_ratio']:6.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "protocol_cost", "repeats": args.repeats, "stream": args.stream, "window": args.window,
        "machine": platform.machine(), "python": platform.python_version(), "rows": rows,
    }, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
