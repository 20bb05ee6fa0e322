"""Board → edge → cloud on one machine: three shaped namespaces, delay relays, hosts, a board run.

The testbed the chain benchmarks share (``bench/chain_trial.py``, ``bench/chain_vs_cut.py``):

* three network namespaces (board, edge, cloud), each behind its own veth pair shaped by the
  kernel's tbf (:class:`testbed.EmulatedLink`); the root namespace joins them, as a router
  (or docker-compose's bridge) would. A message between two tiers crosses both tiers' veths.
* the kernel here has no netem, so one-way latency is a :class:`testbed.DelayRelay` in the root
  namespace: one listens on the board's link and delivers to the edge's host, one listens on the
  edge's link and delivers to the cloud's host. The board dials the first; the edge passes a
  chain's later stage on through the second (``split-host serve --peer``).
* each tier's processes are slowed like the seed-003 paper's agents (``bench/tier.py``): every
  inference followed by a sleep of ``overhead`` times its duration, so one machine plays a slow
  board, a middling edge and a fast cloud.
* the board is ``split-device run`` in its namespace with a synthetic camera; its trace and every
  infer reply (each hop's link, queue and compute) are summarised by :func:`summarise`.

Needs root (namespaces, tbf). Everything :func:`three_tiers` creates is removed on the way out;
:func:`cancelled_by_sigterm` makes SIGTERM unwind like Ctrl-C so that holds for both.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Coroutine, Mapping, Sequence, TypeVar

import numpy as np

from fieldtrial._trace import read_trace
from testbed import DelayRelay, EmulatedLink
from testbed._namespace_host import running_host

__all__ = ["HOST_ARGS", "PORT", "Network", "Tiers", "cancelled_by_sigterm", "run_board", "summarise", "three_tiers",
           "tier_command"]

PORT = 7767
BENCH = Path(__file__).resolve().parent
TIERS = ("board", "edge", "cloud")
T = TypeVar("T")
HOST_ARGS = ("--workers", "1", "--threads", "1", "--max-batch", "1")  # frame by frame, one core's worth


@dataclass(frozen=True)
class Network:
    """The links: each tier's veth rate (Mbit/s, both ways) and the one-way delays between tiers."""

    rates_mbit: tuple[float, float, float]  # board's, edge's, cloud's interface
    board_edge_ms: float  # one way, board <-> edge
    edge_cloud_ms: float  # one way, edge <-> cloud

    def to_dict(self) -> dict[str, Any]:
        return {"rates_mbit": dict(zip(TIERS, self.rates_mbit)), "board_edge_ms": self.board_edge_ms,
                "edge_cloud_ms": self.edge_cloud_ms}


@dataclass
class Tiers:
    """The three namespaces and the relays between them; addresses are what the board dials."""

    links: dict[str, EmulatedLink]
    to_edge: DelayRelay  # listens on the board's link, delivers to the edge host
    to_cloud: DelayRelay  # listens on the edge's link, delivers to the cloud host
    overhead: Mapping[str, float]

    def apply(self, network: Network) -> None:
        for tier, rate in zip(TIERS, network.rates_mbit):
            self.links[tier].set_rate(rate)
        self.to_edge.set_delay(network.board_edge_ms)
        self.to_cloud.set_delay(network.edge_cloud_ms)

    def address(self, tier: str) -> str:
        """What a board dials to reach the host of ``tier`` (edge or cloud)."""
        return _address({"edge": self.to_edge, "cloud": self.to_cloud}[tier])

    def command(self, tier: str, module: str, args: Sequence[str], replies: Path | None = None) -> list[str]:
        return tier_command(self.overhead[tier], module, args, replies)


def tier_command(overhead: float, module: str, args: Sequence[str], replies: Path | None = None) -> list[str]:
    """``python -m MODULE ARGS`` with every inference followed by ``overhead`` times its time asleep
    (``bench/tier.py``): a slower machine, or one busy with others' work."""
    extra = ["--replies", str(replies)] if replies is not None else []
    return [sys.executable, str(BENCH / "tier.py"), "--overhead", f"{overhead:g}", *extra, "-m", module, *args]


def _address(relay: DelayRelay) -> str:
    host, port = relay.address
    return f"{host}:{port}"


@contextlib.asynccontextmanager
async def three_tiers(bundle: Path, network: Network, overhead: Mapping[str, float]) -> AsyncIterator[Tiers]:
    """Board, edge and cloud namespaces with hosts on edge and cloud; all removed on the way out."""
    async with contextlib.AsyncExitStack() as stack:
        links = {tier: await stack.enter_async_context(EmulatedLink(rate))
                 for tier, rate in zip(TIERS, network.rates_mbit)}
        board, edge, cloud = (links[t] for t in TIERS)
        to_edge = await stack.enter_async_context(
            DelayRelay((edge.namespace_address, PORT), network.board_edge_ms, listen=(board.root_address, 0)))
        to_cloud = await stack.enter_async_context(
            DelayRelay((cloud.namespace_address, PORT), network.edge_cloud_ms, listen=(edge.root_address, 0)))
        tiers = Tiers(links, to_edge, to_cloud, overhead)
        for link, tier, peers in ((cloud, "cloud", []), (edge, "edge", ["--peer", _address(to_cloud)])):
            serve = ["serve", str(bundle), "--port", str(PORT), "--no-zeroconf", *HOST_ARGS, *peers]
            process = link.popen(tiers.command(tier, "host_runtime.cli", serve), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
            stack.enter_context(running_host(process, link.namespace_address, PORT))
        print(f"tiers: board {board.namespace}, edge {edge.namespace} (host {edge.namespace_address}), "
              f"cloud {cloud.namespace} (host {cloud.namespace_address})", flush=True)
        yield tiers


async def run_board(
    tiers: Tiers, bundle: Path, split: str, hosts: Sequence[str], fps: float, frames: int, work: Path,
    timeout_s: float,
) -> dict:
    """One ``split-device run --split SPLIT`` in the board's namespace, its stages on the ``hosts``
    (tier names, in stage order; local is given the edge, so that no zeroconf runs); its trace and
    replies summarised. No deadline at the hosts (``--deadline-ms 0``): a slow chain is measured,
    not refused and answered on the board."""
    trace, replies = work / "trace.jsonl", work / "replies.jsonl"
    for path in (trace, replies):
        path.unlink(missing_ok=True)
    dial = [arg for tier in hosts for arg in ("--host", tiers.address(tier))]
    run = ["run", str(bundle), "--split", split, "--camera", f"synthetic:{fps:g}", "--frames", str(frames),
           "--trace", str(trace), "--deadline-ms", "0", "--threads", "1", "--backend", "onnx",
           "--timeout", f"{timeout_s:g}", *dial]
    env = {**os.environ, "SPLITEDGE_CONFIG_DIRS": str(work)}  # no device.toml of this machine's
    process = tiers.links["board"].popen(tiers.command("board", "device_runtime.cli", run, replies), env=env,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    limit = frames / fps + 120.0  # start-up, then the frames, then the last answers
    try:
        _, err = await asyncio.to_thread(process.communicate, timeout=limit)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"split-device run --split {split} ran past {limit:.0f} s") from exc
    finally:
        if process.poll() is None:
            process.kill()
            await asyncio.to_thread(process.wait)
    if process.returncode != 0:
        raise RuntimeError(f"split-device run --split {split} failed ({process.returncode}): {err[-2000:]}")
    return {**summarise(trace, replies), "load_average": os.getloadavg()}  # the machine's, as the run ended


def summarise(trace: Path, replies: Path) -> dict:
    """One run's frames: time from first capture to last answer, drop rate, throughput (answers per
    second), per-frame latency (mean, p50, p95), mean stage times, and each hop's legs."""
    _, frames = read_trace(trace)
    answered = [f for f in frames if not f["dropped"]]
    totals = np.array([f["total_ms"] for f in answered])
    start = min(f["t"] for f in frames)
    end = max(f["t"] + f["total_ms"] / 1000.0 for f in answered)
    return {
        "frames": len(frames), "answered": len(answered), "drop_rate": 1.0 - len(answered) / len(frames),
        "fallbacks": sum(1 for f in answered if f["error"]),  # remote frames the board answered itself
        "time_s": end - start, "throughput_fps": len(answered) / (end - start),
        "mean_ms": float(totals.mean()), "p50_ms": float(np.percentile(totals, 50)),
        "p95_ms": float(np.percentile(totals, 95)),
        "stages_ms": {k: float(np.mean([f[k] for f in answered]))
                      for k in ("preprocess_ms", "head_ms", "transfer_ms", "tail_ms", "queue_ms", "slot_ms")},
        "hops_ms": hop_times(replies),
    }


def hop_times(replies: Path) -> dict[str, dict[str, float]]:
    """Median and p95 of each leg over the run's replies: the board's link to the edge (both ways),
    the edge's queue and stage, then per later hop its link from the host before it, queue and stage."""
    if not replies.is_file():
        return {}
    legs: dict[str, list[float]] = {}
    for line in replies.read_text().splitlines():
        reply = json.loads(line)
        times = {"board-edge link": reply["transfer_ms"], "edge queue": reply["queue_ms"],
                 "edge compute": reply["compute_ms"]}
        for name, hop in zip(("cloud",), reply["hops"]):
            times |= {f"edge-{name} link": hop["link_ms"], f"{name} queue": hop["queue_ms"],
                      f"{name} compute": hop["compute_ms"]}
        for leg, ms in times.items():
            legs.setdefault(leg, []).append(ms)
    return {leg: {"p50": float(np.percentile(v, 50)), "p95": float(np.percentile(v, 95))} for leg, v in legs.items()}


async def cancelled_by_sigterm(work: Coroutine[Any, Any, T]) -> T:
    """SIGTERM unwinds like Ctrl-C: the task is cancelled and every context removes what it made."""
    task = asyncio.ensure_future(work)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await task
