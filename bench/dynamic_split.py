"""Dynamic split computing on an emulated link: ``--split auto`` against every static split and the oracle.

For each model (MobileNetV2 with its ImageNet weights, and ResNet-18), on one machine:

* the **host** (``split-host serve``) runs in a network namespace behind a veth pair shaped
  by the kernel's ``tbf`` (:class:`testbed.EmulatedLink`);
* the **board** is ``split-device`` in the root namespace, pinned to one CPU of which it gets
  ``--board-cpu`` (default 0.25: a Raspberry-Pi-class board is several times slower than
  this machine's cores; without the cap board and host would be equally fast and nothing
  would ever be worth offloading): a real-time process takes the rest of every millisecond
  (``bench/slow_board.py`` says why not a cgroup quota). The host (one worker, one
  onnxruntime thread) is pinned to another CPU: two machines, not two processes fighting
  over the same cores;
* ``split-device calibrate`` measures the board (its runs paced as the camera's frames,
  ``--fps``), the host (``profile``) and the link, and writes the table (DSC Eq. 4-6);
* **prediction**: every option (local, offload, each split) runs 20 frames at 2 frames/s
  (no queueing) at two fixed rates, ``--rounds`` times; the measured median (frames 3-20 of
  every round) of head + transfer + tail is compared with the model's prediction for the
  rate a 1 MB bulk transfer measures on the link at that setting (tbf's nominal rate less
  the headers: what the device gets);
* **schedule**: a live synthetic camera (``--fps``, newest frames win) runs ``--split auto``
  and every static option while ``--schedule`` drives the link's rate; each run's trace
  gives mean, median and p95 latency, frames per second and the drop rate. Each policy runs
  the schedule ``--rounds`` times (every other round in reverse order), pooled. The
  **oracle** is the best option for each frame in hindsight: per camera frame slot of the
  schedule, the lowest of the static options' latencies for the frame captured in that slot,
  each averaged over the rounds (so a noisy board's lucky run is not taken for the best option);
* **decision cost**: the selector's mean time per choice on the calibrated table;
* **throughput**: a split fed as fast as the camera can go with no drops, against
  1 / (slowest stage) measured in the same run, twice: where the board is the slowest
  stage (the schedule's highest rate) and where the link is (a rate at which the cut takes
  twice the board's time to cross). Everything the board does for a frame (capture,
  preprocessing, head, event loop, socket) runs on its one slowed core, so the board is one
  stage: the share of the core it is left (measured: one less the real-time process's) over
  the CPU seconds it spends per frame (/proc/PID/stat) is the most frames per second it can do.

The traces of every run stay in ``--traces`` (``split-device report`` reads them).

Needs root (network namespaces, tbf, real-time scheduling). Results: JSON (``--out``) and a table.

    python bench/dynamic_split.py --weights mobilenet_v2-b0353104.pth --out build/bench/dynamic_split.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

import numpy as np
from slow_board import cpu_s, slowed_cpu

from calibration import SplitSelector, decision_cost_us
from calibration.calibration_file import load
from device_runtime.bundle import LOCAL, OFFLOAD
from device_runtime.link import HostClient
from fieldtrial._trace import read_trace
from testbed import EmulatedLink, RateSchedule, trace_steps, unavailable_reason
from testbed._namespace_host import serve_in

T = TypeVar("T")
PORT = 7767
PREDICTION_FRAMES = 20
PREDICTION_RATES_MBIT = (10.0, 100.0)
GOODPUT_PROBE_BYTES = 1 << 20
HOST_ARGS = ("--workers", "1", "--threads", "1")
BOARD_CPU, HOST_CPU = 1, 0  # when the machine has two CPUs or more
#: Board and host each on a CPU of its own; decided once, before this process (the host's
#: parent) pins itself to the host's CPU.
PINNED = {BOARD_CPU, HOST_CPU} <= os.sched_getaffinity(0)


def device(args: Sequence[str], **kwargs) -> subprocess.Popen:
    """``split-device ARGS`` as the board: on its own (slowed) CPU."""
    def enter() -> None:
        if PINNED:
            os.sched_setaffinity(0, {BOARD_CPU})

    return subprocess.Popen([sys.executable, "-m", "device_runtime.cli", *args], preexec_fn=enter, **kwargs)


def build_bundles(weights: str, root: Path, models: Sequence[str] = ("mobilenet_v2", "resnet18"),
                  **build: Any) -> dict[str, Path]:
    """MobileNetV2 (real weights) and ResNet-18 (of them, ``models``), each cut at its compressive
    bottlenecks; cached under ``root`` (give another ``root`` with ``build``, more
    :class:`exporter.BuildSpec` fields such as ``cut_bits``)."""
    bundles = {"mobilenet_v2": ("torchvision:mobilenet_v2", weights), "resnet18": ("torchvision:resnet18", None)}
    out = {}
    for name in models:
        spec, w = bundles[name]
        path = root / name
        if not (path / "manifest.json").is_file():
            from exporter._build import BuildSpec, build_bundle  # torch: only to build

            build_bundle(BuildSpec(spec, weights=w, splits="auto", **build), path, progress=True)
        out[name] = path
    return out


def run_device(bundle: Path, host: str, split: str, camera: str, trace: Path,
               frames: int | None = None, extra: Sequence[str] = (),
               during: Callable[[subprocess.Popen, Path], T] | None = None, threads: int | None = 1) -> T | None:
    """One ``split-device run`` (``threads`` per session; None: the product's default); ``during(process,
    trace)`` runs while it does (and may end it) and its value is returned."""
    argv = ["run", str(bundle), "--host", host, "--split", split, "--camera", camera, "--trace", str(trace),
            *(["--threads", str(threads)] if threads is not None else []), *extra]
    if frames is not None:
        argv += ["--frames", str(frames)]
    trace.unlink(missing_ok=True)  # progress is read from the trace: not from a previous run's
    proc = device(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    value = None
    try:
        if during is not None:
            value = during(proc, trace)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"split-device run --split {split} failed ({proc.returncode}): {err[-2000:]}")
    return value


def on_schedule(link: EmulatedLink, schedule: RateSchedule) -> Callable[[subprocess.Popen, Path], float]:
    """Drive the link through ``schedule`` from the first traced frame, writing each step into the
    trace (its report draws the real rate), then stop the run; the value is the schedule's
    wall-clock start (for aligning the trace with it)."""

    def during(proc: subprocess.Popen, trace: Path) -> float:
        wait_for_frames(proc, trace, 1)
        started = time.time()
        asyncio.run(asyncio.wait_for(schedule.drive(link, trace_steps(trace)), schedule.duration_s + 10))
        proc.send_signal(signal.SIGINT)
        return started

    return during


def cpu_per_frame(first: int, last: int,
                  thief: subprocess.Popen | None) -> Callable[[subprocess.Popen, Path], tuple[float, float]]:
    """The board's CPU seconds per frame from its ``first`` traced frame to its ``last``: all it
    does for a frame (capture, preprocessing, head, event loop, socket), on any of its threads;
    and the share of its CPU it was left meanwhile (one less the ``thief``'s; 1 without)."""

    def taken() -> float:
        return cpu_s(thief.pid) if thief is not None else 0.0

    def during(proc: subprocess.Popen, trace: Path) -> tuple[float, float]:
        wait_for_frames(proc, trace, first)
        cpu, lines, wall, stolen = cpu_s(proc.pid), _lines(trace), time.perf_counter(), taken()
        wait_for_frames(proc, trace, last)
        share = 1.0 - (taken() - stolen) / (time.perf_counter() - wall)
        return (cpu_s(proc.pid) - cpu) / max(_lines(trace) - lines, 1), share

    return during


def wait_for_frames(proc: subprocess.Popen, trace: Path, frames: int, timeout_s: float = 120.0) -> None:
    """Until the trace has ``frames`` frame records (after its run record), or the run ended."""
    deadline = time.monotonic() + timeout_s  # import, warm-up, connect: then the first frame
    while proc.poll() is None and time.monotonic() < deadline and _lines(trace) < frames + 1:
        time.sleep(0.02)


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def frames_in_window(trace: Path, start_unix: float, duration: float) -> tuple[list[dict], float]:
    """The trace's frames captured during the schedule, each with ``s`` = seconds into it."""
    run, frames = read_trace(trace)
    offset = run["started_unix"] - start_unix
    kept = []
    for f in frames:
        s = f["t"] + offset
        if 0 <= s < duration:
            kept.append({**f, "s": s})
    return kept, duration


def metrics(frames: list[dict], duration: float) -> dict[str, float]:
    answered = [f["total_ms"] for f in frames if not f["dropped"]]
    dropped = sum(1 for f in frames if f["dropped"])
    return {
        "frames": len(frames),
        "mean_ms": float(np.mean(answered)) if answered else float("nan"),
        "p50_ms": float(np.percentile(answered, 50)) if answered else float("nan"),
        "p95_ms": float(np.percentile(answered, 95)) if answered else float("nan"),
        "fps": len(answered) / duration,
        "drop_rate": dropped / len(frames) if frames else float("nan"),
    }


def oracle(static: dict[str, list[dict]], duration: float, fps: float) -> tuple[dict[str, float], dict[str, int]]:
    """The best option for each frame in hindsight.

    The schedule is cut into camera frame slots (1 / fps each); every static run's frames
    fall into the slot of their capture time. An option's latency in a slot is its mean over
    the rounds (every round must have answered it), so the oracle picks the best option, not
    the luckiest run of a noisy board; a slot's oracle latency is the lowest option's, and a
    slot no option answered in every round is a drop. Returns the oracle's metrics and how
    many slots each option won.
    """
    rounds = 1 + max(f["round"] for frames in static.values() for f in frames)
    slots: dict[int, tuple[float, str]] = {}
    for name, frames in static.items():
        per_slot: dict[int, dict[int, list[float]]] = {}  # slot -> round -> latencies
        for f in frames:
            if not f["dropped"]:
                per_slot.setdefault(int(f["s"] * fps), {}).setdefault(f["round"], []).append(f["total_ms"])
        for slot, by_round in per_slot.items():
            ms = statistics.fmean(t for times in by_round.values() for t in times)
            if len(by_round) == rounds and (slot not in slots or ms < slots[slot][0]):
                slots[slot] = (ms, name)
    total = int(duration * fps)
    picked = [{"total_ms": ms, "dropped": False} for ms, _ in slots.values()]
    picked += [{"total_ms": 0.0, "dropped": True}] * max(0, total - len(picked))
    wins: dict[str, int] = {}
    for _, name in slots.values():
        wins[name] = wins.get(name, 0) + 1
    return metrics(picked, duration), wins


def goodput_bps(host: str) -> float:
    """What a bulk transfer gets through the link now: median of 3 pings of 1 MB, less a ping's time."""

    async def measure() -> float:
        address, port = host.rsplit(":", 1)
        client = await HostClient.connect(address, int(port))
        try:
            rtt = min([await client.ping(0) for _ in range(3)])
            bulk = statistics.median([await client.ping(GOODPUT_PROBE_BYTES, timeout=30) for _ in range(3)])
        finally:
            await client.close()
        return GOODPUT_PROBE_BYTES * 8 / ((bulk - rtt) / 1000.0)

    return asyncio.run(measure())


def in_round(options: Sequence[str], r: int) -> Sequence[str]:
    """Round ``r``'s order: every other round in reverse, so no option always runs first or
    last while the machine's speed drifts."""
    return options if r % 2 == 0 else options[::-1]


def predicted_vs_measured(bundle: Path, host: str, calibration, link: EmulatedLink, rounds: int,
                          tmp: Path) -> list[dict]:
    """Each option's measured median against the model's prediction, at each of PREDICTION_RATES_MBIT;
    ``rounds`` runs of each (every other round in reverse order) pooled."""
    rows = []
    options = calibration.table.splits
    for rate in PREDICTION_RATES_MBIT:
        link.set_rate(rate)
        goodput = goodput_bps(host)
        measured: dict[str, list[float]] = {option: [] for option in options}
        for r in range(rounds):
            for option in in_round(options, r):
                trace = tmp / f"predict-{option}-{rate:g}-r{r}.jsonl"
                run_device(bundle, host, option, "synthetic:2", trace, frames=PREDICTION_FRAMES,
                           extra=["--drop", "none"])
                _, frames = read_trace(trace)
                measured[option] += [f["head_ms"] + f["transfer_ms"] + f["tail_ms"] for f in frames[2:] if not f["error"]]
        for option in options:
            predicted = calibration.model.predict_ms(option, 1, goodput)
            m = statistics.median(measured[option])
            rows.append({"option": option, "rate_mbit": rate, "goodput_mbit": goodput / 1e6, "measured_ms": m,
                         "predicted_ms": predicted, "ratio": m / predicted})
    link.set_rate(None)
    return rows


def throughput(bundle: Path, host: str, split: str, link: EmulatedLink, rate: float, thief: subprocess.Popen | None,
               tmp: Path) -> dict[str, float]:
    """Frames per second of a saturated pipeline against 1 / its slowest stage, same run.

    The stages are the board (one slowed CPU does all its work for a frame: the share of the
    CPU it is left over the CPU seconds it spends per frame is the most frames per second it
    can do), the link (a frame's bytes at the goodput a bulk transfer measures at this rate: a
    frame's own transfer time includes waiting behind the batch in flight before it) and the
    host (tail).
    """
    link.set_rate(rate)
    goodput = goodput_bps(host)
    trace = tmp / f"throughput-{split}-{rate:g}.jsonl"
    board_cpu_s, board_share = run_device(bundle, host, split, "synthetic:0", trace, frames=120,
                                          extra=["--drop", "none"], during=cpu_per_frame(20, 110, thief))
    link.set_rate(None)
    _, frames = read_trace(trace)
    frames = frames[20:110]  # past warm-up, as the CPU was counted
    span = frames[-1]["t"] - frames[0]["t"]
    fps = (len(frames) - 1) / span
    stage = {k: statistics.median(f[k] for f in frames) for k in ("preprocess_ms", "head_ms", "transfer_ms", "tail_ms")}
    stage["board_cpu_ms"] = board_cpu_s * 1000.0
    stage["board_share"] = board_share
    stage["link_ms"] = statistics.median(f["bytes"] for f in frames) * 8 / goodput * 1000.0
    stages = {"board": stage["board_cpu_ms"] / board_share, "link": stage["link_ms"], "host": stage["tail_ms"]}
    slowest = max(stages, key=stages.__getitem__)
    bound = 1000.0 / stages[slowest]
    return {"split": split, "rate_mbit": rate, "fps": fps, "stage_ms": stage, "stages_ms": stages, "slowest": slowest,
            "bound_fps": bound, "ratio": fps / bound}


def link_bound_rate(calibration, split: str, board_ms: float) -> float:
    """A rate (Mbit/s) at which ``split``'s cut takes twice ``board_ms`` (the board's stage) to cross."""
    return calibration.model.timings(split).bytes_per_sample * 8 / (2 * board_ms / 1000.0) / 1e6


def calibrate(name: str, bundle: Path, host: str, link: EmulatedLink, fps: float):
    """``split-device calibrate`` on the board, its runs paced as the camera's frames (``fps``)."""
    link.set_rate(None)
    cal = device(["calibrate", str(bundle), "--host", host, "--batch", "1,2,4", "--repeats", "20", "--threads", "1",
                  "--fps", f"{fps:g}"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = cal.communicate(timeout=900)
    if cal.returncode != 0:
        raise RuntimeError(f"calibrate failed: {out[-2000:]}")
    calibration = load(bundle / "calibration.json")
    print(f"\n== {name}: calibrated ({len(calibration.table.splits)} options)")
    return calibration


def bench_model(name: str, bundle: Path, link: EmulatedLink, schedule: RateSchedule, fps: float, rounds: int,
                thief: subprocess.Popen | None, tmp: Path) -> dict:
    host = f"{link.namespace_address}:{PORT}"
    calibration = calibrate(name, bundle, host, link, fps)
    predictions = predicted_vs_measured(bundle, host, calibration, link, rounds, tmp)
    options = ("auto", *calibration.table.splits)
    runs: dict[str, list[dict]] = {option: [] for option in options}
    for r in range(rounds):
        for option in in_round(options, r):
            trace = tmp / f"{name}-{option}-r{r}.jsonl"
            link.set_rate(schedule.rate_at(0))
            start = run_device(bundle, host, option, f"synthetic:{fps:g}", trace, during=on_schedule(link, schedule))
            frames, _ = frames_in_window(trace, start, schedule.duration_s)
            runs[option] += [{**f, "round": r} for f in frames]
            m = metrics(frames, schedule.duration_s)
            print(f"  round {r} {option:24s} mean {m['mean_ms']:8.1f} ms  p50 {m['p50_ms']:8.1f} ms  "
                  f"p95 {m['p95_ms']:8.1f} ms  {m['fps']:5.1f} fps  drops {m['drop_rate']:6.1%}")
    results = {option: metrics(runs[option], schedule.duration_s * rounds) for option in options}
    results["auto"]["splits"] = sorted({f["split"] for f in runs["auto"] if not f["dropped"]})
    static = {k: v for k, v in runs.items() if k != "auto"}
    results["oracle"], oracle_wins = oracle(static, schedule.duration_s, fps)
    best_static = min(static, key=lambda k: results[k]["mean_ms"])
    selector = SplitSelector(calibration.table, calibration.model)
    return {
        "calibration": {"link": calibration.link, "options": list(calibration.table.splits)},
        "prediction": predictions,
        "schedule": results,
        "oracle_wins": oracle_wins,
        "best_static": best_static,
        "auto_vs_best_static": {k: results["auto"][k] / results[best_static][k] for k in ("mean_ms", "p50_ms", "p95_ms")},
        "auto_vs_oracle": {k: results["auto"][k] / results["oracle"][k] for k in ("mean_ms", "p50_ms", "p95_ms")},
        "decision_us": decision_cost_us(selector),
        "throughput": throughputs(bundle, host, calibration, schedule, link, thief, tmp),
    }


def throughputs(bundle: Path, host: str, calibration, schedule: RateSchedule, link: EmulatedLink,
                thief: subprocess.Popen | None, tmp: Path) -> list[dict]:
    """The table's split at the schedule's highest rate (the first cut if that is local or offload),
    where the board is the slowest stage, then at a rate where the link is."""
    high = max(step.rate_mbit for step in schedule.steps)
    best_at_high = calibration.table.lookup(1, high * 1e6)
    split = best_at_high if best_at_high not in (LOCAL, OFFLOAD) else next(
        s for s in calibration.table.splits if s not in (LOCAL, OFFLOAD))
    board_bound = throughput(bundle, host, split, link, high, thief, tmp)
    board_ms = board_bound["stages_ms"]["board"]
    return [board_bound,
            throughput(bundle, host, split, link, link_bound_rate(calibration, split, board_ms), thief, tmp)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", required=True, help="MobileNetV2 ImageNet state dict")
    parser.add_argument("--schedule", default="1000:8,100:8,5:8",
                        help="RATE_MBIT:SECONDS,... (default 1000:8,100:8,5:8)")
    parser.add_argument("--fps", type=float, default=5.0, help="the live camera's frame rate (default 5)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="times each option runs the schedule and the prediction's frames, every other round in "
                             "reverse order (default 2)")
    parser.add_argument("--board-cpu", type=float, default=0.25, help="the board's CPU, in cores (default 0.25)")
    parser.add_argument("--bundles", type=Path, default=Path("build/bench/dynamic-bundles"))
    parser.add_argument("--models", default="mobilenet_v2,resnet18")
    parser.add_argument("--out", type=Path, default=Path("build/bench/dynamic_split.json"))
    parser.add_argument("--only", choices=("prediction", "throughput"),
                        help="re-run only this part, updating --out: prediction calibrates again, throughput "
                             "uses the calibrations already written")
    parser.add_argument("--traces", type=Path, default=Path("build/bench/dynamic_split_traces"),
                        help="where every run's trace is kept (default build/bench/dynamic_split_traces)")
    args = parser.parse_args()
    reason = unavailable_reason()
    if reason is not None:
        raise SystemExit(f"cannot emulate a link here: {reason}")
    schedule = RateSchedule.parse(args.schedule)
    bundles = build_bundles(args.weights, args.bundles)
    chosen = [m for m in args.models.split(",") if m]
    report = {"benchmark": "dynamic_split", "machine": platform.machine(), "python": platform.python_version(),
              "schedule": args.schedule, "rounds": args.rounds, "fps": args.fps, "board_cpu": args.board_cpu, "models": {}}
    if args.only:
        report = json.loads(args.out.read_text())
    args.traces.mkdir(parents=True, exist_ok=True)
    if PINNED:
        os.sched_setaffinity(0, {HOST_CPU})  # the host (started from here) inherits it
    slowed = slowed_cpu(BOARD_CPU, args.board_cpu) if PINNED else nullcontext(None)
    with EmulatedLink() as link, slowed as thief:
        with serve_in(link, [bundles[m] for m in chosen], PORT, HOST_ARGS):
            for name in chosen:
                host = f"{link.namespace_address}:{PORT}"
                if args.only == "throughput":
                    calibration = load(bundles[name] / "calibration.json")
                    report["models"][name]["throughput"] = throughputs(bundles[name], host, calibration, schedule, link,
                                                                       thief, args.traces)
                elif args.only == "prediction":
                    calibration = calibrate(name, bundles[name], host, link, args.fps)
                    report["models"][name]["prediction"] = predicted_vs_measured(bundles[name], host, calibration,
                                                                                 link, args.rounds, args.traces)
                else:
                    report["models"][name] = bench_model(name, bundles[name], link, schedule, args.fps, args.rounds, thief,
                                                         args.traces)
    print_tables(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


def print_tables(report: dict) -> None:
    for name, r in report["models"].items():
        print(f"\n{name}: schedule {report['schedule']} Mbit/s:s, board = {report['board_cpu']} core")
        print(f"{'policy':24s} {'mean ms':>8s} {'p50 ms':>8s} {'p95 ms':>8s} {'fps':>6s} {'drops':>7s}")
        for policy, m in r["schedule"].items():
            print(f"{policy:24s} {m['mean_ms']:8.1f} {m['p50_ms']:8.1f} {m['p95_ms']:8.1f} {m['fps']:6.1f} {m['drop_rate']:7.1%}")
        for other in ("best_static", "oracle"):
            label = f"best static ({r['best_static']})" if other == "best_static" else "oracle"
            ratios = r[f"auto_vs_{other}"]
            print(f"auto / {label}: mean {ratios['mean_ms']:.2f}, p50 {ratios['p50_ms']:.2f}, p95 {ratios['p95_ms']:.2f}")
        print(f"decision {r['decision_us']:.1f} µs; oracle's winning options per slot: {r['oracle_wins']}")
        print(f"{'option':24s} {'Mbit/s':>7s} {'goodput':>8s} {'measured':>9s} {'predicted':>9s} {'ratio':>6s}")
        for p in r["prediction"]:
            print(f"{p['option']:24s} {p['rate_mbit']:7.0f} {p['goodput_mbit']:8.1f} {p['measured_ms']:9.1f} "
                  f"{p['predicted_ms']:9.1f} {p['ratio']:6.2f}")
        for t in r["throughput"]:
            stages = ", ".join(f"{k} {v:.1f}" for k, v in t["stages_ms"].items())
            print(f"throughput {t['split']} at {t['rate_mbit']:.0f} Mbit/s: {t['fps']:.1f} fps; stages ms/frame: {stages}; "
                  f"slowest {t['slowest']}: bound {t['bound_fps']:.1f} fps, ratio {t['ratio']:.2f}")


if __name__ == "__main__":
    main()
