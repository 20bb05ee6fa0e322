"""A field trial against its floor: how close a paced camera's frames come to what the board's own calibration says they cost.

Issue 29's trial, on one machine:

* the camera is a real street-scene video (OpenCV's ``vtest.avi``: 768×576, 10 fps, 795
  frames, from Debian's ``opencv-doc``), replayed with ``--realtime``: a live camera's pace;
* the board is ``split-device`` on a CPU of its own (its **whole core**, unlike
  ``bench/dynamic_split.py``'s quarter); the host (one worker, one onnxruntime thread) runs in
  a network namespace on the other CPU behind a ``tbf``-shaped veth (:class:`testbed.EmulatedLink`)
  and a :class:`testbed.DelayRelay` adding ``--delay-ms`` each way (this kernel has no netem);
* ``split-device calibrate --frame 768x576`` times the board (preprocessing that frame included,
  paced at the camera's rate), the host and the link; then ``run --split auto --realtime``
  while ``--schedule`` drives the link's rate (written into the trace);
* each answered frame's **floor** is what the calibration's latency model (DSC Eq. 4 plus the
  preprocessing stage; ``calibration.LatencyModel.predict_ms``) gives for the split that frame
  took at the rate the link really had when it was captured: preprocessing + head +
  bytes ÷ shaped rate + the calibrated round trip + tail. Latency ÷ floor is what the run's own
  machinery (queues, threads, the event loop, the video's decoding beside it) adds. The best
  option's floor at that rate is reported too: what a perfect choice would have cost.

Target (issue 29.5): p50 latency at most 1.10× the p50 floor.

Needs root (namespaces, tbf) and ``apt install opencv-doc``. Results: JSON (``--out``) and a table.

    python bench/field_floor.py --weights mobilenet_v2-b0353104.pth --out build/bench/field_floor.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
from dynamic_split import HOST_ARGS, PINNED, PORT, build_bundles, device, frames_in_window, on_schedule, run_device

from calibration.calibration_file import load
from testbed import DelayRelay, EmulatedLink, RateSchedule, unavailable_reason
from testbed._namespace_host import serve_in

VIDEO = Path("/usr/share/doc/opencv-doc/examples/data/vtest.avi")
HOST_CPU = 0


@contextmanager
def relayed(target: tuple[str, int], delay_ms: float) -> Iterator[str]:
    """A :class:`DelayRelay` to ``target`` on an event loop of its own thread; yields ``ADDRESS:PORT``."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="relay", daemon=True)
    thread.start()
    relay = DelayRelay(target, delay_ms)
    try:
        host, port = asyncio.run_coroutine_threadsafe(relay.start(), loop).result(timeout=30)
        yield f"{host}:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(relay.close(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


def calibrate(bundle: Path, host: str, fps: float, frame: str) -> None:
    cal = device(["calibrate", str(bundle), "--host", host, "--batch", "1", "--repeats", "20", "--threads", "1",
                  "--fps", f"{fps:g}", "--frame", frame], stdout=sys.stderr, stderr=sys.stderr, text=True)
    if cal.wait(timeout=900) != 0:
        raise SystemExit(f"split-device calibrate failed ({cal.returncode})")


def floors(frames: list[dict], model, schedule: RateSchedule) -> list[dict]:
    """Each answered frame with its floor (its own split's prediction at the link's real rate) and
    the best option's."""
    options = [t.split for t in model.splits]
    out = []
    for f in frames:
        if f["dropped"]:
            continue
        rate_bps = schedule.rate_at(f["s"]) * 1e6
        best = min(options, key=lambda o: model.predict_ms(o, 1, rate_bps))
        out.append({**f, "rate_bps_true": rate_bps, "floor_ms": model.predict_ms(f["split"], 1, rate_bps),
                    "best": best, "best_floor_ms": model.predict_ms(best, 1, rate_bps),
                    "floor_terms": model.terms_ms(f["split"], 1, rate_bps)})
    return out


def summarise(rows: list[dict], everything: int) -> dict:
    total = [r["total_ms"] for r in rows]
    floor = [r["floor_ms"] for r in rows]
    ratio = [r["total_ms"] / r["floor_ms"] for r in rows]
    stages = {k: statistics.median(r[k] for r in rows) for k in
              ("preprocess_ms", "head_ms", "transfer_ms", "tail_ms", "queue_ms", "slot_ms", "host_queue_ms")}
    terms = {k: statistics.median(r["floor_terms"].get(k, 0.0) for r in rows) for k in
             ("preprocess", "head", "transfer", "tail")}
    return {
        "frames": everything, "answered": len(rows),
        "p50_ms": float(np.percentile(total, 50)), "p95_ms": float(np.percentile(total, 95)),
        "floor_p50_ms": float(np.percentile(floor, 50)), "floor_p95_ms": float(np.percentile(floor, 95)),
        "p50_over_floor": float(np.percentile(total, 50) / np.percentile(floor, 50)),
        "p95_over_floor": float(np.percentile(total, 95) / np.percentile(floor, 95)),
        "median_frame_ratio": statistics.median(ratio),
        "best_floor_p50_ms": float(np.percentile([r["best_floor_ms"] for r in rows], 50)),
        "splits": {s: sum(1 for r in rows if r["split"] == s) for s in sorted({r["split"] for r in rows})},
        "measured_stage_p50_ms": stages, "floor_term_p50_ms": terms,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", required=True, help="MobileNetV2 ImageNet state dict")
    parser.add_argument("--video", type=Path, default=VIDEO, help=f"the camera (default {VIDEO})")
    parser.add_argument("--fps", type=float, default=10.0, help="the video's frame rate, for calibration's pacing")
    parser.add_argument("--frame", default="768x576", help="the video's frame size, for calibration")
    parser.add_argument("--schedule", default="20:39.8,3:40", help="RATE_MBIT:SECONDS,... (default: issue 29's trial)")
    parser.add_argument("--delay-ms", type=float, default=5.0, help="one-way delay each way (default 5)")
    parser.add_argument("--bundles", type=Path, default=Path("build/bench/dynamic-bundles"),
                        help="where bench/dynamic_split.py's bundles are (built if missing); this bench calibrates a copy")
    parser.add_argument("--out", type=Path, default=Path("build/bench/field_floor.json"))
    parser.add_argument("--traces", type=Path, default=Path("build/bench/field_floor_traces"))
    args = parser.parse_args()
    if not args.video.is_file():
        raise SystemExit(f"no video at {args.video}: apt install opencv-doc, or give --video")
    reason = unavailable_reason()
    if reason is not None:
        raise SystemExit(f"cannot emulate a link here: {reason}")
    schedule = RateSchedule.parse(args.schedule)
    source = build_bundles(args.weights, args.bundles)["mobilenet_v2"]
    bundle = args.traces / "bundle"
    if bundle.exists():
        shutil.rmtree(bundle)
    args.traces.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source, bundle, ignore=shutil.ignore_patterns("calibration.json"))
    trace = args.traces / "auto.jsonl"
    if PINNED:
        os.sched_setaffinity(0, {HOST_CPU})  # the host and the relay; the board is pinned to its own CPU
    with EmulatedLink() as link:
        with serve_in(link, [bundle], PORT, HOST_ARGS), relayed((link.namespace_address, PORT), args.delay_ms) as host:
            link.set_rate(schedule.rate_at(0))
            calibrate(bundle, host, args.fps, args.frame)
            model = load(bundle / "calibration.json").model
            start = run_device(bundle, host, "auto", str(args.video), trace, extra=["--realtime"],
                               during=on_schedule(link, schedule))
    frames, _ = frames_in_window(trace, start, schedule.duration_s)
    rows = floors(frames, model, schedule)
    step = schedule.steps[0].duration_s
    report = {
        "benchmark": "field_floor", "machine": platform.machine(), "python": platform.python_version(),
        "schedule": args.schedule, "delay_ms": args.delay_ms, "video": str(args.video), "pinned": PINNED,
        "calibration": {"preprocess_ms": model.preprocess_ms, "rtt_ms": model.rtt_ms},
        "all": summarise(rows, len(frames)),
        "before_step": summarise([r for r in rows if r["s"] < step], sum(1 for f in frames if f["s"] < step)),
        "after_step": summarise([r for r in rows if r["s"] >= step], sum(1 for f in frames if f["s"] >= step)),
    }
    print(f"\nfield trial against its floor: {args.video.name} at {args.fps:g} fps, schedule {args.schedule} Mbit/s:s, "
          f"{args.delay_ms:g} ms each way, board = one whole core; calibrated preprocessing {model.preprocess_ms:.2f} ms, "
          f"round trip {model.rtt_ms:.2f} ms")
    print(f"{'part':12s} {'answered':>9s} {'p50 ms':>7s} {'floor':>7s} {'ratio':>6s} {'p95 ms':>7s} {'floor':>7s} {'ratio':>6s} "
          f"{'best floor':>10s}  splits")
    for part in ("all", "before_step", "after_step"):
        s = report[part]
        print(f"{part:12s} {s['answered']:4d}/{s['frames']:<4d} {s['p50_ms']:7.1f} {s['floor_p50_ms']:7.1f} "
              f"{s['p50_over_floor']:6.2f} {s['p95_ms']:7.1f} {s['floor_p95_ms']:7.1f} {s['p95_over_floor']:6.2f} "
              f"{s['best_floor_p50_ms']:10.1f}  {s['splits']}")
    s = report["all"]
    print("measured stages p50 ms:", {k: round(v, 2) for k, v in s["measured_stage_p50_ms"].items()})
    print("floor terms p50 ms:    ", {k: round(v, 2) for k, v in s["floor_term_p50_ms"].items()})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}; the trace: {trace} (split-device report reads it)")


if __name__ == "__main__":
    main()
