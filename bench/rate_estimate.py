"""The board's link-rate estimate against the link it runs on, the board's CPU idle or saturated (issue 14).

For each link (``tbf`` at ``--rates`` Mbit/s in a network namespace, :class:`testbed.EmulatedLink`,
and loopback to a ``split-host`` on 127.0.0.1), each workload and each board state, the board
runs a :class:`Pipeline` in this process, pinned to one CPU (the host to another), and the
estimate (``LinkMeter.rate_bps``) is sampled every 50 ms after a warm-up:

* workloads: **probes**: the board runs every frame locally and only the idle-time probes
  measure the link (what ``--split auto`` depends on to come back from ``local``); **offload**:
  a live 5 frames/s camera offloads its input (602 KB a frame) and the replies measure it;
* board **idle**: nothing else runs on its CPU; **saturated**: the full model runs back to back
  in a thread of the board's process (the head, the GIL, the event loop all busy) and a process
  spinning on the board's CPU takes its share of it;
* timing: **kernel** (this runtime: TCP_INFO, ACK and reply stamps, :mod:`device_runtime.link._kernel_timing`)
  and **device** (the device's own clock, as before issue 14 and wherever the kernel's timings
  are missing), in the same run, alternately.

The estimate is compared with the shaped rate and with the link's goodput (a 4 MB upload timed
by the kernel's acknowledgements: what the link carries here; tbf counts headers, so at most
~95.6 % of the shaped rate), measured with the board idle and again with it saturated (its own
CPU drives the socket: a saturated board cannot fill a fast link). Median and 5th percentile of
each ratio.

``--step A,B`` also shapes a rate step A → B → A under the saturated board offloading, and
reports how long after each step the estimate settles within 15 % of the new goodput (and
stays there until the next step).

Needs root (namespaces, tbf). ``python bench/rate_estimate.py --bundle build/test-bundle``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np

# This checkout, whatever the interpreter: .venv-device's splitedge is an installed copy (a
# board's install), and a benchmark run with it measured that copy instead of the tree.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from device_runtime.bundle import LOCAL, OFFLOAD, Bundle  # noqa: E402
from device_runtime.engine._runner import DeviceRunner
from device_runtime.link import HostClient
from device_runtime.hosts._host_link import HostLink
from device_runtime.hosts._link_meter import LinkMeter
from device_runtime.stream import Pipeline, PipelineConfig, StaticPolicy
from device_runtime.stream._camera import Synthetic
from testbed import EmulatedLink, free_port, unavailable_reason
from testbed._namespace_host import running_host, serve_in

BOARD_CPU, HOST_CPU = 1, 0
PINNED = {BOARD_CPU, HOST_CPU} <= os.sched_getaffinity(0)
SAMPLE_S = 0.05
GOODPUT_BYTES = 4 << 20
HOST_ARGS = ("--workers", "1", "--threads", "1")


def device_timing(client: HostClient) -> None:
    """Take the kernel's timings away from ``client``: the device's own clock, as before issue 14."""
    protocol = client._protocol
    if protocol.kernel is not None:
        protocol.kernel.close()
    protocol.kernel = None
    protocol.watch = None


async def goodput_bps(address: str) -> float:
    """A 4 MB upload's bytes over the time the kernel took to acknowledge them (median of 3),
    else over its round trip less a ping's."""
    host, port = address.rsplit(":", 1)
    client = await HostClient.connect(host, int(port))
    try:
        rtt = min([await client.ping(0) for _ in range(3)]) / 1000.0
        rates = []
        for _ in range(3):
            probe = await client.probe(GOODPUT_BYTES, timeout=60.0)
            upload = probe.upload
            if upload is not None and upload.acked_bps is not None and upload.span_s > 0.005:
                rates.append(upload.acked_bps)
            else:
                rates.append(8 * GOODPUT_BYTES / (probe.round_trip_ms / 1000.0 - rtt))
        return statistics.median(rates)
    finally:
        await client.close()


@contextmanager
def hog(active: bool) -> Iterator[None]:
    """A process spinning on the board's CPU (an ordinary one: it shares the CPU, as another program would)."""
    if not active:
        yield
        return
    code = f"import os\nos.sched_setaffinity(0, {{{BOARD_CPU}}})\nwhile True:\n    pass\n" if PINNED else "while True:\n    pass\n"
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        yield
    finally:
        proc.kill()
        proc.wait()


class BusyHead:
    """The full model back to back in a thread of the board's process: its CPU and GIL never idle."""

    def __init__(self, runner: DeviceRunner) -> None:
        self.runner = runner
        self.stop = threading.Event()
        shape = (1, *runner.bundle.manifest.model.input_shape)
        self.x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            self.runner.run_full(self.x)

    def __enter__(self) -> "BusyHead":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


async def sample_run(bundle: Bundle, runner: DeviceRunner, address: str, workload: str, timing: str,
                     seconds: float, warmup_s: float, rate_changes: list[tuple[float, float]] | None = None,
                     link: EmulatedLink | None = None) -> list[tuple[float, float | None]]:
    """One run: ``(seconds since the start, estimate)`` every SAMPLE_S after ``warmup_s``.
    ``rate_changes``: ``(at_s, rate_mbit)`` applied to ``link`` during the run."""
    hosts = HostLink(bundle, address, timeout=30.0)
    assert await hosts.connect(), hosts.last_error
    if timing == "device":
        device_timing(hosts.client)
    split = LOCAL if workload == "probes" else OFFLOAD
    config = PipelineConfig(request_timeout_s=30.0, deadline_ms=None)
    meter = LinkMeter()
    pipeline = Pipeline(runner, StaticPolicy(split, bundle), hosts, config, meter)
    samples: list[tuple[float, float | None]] = []
    stop = asyncio.Event()
    start = time.monotonic()

    async def sampler() -> None:
        pending = list(rate_changes or [])
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            now = time.monotonic() - start
            while pending and now >= pending[0][0]:
                _, rate = pending.pop(0)
                await loop.run_in_executor(None, link.set_rate, rate)
            if now >= warmup_s:
                samples.append((now, meter.rate_bps))
            if now >= seconds:
                stop.set()
                return
            await asyncio.sleep(SAMPLE_S)

    task = asyncio.ensure_future(sampler())
    try:
        with Synthetic(fps=5) as source:
            async for _ in pipeline.run(source, stop=stop):
                pass
    finally:
        stop.set()
        await task
        await hosts.close()
    return samples


def ratios(samples: list[tuple[float, float | None]], reference_bps: float) -> dict[str, float]:
    values = sorted((r or 0.0) / reference_bps for _, r in samples)
    return {"median": statistics.median(values), "p5": values[len(values) // 20], "n": len(values)}


def settle_s(samples: list[tuple[float, float | None]], step_at: float, until: float, target_bps: float) -> float | None:
    """Seconds after ``step_at`` from which the estimate stays within 15 % of ``target_bps`` until ``until``."""
    window = [(t, r) for t, r in samples if step_at <= t < until]
    settled = None
    for t, r in window:
        inside = r is not None and abs(r / target_bps - 1.0) <= 0.15
        if inside and settled is None:
            settled = t
        elif not inside:
            settled = None
    return None if settled is None else settled - step_at


@contextmanager
def loopback_host(bundle_root: Path, port: int) -> Iterator[str]:
    def pin() -> None:
        if PINNED:
            os.sched_setaffinity(0, {HOST_CPU})

    proc = subprocess.Popen([sys.executable, "-m", "host_runtime.cli", "serve", str(bundle_root), "--interface",
                             "127.0.0.1", "--port", str(port), "--no-zeroconf", *HOST_ARGS],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=pin)
    with running_host(proc, "127.0.0.1", port) as address:
        yield address


def measure_link(label: str, shaped_bps: float | None, address: str, bundle: Bundle, runner: DeviceRunner,
                 args: argparse.Namespace, rows: list[dict]) -> None:
    goodput = asyncio.run(goodput_bps(address))
    with hog(True), BusyHead(runner):  # what the link carries for a board this busy: its own CPU drives the socket
        busy_goodput = asyncio.run(goodput_bps(address))
    print(f"\n== {label}: goodput {goodput / 1e6:.1f} Mbit/s, {busy_goodput / 1e6:.1f} from the saturated board",
          flush=True)
    for workload in args.workloads.split(","):
        for board in ("idle", "saturated"):
            for timing in ("kernel", "device"):
                with hog(board == "saturated"), (BusyHead(runner) if board == "saturated" else _nothing()):
                    samples = asyncio.run(sample_run(bundle, runner, address, workload, timing, args.seconds,
                                                     args.warmup))
                row = {"link": label, "shaped_mbit": shaped_bps and shaped_bps / 1e6, "goodput_mbit": goodput / 1e6,
                       "workload": workload, "board": board, "timing": timing,
                       "estimate_mbit": {"median": statistics.median((r or 0.0) for _, r in samples) / 1e6,
                                         "p5": sorted((r or 0.0) for _, r in samples)[len(samples) // 20] / 1e6},
                       "vs_goodput": ratios(samples, goodput),
                       "busy_goodput_mbit": busy_goodput / 1e6}
                if board == "saturated":
                    row["vs_busy_goodput"] = ratios(samples, busy_goodput)
                if shaped_bps is not None:
                    row["vs_shaped"] = ratios(samples, shaped_bps)
                rows.append(row)
                print_row(row)


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def print_row(row: dict) -> None:
    shaped = row.get("vs_shaped")
    vs_shaped = f"{shaped['median']:5.2f} {shaped['p5']:5.2f}" if shaped else "    -     -"
    g = row["vs_goodput"]
    e = row["estimate_mbit"]
    busy = row.get("vs_busy_goodput")
    vs_busy = f" | vs saturated board's goodput {busy['median']:5.2f} {busy['p5']:5.2f}" if busy else ""
    print(f"{row['link']:>10s} {row['workload']:8s} {row['board']:9s} {row['timing']:6s} | estimate median "
          f"{e['median']:9.1f} p5 {e['p5']:9.1f} Mbit/s | vs shaped {vs_shaped} | vs goodput {g['median']:5.2f} "
          f"{g['p5']:5.2f}{vs_busy}", flush=True)


def step_test(rates: tuple[float, float], bundle: Bundle, args: argparse.Namespace, port: int) -> list[dict]:
    """A → B → A under the saturated board offloading; settling times per step, both timings."""
    a, b = rates
    phase = args.step_phase
    out = []
    with EmulatedLink(rate_mbit=a) as link, serve_in(link, [bundle.root], port, HOST_ARGS) as address:
        goodput = {}
        for rate in (a, b):
            link.set_rate(rate)
            goodput[rate] = asyncio.run(goodput_bps(address))

        def runs(runner: DeviceRunner) -> None:
            for timing in ("kernel", "device"):
                link.set_rate(a)
                with hog(True), BusyHead(runner):
                    samples = asyncio.run(sample_run(bundle, runner, address, "offload", timing, 3 * phase, 1.0,
                                                     [(phase, b), (2 * phase, a)], link))
                row = {"steps": f"{a:g}->{b:g}->{a:g}", "timing": timing,
                       "settle_s": [settle_s(samples, phase, 2 * phase, goodput[b]),
                                    settle_s(samples, 2 * phase, 3 * phase, goodput[a])],
                       "goodput_mbit": {f"{k:g}": v / 1e6 for k, v in goodput.items()},
                       "samples": [(round(t, 3), r and round(r / 1e6, 2)) for t, r in samples]}
                print(f"step {row['steps']} Mbit/s (goodput {goodput[a] / 1e6:.1f} / {goodput[b] / 1e6:.1f}), "
                      f"{timing}: within 15 % of the goodput for good after "
                      f"{', '.join('never' if v is None else f'{v:.2f} s' for v in row['settle_s'])}", flush=True)
                out.append(row)

        board_side(runs, bundle)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, default=Path("build/test-bundle"))
    parser.add_argument("--rates", default="5,50,500", help="tbf rates, Mbit/s (default 5,50,500)")
    parser.add_argument("--workloads", default="probes,offload")
    parser.add_argument("--seconds", type=float, default=12.0, help="each run's length (default 12)")
    parser.add_argument("--warmup", type=float, default=3.0, help="not sampled at the start of a run (default 3)")
    parser.add_argument("--no-loopback", action="store_true")
    parser.add_argument("--step", default="50,5", help="A,B: a rate step A -> B -> A (default 50,5; '' for none)")
    parser.add_argument("--step-phase", type=float, default=6.0, help="seconds at each rate of the step (default 6)")
    parser.add_argument("--out", type=Path, default=Path("build/bench/rate_estimate.json"))
    args = parser.parse_args()
    reason = unavailable_reason()
    if reason is not None:
        raise SystemExit(f"cannot emulate a link here: {reason}")
    if PINNED:
        os.sched_setaffinity(0, {HOST_CPU})  # hosts started from here inherit it; the board moves below
    bundle = Bundle.load(args.bundle)
    rows: list[dict] = []
    report = {"benchmark": "rate_estimate", "machine": platform.machine(), "python": platform.python_version(),
              "cpus": os.cpu_count(), "load_before": os.getloadavg(), "rows": rows}
    port = free_port()
    for rate in [float(r) for r in args.rates.split(",") if r]:
        with EmulatedLink(rate_mbit=rate) as link, serve_in(link, [bundle.root], port, HOST_ARGS) as address:
            board_side(lambda runner: measure_link(f"{rate:g}", rate * 1e6, address, bundle, runner, args, rows), bundle)
    if not args.no_loopback:
        with loopback_host(bundle.root, free_port()) as address:
            board_side(lambda runner: measure_link("loopback", None, address, bundle, runner, args, rows), bundle)
    if args.step:
        a, b = (float(x) for x in args.step.split(","))
        report["steps"] = step_test((a, b), bundle, args, free_port())
    report["load_after"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"\nload average before {report['load_before']}, after {report['load_after']}; wrote {args.out}")


def board_side(work, bundle: Bundle):
    """Run ``work(runner)`` as the board: this process on the board's CPU, the host's left alone."""
    if PINNED:
        os.sched_setaffinity(0, {BOARD_CPU})
    try:
        return work(DeviceRunner(bundle, threads=1))
    finally:
        if PINNED:
            os.sched_setaffinity(0, {HOST_CPU})


if __name__ == "__main__":
    main()
