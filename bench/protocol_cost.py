"""Protocol cost: encode + send + receive + decode of a cut tensor, against raw bytes on a plain socket.

Both sides run in the same way in the same run: a server process on 127.0.0.1 and a client
here sending one request at a time and waiting for a small acknowledgement.

- splitedge: the real ``HostClient`` sends ``ping`` with the tensor (the frame is built by the
  codec, the tensor written from a memoryview); the real ``HostServer`` reassembles the frame,
  decodes the msgpack map and views the tensor, then replies.
- raw: a blocking socket sends a 4-byte length and the tensor's bytes; a blocking server
  reads exactly that many bytes and answers one byte. No framing work, no event loop.

Targets (issue 2): at least 0.8 of raw throughput for 1x32x112x112, at most 100 µs of added
time per request for 1x1280x7x7.

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
import time
from pathlib import Path

import numpy as np

from device_runtime.client import HostClient
from host_runtime.server import HostServer, ServerConfig
from host_runtime.tails import TailRegistry

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
    parser.add_argument("--out", type=Path, default=Path("build/bench/protocol_cost.json"))
    args = parser.parse_args()

    rows = []
    for name, shape in SHAPES.items():
        tensor = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
        # Fresh servers per shape so one case's buffers do not warm the other's.
        proto_server, proto_port = _start(_serve_splitedge)
        raw_server, raw_port = _start(_serve_raw)
        try:
            proto = time_splitedge(proto_port, tensor, args.repeats, args.warmup)
            raw = time_raw(raw_port, tensor, args.repeats, args.warmup)
        finally:
            proto_server.terminate()
            raw_server.terminate()
        p_med, r_med = statistics.median(proto), statistics.median(raw)
        rows.append({
            "tensor": name,
            "bytes": tensor.nbytes,
            "splitedge_median_us": p_med * 1e6,
            "raw_median_us": r_med * 1e6,
            "overhead_us": (p_med - r_med) * 1e6,
            "splitedge_MBps": tensor.nbytes / p_med / 1e6,
            "raw_MBps": tensor.nbytes / r_med / 1e6,
            "throughput_ratio": r_med / p_med,
        })

    print(f"{'tensor':14s} {'bytes':>9s} {'splitedge µs':>13s} {'raw µs':>9s} {'overhead µs':>12s} "
          f"{'splitedge MB/s':>15s} {'raw MB/s':>9s} {'ratio':>6s}")
    for r in rows:
        print(f"{r['tensor']:14s} {r['bytes']:9d} {r['splitedge_median_us']:13.1f} {r['raw_median_us']:9.1f} "
              f"{r['overhead_us']:12.1f} {r['splitedge_MBps']:15.1f} {r['raw_MBps']:9.1f} {r['throughput_ratio']:6.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "protocol_cost", "repeats": args.repeats, "machine": platform.machine(),
        "python": platform.python_version(), "rows": rows,
    }, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
