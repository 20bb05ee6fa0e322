"""The host's front end per request, in one process: the Python it runs, without sockets or tails.

``bench/host_load.py``'s ``front_us_per_request`` is the event loop's CPU per request under a real
load, kernel and all, and moves by tens of percent with whatever else the machine runs. This
measures only the host's own Python path, which does not: ``--boards`` connections of the real
``_HostProtocol`` on transports that only count what is written, each fed one infer request
frame (the test bundle's late cut, 31,360 bytes) per round as the socket would hand it over; the
batcher runs the round as one batch on a stub tail (zeros, no compute) in its worker thread; the
round ends when every reply is written. Reported: the CPU time of this (the loop's) thread per
request, over ``--rounds`` rounds after 20 of warm-up.

    python bench/front_path.py --boards 32 --rounds 300
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import numpy as np

from device_runtime.wire.ops import InferRequest
from device_runtime.wire import encode_bytes
from host_runtime._batcher import BatchConfig
from host_runtime._server import HostServer, ServerConfig, _HostProtocol
from host_runtime._tails import TailRegistry

CUT = (1, 160, 7, 7)  # features_14_conv_2's cut: 31,360 bytes of float32


class StubTail:
    """A tail that costs nothing: what is measured is the host's path around it."""

    name = "stub"
    input_shape = ("batch", *CUT[1:])
    input_dtype = "float32"

    def run(self, x: np.ndarray) -> np.ndarray:
        return np.zeros((x.shape[0], 1000), np.float32)


class Written:
    """Counts the replies written, all connections together; wakes the round when all are."""

    def __init__(self) -> None:
        self.count = 0
        self.target = 0
        self.done: asyncio.Future[None] | None = None

    def add(self) -> None:
        self.count += 1
        if self.count >= self.target and self.done is not None and not self.done.done():
            self.done.set_result(None)


class CountingTransport:
    """What ``_HostProtocol`` needs of a transport; writes are counted, not sent."""

    def __init__(self, written: Written) -> None:
        self.written = written
        self.closing = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 50000) if name == "peername" else default

    def write(self, data: Any) -> None:
        self.written.add()

    def writelines(self, buffers: Any) -> None:
        self.written.add()

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True


def stub_registry() -> TailRegistry:
    """A registry serving the stub tail as bundle ``b``, split ``s`` (no bundle on disk)."""
    registry = TailRegistry.__new__(TailRegistry)
    registry.bundles, registry.tails, registry.buckets, registry.device = {"b": None}, {("b", "s"): StubTail()}, (), "cpu"
    return registry


async def measure(boards: int, rounds: int) -> float:
    """The loop thread's CPU µs per request over ``rounds`` rounds of ``boards`` requests."""
    server = HostServer(stub_registry(), ServerConfig(host="127.0.0.1", port=0, workers=2, max_connections_per_address=boards,
                                                      batching=BatchConfig(max_batch=boards, max_queue=boards)))
    server.clock = asyncio.get_running_loop().time
    written = Written()
    connections = []
    for _ in range(boards):
        connection = _HostProtocol(server)
        connection.connection_made(CountingTransport(written))  # type: ignore[arg-type]  # a stand-in transport
        connections.append(connection)
    cut = np.random.default_rng(0).standard_normal(CUT, dtype=np.float32)
    head, tensor, _ = InferRequest(7, "b", "s", cut).parts()
    frame = encode_bytes(head, tensor)

    async def round_() -> None:
        written.target, written.done = written.count + boards, asyncio.get_running_loop().create_future()
        for connection in connections:
            connection.get_buffer(-1)[: len(frame)] = frame
            connection.buffer_updated(len(frame))
        await asyncio.wait_for(written.done, 30.0)

    for _ in range(20):
        await round_()
    started = time.thread_time()
    for _ in range(rounds):
        await round_()
    spent = time.thread_time() - started
    server.executor.shutdown(wait=True)
    return spent / (rounds * boards) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--boards", type=int, default=32, help="connections, one request each per round: the batch")
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    print(f"{asyncio.run(measure(args.boards, args.rounds)):.1f} us of the loop thread's CPU per request "
          f"(batch {args.boards}, {args.rounds} rounds)")


if __name__ == "__main__":
    main()
