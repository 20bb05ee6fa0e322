"""Host under load: simulated boards against one ``split-host serve``, against onnxruntime alone.

- **host**: ``split-host serve`` in a process of its own (its own interpreter and event loop,
  ``--loop`` as given here: uvloop by default where installed, as the host itself does),
  on 127.0.0.1, tails on ``--device`` (cpu by default; ``--procs`` processes on one port), started once per batching mode (``--max-batch 1``: off; larger:
  on), with ``--workers``, ``--threads`` and ``--share-queue`` as given here.
- **boards**: 1, 8, 32, 128 and 512 simulated boards (the curve: throughput should rise or hold
  from each point to the next; the bench says where it falls by more than 5 %), each an asyncio task with its own TCP
  connection (the device's own ``HostClient``), in ``--generators`` processes apart from the
  host, on uvloop where installed (the generators share this machine's cores with the host,
  where real boards would not: the lighter they are, the fairer the figure). So the boards
  leave the kernel's link timing off (``kernel_timing=False``): a real board's stamps and
  ``TCP_INFO`` looks cost its own CPU, but here they cost a third of the generator's, and on
  loopback the stamping of each ACK runs in the host's process, where it counted as front end.
  Each keeps one request in flight (closed loop): a MobileNetV2 cut tensor (the head's
  output for a seeded random image, real ImageNet weights) for the tail of ``--split``; the
  next goes when the answer is back. ``--warmup`` seconds, then ``--duration`` seconds
  measured: requests answered in that window, their round trip (send → answer) as the
  board sees it, and the CPU time the host and the generators used meanwhile.
- **baseline**: the same tail run directly in onnxruntime in this process, built as the host
  builds it (``TailRegistry``: same session options, ``--threads``), from 1 caller thread
  and from ``--workers`` (the host's tail threads), at batch sizes 1, 2, 4, 8, 16 and 32:
  samples per second, before and after the host runs. The machine may be shared, so the
  best batch size is also run for a second just before and just after each row, from 1
  caller and from ``--workers`` (the better counts): onnxruntime under the background load
  of that moment. ``ratio now`` divides the host's throughput by that; ``ratio`` by the best
  of everything onnxruntime did in the run (the stricter; target of issue 6: at least 0.85).
  Each row also says how many cores the host, the generators and everything else used, and
  ``queue``, ``tail`` and ``rest``: where a round trip goes (medians, ms): the host's queue until its
  batch starts and the batch's tail run (on CUDA with its copies to and from the GPU), as each answer
  says, and the rest (the batch's concatenation, the front ends' and the generators' loops, the
  kernel); and
  ``front_us_per_request``: the CPU time of the host's event-loop threads (the main thread of each
  host process: framing, decoding, batching, replies; not the tail workers, whose time is
  onnxruntime's and the batch's copies) over the measured window, per request answered.
- The host's limits are raised to fit the largest fleet: every board connects from 127.0.0.1, so
  ``--max-connections-per-address`` and ``--max-queue`` are at least the boards (defaults 256).

Every loop is bounded by a deadline, every request by a timeout; every socket is closed and
every process stopped (SIGINT to the host: its clean shutdown).

    python bench/host_load.py --weights mobilenet_v2-b0353104.pth --out build/bench/host_load.json
    python bench/host_load.py --source-bundle build/test-bundle --device cuda --modes tuned=32/0   # no torch
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from device_runtime.bundle import Bundle
from device_runtime.engine._backend import Backend, OnnxBackend
from device_runtime.link import HostClient
from host_runtime._event_loop import LOOPS, loop_runner
from host_runtime._tails import TF32_ERROR, TailRegistry
from splitedge.errors import HostUnavailableError, RemoteError

SPLIT = "features_14_conv_2"  # the test bundle's late compressive cut: 31 KB on the link, a 2.4 ms tail
BOARDS = (1, 8, 32, 128, 512)
BASELINE_BATCHES = (1, 2, 4, 8, 16, 32)
#: name=MAX_BATCH/MAX_WAIT_MS: the host's --max-batch and --max-wait-ms. "off": batching off;
#: "on": the host's defaults; "tuned": larger batches and no waiting for company (batches form
#: from what queues while both workers are busy); why these, in docs/benchmarks.md.
MODES = ("off=1/0", "on=8/0", "tuned=32/0")
REQUEST_TIMEOUT_S = 30.0
EXACT = 1e-5
#: A point of the curve this much below the one before it is called a fall (run-to-run noise is ~5 %).
NOISE = 0.05


def tolerance(device: str, tf32: bool) -> float:
    """How far the host's answer may be from onnxruntime's on the CPU: the CPU's own batching noise,
    CUDA without TF32 (the host's default, 1e-5 measured on an H100), CUDA with ``--tf32`` (as measured,
    :data:`~host_runtime._tails.TF32_ERROR`)."""
    if device == "cpu":
        return EXACT
    return TF32_ERROR if tf32 else 1e-4


# -- the bundle and the cut ----------------------------------------------------------------------


def ensure_bundle(path: Path, split: str, weights: Path | None, source: Path | None = None) -> Path:
    """MobileNetV2 with its real weights cut at ``split``, exported once into ``path`` (cached), or
    taken from the bundle ``source`` (no torch needed)."""
    if (path / "manifest.json").is_file():
        return path
    if source is not None:
        return one_split(source, split, path)
    from exporter._build import BuildSpec, build_bundle  # needs torch: only when the bundle is not there yet

    if weights is None:
        raise SystemExit(f"no bundle at {path}: pass --weights mobilenet_v2-b0353104.pth to export one")
    print(f"exporting MobileNetV2 cut at {split} into {path} ...", flush=True)
    build_bundle(BuildSpec("torchvision:mobilenet_v2", weights=weights, splits=[split]), path, progress=False)
    return path


def one_split(source: Path, split: str, path: Path) -> Path:
    """A bundle of ``source``'s ``split`` alone (its head and tail, hard-linked; no full model, no other
    tails), so that the host loads and warms one tail, as with an exported one."""
    import dataclasses
    import os as _os

    from device_runtime import write_manifest

    bundle = Bundle.load(source, roles=())
    chosen = dataclasses.replace(bundle.manifest.split(split), stages=(), fragments=())
    manifest = dataclasses.replace(bundle.manifest, full=(), splits=(chosen,), bundle_id="", manifest_sha256="")
    for artifact in chosen.artifacts:
        (path / artifact.path).parent.mkdir(parents=True, exist_ok=True)
        _os.link(bundle.verify(artifact), path / artifact.path)
    write_manifest(path, manifest)
    Bundle.load(path)  # verified whole
    print(f"made {path} from {source}: split {split} alone", flush=True)
    return path


def cut_tensor(bundle: Bundle, split: str) -> np.ndarray:
    """A real cut: the head's output for a seeded random image, (1, C, H, W) float32."""
    x = np.random.default_rng(0).random((1, *bundle.manifest.model.input_shape), dtype=np.float32)
    return OnnxBackend(bundle.artifact(split, "head"), threads=1).run(x)


# -- baseline: onnxruntime alone -----------------------------------------------------------------


def measure(tail: Backend, cut: np.ndarray, batch: int, callers: int, seconds: float) -> float:
    """Samples per second of ``callers`` threads each running the tail on batches of ``batch``."""
    x = np.ascontiguousarray(np.repeat(cut, batch, axis=0))
    for _ in range(3):
        tail.run(x)
    counts = [0] * callers
    stop = time.perf_counter() + seconds

    def work(i: int) -> None:
        while time.perf_counter() < stop:
            tail.run(x)
            counts[i] += batch

    threads = [threading.Thread(target=work, args=(i,)) for i in range(callers)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - start)


def scan(tail: Backend, cut: np.ndarray, workers: int, seconds: float) -> list[dict[str, Any]]:
    """The baseline at every batch size, from 1 caller thread and from as many as the host has workers."""
    return [
        {"callers": callers, "batch": batch, "samples_per_s": measure(tail, cut, batch, callers, seconds)}
        for callers in sorted({1, workers}) for batch in BASELINE_BATCHES
    ]


def bracket(tail: Backend, cut: np.ndarray, batch: int, workers: int, seconds: float) -> dict[str, float]:
    """The baseline now, at ``batch``: the better of 1 and ``workers`` callers (whichever the cores
    free at the moment favour), and the cores everything else used meanwhile."""
    busy, mine, start = machine_busy(), time.process_time(), time.perf_counter()
    rate = max(measure(tail, cut, batch, callers, seconds / 2) for callers in sorted({1, workers}))
    elapsed = time.perf_counter() - start
    return {"samples_per_s": rate,
            "other_cpu": max(machine_busy() - busy - (time.process_time() - mine), 0.0) / elapsed}


def machine_busy() -> float:
    """CPU seconds all processes of this machine have used so far (Linux /proc/stat: all but idle and iowait)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


# -- the host ------------------------------------------------------------------------------------


class Host:
    """``split-host serve`` in a subprocess; its output goes to ``log``."""

    def __init__(self, bundle_dir: Path, log: Path, max_batch: int, max_wait_ms: float, workers: int,
                 threads: int | None, loop: str, device: str = "cpu", procs: int = 1, tf32: bool = False,
                 boards: int = 0, buckets: str | None = None, share_queue: str | None = None) -> None:
        room = str(max(256, boards))  # the defaults, or every board (all on 127.0.0.1, one request each)
        command = [
            sys.executable, "-m", "host_runtime.cli", "serve", str(bundle_dir), "--interface", "127.0.0.1",
            "--port", "0", "--no-zeroconf", "--device", device, "--workers", str(workers),
            "--max-batch", str(max_batch), "--max-wait-ms", str(max_wait_ms), "--loop", loop, "--procs", str(procs),
            "--max-connections-per-address", room, "--max-queue", room,
        ]
        if tf32:
            command.append("--tf32")
        if buckets is not None:
            command += ["--buckets", buckets]
        if share_queue is not None:
            command += ["--share-queue", share_queue]
        if threads is not None:
            command += ["--threads", str(threads)]
        self.log = log
        with log.open("wb") as out:  # a file: a pipe nobody reads would block the host
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.port = self._port()

    def _port(self) -> int:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            lines = self.log.read_text(errors="replace").splitlines()
            ready = any(line.startswith("limits: ") for line in lines)  # printed once every --procs child listens
            for line in lines:
                if ready and line.startswith("listening on "):
                    return int(line.split()[2].rstrip(";").rsplit(":", 1)[1])
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"split-host serve did not start:\n{self.log.read_text()}")

    def cpu_seconds(self) -> float:
        """User + system CPU time of the host process and its --procs children so far (Linux /proc)."""
        total = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:  # gone meanwhile
                continue
            if stat.parent.name == str(self.process.pid) or fields[1] == str(self.process.pid):  # itself, or ppid
                total += int(fields[11]) + int(fields[12])  # utime, stime
        return total / os.sysconf("SC_CLK_TCK")

    def front_cpu_seconds(self) -> float:
        """CPU time of the host's event-loop threads so far: the main thread of the host process and
        of each --procs child (Linux /proc: schedstat's nanoseconds where there, else stat's ticks)."""
        total = 0.0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if stat.parent.name != str(self.process.pid) and fields[1] != str(self.process.pid):
                    continue
                main = stat.parent / "task" / stat.parent.name  # the thread whose id is the process's
                try:
                    total += int((main / "schedstat").read_text().split()[0]) / 1e9
                except (OSError, ValueError, IndexError):
                    ticks = (main / "stat").read_text().rsplit(")", 1)[1].split()
                    total += (int(ticks[11]) + int(ticks[12])) / os.sysconf("SC_CLK_TCK")
            except OSError:  # gone meanwhile
                continue
        return total

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def check_answer(port: int, bundle_id: str, split: str, cut: np.ndarray, expected: np.ndarray,
                 atol: float = EXACT) -> None:
    """One request before the load: the host answers what the tail computes on the CPU (within ``atol``)."""

    async def go() -> np.ndarray:
        client = await HostClient.connect("127.0.0.1", port)
        try:
            return (await client.infer(bundle_id, split, cut)).output
        finally:
            await client.close()

    np.testing.assert_allclose(asyncio.run(go()), expected, atol=atol, rtol=0)


# -- the boards ----------------------------------------------------------------------------------


async def _run_boards(port: int, bundle_id: str, split: str, cut: np.ndarray, boards: int,
                      ready: mp.Queue, start: mp.Queue, warmup: float, duration: float) -> dict[str, Any]:
    connected = await asyncio.gather(
        *(HostClient.connect("127.0.0.1", port, timeout=30.0, kernel_timing=False) for _ in range(boards)),
        return_exceptions=True,
    )  # each connect is bounded by its timeout
    clients = [c for c in connected if isinstance(c, HostClient)]
    if len(clients) < boards:
        for client in clients:
            await client.close()
        raise next(c for c in connected if not isinstance(c, HostClient))
    latencies: list[float] = []
    batches: list[int] = []
    host_ms: list[tuple[float, float]] = []  # each answer's queue and compute, as the host says
    errors: Counter[str] = Counter()
    cpu: dict[str, float] = {}
    try:
        ready.put(True)
        begin = await asyncio.get_running_loop().run_in_executor(None, start.get, True, 120)  # wall-clock start
        measure_from, measure_to = begin + warmup, begin + warmup + duration
        loop = asyncio.get_running_loop()
        # The generator's own CPU over the measured window (time.time() -> loop time).
        for key, at in (("from", measure_from), ("to", measure_to)):
            loop.call_later(max(at - time.time(), 0.0), lambda k=key: cpu.__setitem__(k, time.process_time()))
        await asyncio.sleep(max(begin - time.time(), 0.0))
        message = {"op": "infer", "bundle": bundle_id, "split": split, "deadline_ms": REQUEST_TIMEOUT_S * 1000}

        async def board(client: HostClient) -> None:
            while time.time() < measure_to:  # closed loop: one request in flight
                sent = time.perf_counter()
                try:
                    reply = await client.request(message, REQUEST_TIMEOUT_S, cut)
                except RemoteError as exc:  # overloaded, deadline_exceeded: counted, and the board goes on
                    errors[exc.code] += 1
                    continue
                except HostUnavailableError:
                    errors["unavailable"] += 1
                    return
                answered, now = time.perf_counter(), time.time()
                if measure_from <= now < measure_to:
                    latencies.append((answered - sent) * 1000.0)
                    batches.append(int(reply["batch"]))
                    host_ms.append((reply["queue_ms"], reply["compute_ms"]))

        await asyncio.wait_for(asyncio.gather(*(board(c) for c in clients)), warmup + duration + REQUEST_TIMEOUT_S + 30)
    finally:
        for client in clients:
            await client.close()
    return {
        "latencies_ms": latencies, "batches": batches, "host_ms": host_ms, "errors": dict(errors),
        "cpu_s": cpu.get("to", time.process_time()) - cpu.get("from", 0.0),
    }


def _generator(port: int, bundle_id: str, split: str, cut: np.ndarray, boards: int, ready: mp.Queue,
               start: mp.Queue, results: mp.Queue, warmup: float, duration: float) -> None:
    try:
        run = loop_runner("auto")
        results.put(run(_run_boards(port, bundle_id, split, cut, boards, ready, start, warmup, duration)))
    except BaseException as exc:  # reported by the parent, which is waiting for a result
        ready.put(False)
        results.put({"failed": f"{type(exc).__name__}: {exc}"})


def _wait_ready(ready: mp.Queue, results: mp.Queue, processes: list[Any], timeout: float = 120.0) -> None:
    """Every generator has connected its boards; one that died or failed is reported at once."""
    deadline, count = time.monotonic() + timeout, 0
    while count < len(processes):
        if time.monotonic() > deadline:
            raise RuntimeError(f"load generators not ready within {timeout:g} s")
        try:
            ok = ready.get(timeout=1.0)
        except queue.Empty:
            if any(p.exitcode not in (None, 0) for p in processes):
                raise RuntimeError("a load generator process died") from None
            continue
        if not ok:
            raise RuntimeError(f"a load generator failed: {results.get(timeout=10)}")
        count += 1


def run_load(host: Host, bundle_id: str, split: str, cut: np.ndarray, boards: int, generators: int,
             warmup: float, duration: float) -> dict[str, Any]:
    """``boards`` closed-loop boards on ``generators`` processes; figures of the measured window."""
    ctx = mp.get_context("spawn")  # no fork of a process holding onnxruntime's threads
    ready, results = ctx.Queue(), ctx.Queue()
    counts = [boards // generators + (1 if i < boards % generators else 0) for i in range(generators)]
    counts = [c for c in counts if c]
    starts = [ctx.Queue() for _ in counts]
    processes = [
        ctx.Process(target=_generator, daemon=True,
                    args=(host.port, bundle_id, split, cut, n, ready, start, results, warmup, duration))
        for n, start in zip(counts, starts)
    ]
    for p in processes:
        p.start()
    try:
        _wait_ready(ready, results, processes)
        begin = time.time() + 0.5
        for start in starts:
            start.put(begin)
        time.sleep(max(begin + warmup - time.time(), 0.0))
        host_cpu_from, front_from, busy_from = host.cpu_seconds(), host.front_cpu_seconds(), machine_busy()
        time.sleep(max(begin + warmup + duration - time.time(), 0.0))
        host_cpu, front_cpu = host.cpu_seconds() - host_cpu_from, host.front_cpu_seconds() - front_from
        busy = machine_busy() - busy_from
        parts = [results.get(timeout=REQUEST_TIMEOUT_S + 60) for _ in processes]
    finally:
        for p in processes:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(5)
    failed = [p["failed"] for p in parts if "failed" in p]
    if failed:
        raise RuntimeError(f"load generator failed: {failed}")
    latencies = np.array([x for p in parts for x in p["latencies_ms"]])
    batches = np.array([x for p in parts for x in p["batches"]])
    queue_ms, compute_ms = np.array([x for p in parts for x in p["host_ms"]]).reshape(-1, 2).T
    errors: Counter[str] = Counter()
    for p in parts:
        errors.update(p["errors"])
    return {
        "boards": boards,
        "generators": len(processes),
        "requests": int(latencies.size),
        "requests_per_s": latencies.size / duration,
        "p50_ms": float(np.percentile(latencies, 50)) if latencies.size else float("nan"),
        "p99_ms": float(np.percentile(latencies, 99)) if latencies.size else float("nan"),
        "mean_batch": float(batches.mean()) if batches.size else float("nan"),
        # Where a round trip goes, medians: waiting in the host's queue for its batch to start, the
        # batch's tail run (copies in and out included), and the rest, the front ends' and the
        # generators' loops and the kernel's way there and back (the round trip less the two).
        "queue_p50_ms": float(np.median(queue_ms)) if latencies.size else float("nan"),
        "compute_p50_ms": float(np.median(compute_ms)) if latencies.size else float("nan"),
        "rest_p50_ms": float(np.median(latencies - queue_ms - compute_ms)) if latencies.size else float("nan"),
        "errors": dict(errors),
        "host_cpu": host_cpu / duration,  # cores busy on average
        "front_cpu": front_cpu / duration,  # of which the event-loop threads
        # The front end's CPU per request: the event loops' time (not the tail workers') per answer.
        "front_us_per_request": front_cpu / latencies.size * 1e6 if latencies.size else float("nan"),
        "generator_cpu": sum(p["cpu_s"] for p in parts) / duration,
        # Everything else the machine ran meanwhile: other users' jobs, and this benchmark's
        # parent, idle, and kernel time not charged to a process.
        "other_cpu": max(busy - host_cpu - sum(p["cpu_s"] for p in parts), 0.0) / duration,
    }


# -- main ----------------------------------------------------------------------------------------


def curve(rows: Any) -> str:
    """Whether throughput rises or holds from each fleet size to the next (a fall is more than :data:`NOISE`)."""
    points = sorted((r["boards"], r["requests_per_s"]) for r in rows)
    falls = [f"{b0} -> {b1} boards: {r0:.0f} -> {r1:.0f} req/s ({r1 / r0 - 1:+.0%})"
             for (b0, r0), (b1, r1) in zip(points, points[1:]) if r1 < r0 * (1 - NOISE)]
    shown = ", ".join(f"{b}: {r:.0f}" for b, r in points)
    return f"req/s by boards {shown}; " + ("rises or holds at every step" if not falls else "falls: " + "; ".join(falls))


def parse_mode(text: str) -> tuple[str, int, float]:
    try:
        name, settings = text.split("=")
        batch, wait = settings.split("/")
        return name, int(batch), float(wait)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=MAX_BATCH/MAX_WAIT_MS") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, default=Path("build/bench/host-load-bundle"),
                        help="bundle to serve; exported there (MobileNetV2, real weights) if missing")
    parser.add_argument("--split", default=SPLIT)
    parser.add_argument("--weights", type=Path, help="MobileNetV2 ImageNet state dict (to export the bundle once)")
    parser.add_argument("--source-bundle", type=Path,
                        help="make --bundle from this bundle's --split instead (e.g. build/test-bundle; no torch)")
    parser.add_argument("--boards", type=int, nargs="+", default=list(BOARDS))
    parser.add_argument("--modes", type=parse_mode, nargs="+", default=[parse_mode(m) for m in MODES],
                        help=f"NAME=MAX_BATCH/MAX_WAIT_MS per host run (default: {' '.join(MODES)})")
    parser.add_argument("--workers", type=int, default=None,
                        help="host tail threads (default: cores on the CPU, 2 on CUDA: the host's own defaults)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the host and the baseline run tails")
    parser.add_argument("--tf32", action="store_true",
                        help=f"the host's --tf32 (CUDA); the answer is checked to {TF32_ERROR:g}, what TF32 was measured to cost")
    parser.add_argument("--buckets", help="the host's --buckets (default: the host's own, auto)")
    parser.add_argument("--share-queue", choices=("auto", "on", "off"),
                        help="the host's --share-queue (default: the host's own, auto)")
    parser.add_argument("--procs", type=int, default=1, help="the host's --procs: processes on one port")
    parser.add_argument("--loop", choices=LOOPS, default="auto", help="the host's event loop (default auto)")
    parser.add_argument("--threads", type=int, default=1,
                        help="onnxruntime intra-op threads per tail, host and baseline alike (default 1)")
    parser.add_argument("--generators", type=int, default=1, help="load generator processes")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of load before measuring")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds measured per concurrency")
    parser.add_argument("--baseline-seconds", type=float, default=1.5, help="per batch size and caller count")
    parser.add_argument("--out", type=Path, default=Path("build/bench/host_load.json"))
    args = parser.parse_args()
    if args.workers is None:
        args.workers = 2 if args.device == "cuda" else os.cpu_count() or 1
    atol = tolerance(args.device, args.tf32)

    bundle_dir = ensure_bundle(args.bundle, args.split, args.weights, args.source_bundle)
    bundle = Bundle.load(bundle_dir)
    cut = cut_tensor(bundle, args.split)
    expected = OnnxBackend(bundle.artifact(args.split, "tail"), threads=1).run(cut)
    print(f"bundle {bundle.id}, split {args.split}: cut {list(cut.shape)} float32, {cut.nbytes:,} bytes; "
          f"host: --device {args.device}{' --tf32' if args.tf32 else ''} --procs {args.procs} --workers {args.workers} "
          f"--threads {args.threads} --loop {args.loop} --buckets {args.buckets or 'auto'} "
          f"--share-queue {args.share_queue or 'auto'}; answers checked to {atol:g}; {args.generators} generator process(es); "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    # The tail as the host builds it: same registry, same session options and threads.
    tail = TailRegistry.from_paths([bundle_dir], threads=args.threads, device=args.device,
                                   tf32=args.tf32).lookup(bundle.id, args.split)

    load_before = os.getloadavg()
    base_before = scan(tail, cut, args.workers, args.baseline_seconds)
    best_before = max(base_before, key=lambda r: r["samples_per_s"])
    rows = []
    logs = args.out.parent
    logs.mkdir(parents=True, exist_ok=True)
    for mode, max_batch, max_wait_ms in args.modes:
        host = Host(bundle_dir, logs / "host_load-host.log", max_batch, max_wait_ms, args.workers, args.threads,
                    args.loop, args.device, args.procs, args.tf32, max(args.boards), args.buckets, args.share_queue)
        try:
            for line in host.log.read_text(errors="replace").splitlines():
                if line.startswith(("tails run on", "sessions:")):
                    print(f"  host: {line}", flush=True)
            check_answer(host.port, bundle.id, args.split, cut, expected, atol)
            for boards in args.boards:
                # The best baseline again just before and just after the row: what onnxruntime alone
                # gets under the background load of the moment (the machine may be shared).
                before = bracket(tail, cut, best_before["batch"], args.workers, 1.0)
                row = run_load(host, bundle.id, args.split, cut, boards, min(args.generators, boards), args.warmup,
                               args.duration)
                after = bracket(tail, cut, best_before["batch"], args.workers, 1.0)
                adjacent = (before["samples_per_s"] + after["samples_per_s"]) / 2
                row.update(mode=mode, max_batch=max_batch, max_wait_ms=max_wait_ms, baseline_adjacent=adjacent,
                           ratio_adjacent=row["requests_per_s"] / adjacent,
                           other_cpu_adjacent=[before["other_cpu"], after["other_cpu"]])
                rows.append(row)
                print(f"  {mode:6s} {boards:4d} boards: {row['requests_per_s']:6.1f} req/s "
                      f"(baseline now {adjacent:.0f}), "
                      f"p50 {row['p50_ms']:7.2f} ms (queue {row['queue_p50_ms']:.2f}, tail {row['compute_p50_ms']:.2f}, "
                      f"rest {row['rest_p50_ms']:.2f}), p99 {row['p99_ms']:7.2f} ms, batch {row['mean_batch']:5.2f}, "
                      f"front {row['front_us_per_request']:.0f} us/request, CPU host {row['host_cpu']:.2f} generators {row['generator_cpu']:.2f} "
                      f"other {row['other_cpu']:.2f} (around it {before['other_cpu']:.2f}, {after['other_cpu']:.2f}), "
                      f"errors {row['errors']}", flush=True)
        finally:
            host.stop()
    base_after = scan(tail, cut, args.workers, args.baseline_seconds)
    load_after = os.getloadavg()

    best = max(base_before + base_after, key=lambda r: r["samples_per_s"])
    for row in rows:  # one sample per request; against the best onnxruntime did, then or at any time
        row["ratio"] = row["requests_per_s"] / max(best["samples_per_s"], row["baseline_adjacent"])

    print("\nbaseline, onnxruntime alone (samples/s), before / after the host runs:")
    print(f"{'callers':>7s} " + " ".join(f"{'b=' + str(b):>11s}" for b in BASELINE_BATCHES))
    for callers in sorted({r["callers"] for r in base_before}):
        cells = []
        for b in BASELINE_BATCHES:
            pre = next(r for r in base_before if r["callers"] == callers and r["batch"] == b)["samples_per_s"]
            post = next(r for r in base_after if r["callers"] == callers and r["batch"] == b)["samples_per_s"]
            cells.append(f"{pre:.0f}/{post:.0f}")
        print(f"{callers:7d} " + " ".join(f"{c:>11s}" for c in cells))
    print(f"best: {best['samples_per_s']:.0f} samples/s (batch {best['batch']}, {best['callers']} caller thread(s))\n")
    print(f"{'batching':8s} {'max-batch':>9s} {'wait ms':>7s} {'boards':>6s} {'req/s':>7s} {'p50 ms':>8s} "
          f"{'p99 ms':>8s} {'queue':>6s} {'tail':>6s} {'rest':>6s} {'batch':>5s} {'ratio':>5s} {'ratio now':>9s} "
          f"{'front us':>8s} {'CPU host':>8s} {'gen':>5s} {'other':>5s}  errors")
    for r in rows:
        print(f"{r['mode']:8s} {r['max_batch']:9d} {r['max_wait_ms']:7g} {r['boards']:6d} {r['requests_per_s']:7.1f} "
              f"{r['p50_ms']:8.2f} {r['p99_ms']:8.2f} {r['queue_p50_ms']:6.2f} {r['compute_p50_ms']:6.2f} "
              f"{r['rest_p50_ms']:6.2f} {r['mean_batch']:5.2f} {r['ratio']:5.2f} "
              f"{r['ratio_adjacent']:9.2f} {r['front_us_per_request']:8.0f} "
              f"{r['host_cpu']:8.2f} {r['generator_cpu']:5.2f} {r['other_cpu']:5.2f}  {r['errors'] or ''}")
    for mode in dict.fromkeys(r["mode"] for r in rows):
        print(f"{mode}: {curve(r for r in rows if r['mode'] == mode)}")
    import onnxruntime

    args.out.write_text(json.dumps({
        "benchmark": "host_load", "command": " ".join(sys.argv), "bundle": bundle.id, "split": args.split,
        "loop": args.loop, "device": args.device, "tf32": args.tf32, "procs": args.procs, "atol": atol,
        "buckets": args.buckets or "auto",
        "cut_bytes": int(cut.nbytes), "workers": args.workers, "threads": args.threads, "generators": args.generators,
        "warmup_s": args.warmup, "duration_s": args.duration,
        "machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
        "onnxruntime": onnxruntime.__version__, "load_average_before": load_before, "load_average_after": load_after,
        "baseline_before": base_before, "baseline_after": base_after, "baseline_best": best, "rows": rows,
    }, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
