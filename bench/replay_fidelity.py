"""Replay fidelity: an emulated trial and its replay (``python -m testbed replay``), frame by frame.

Issue 31's target: replaying an emulated run's own trace reproduces its split sequence on at
least 90 % of frames and its p50 latency within 10 %. On one machine (as root):

* the **bundle**: the test bundle (``--bundle``, default build/test-bundle: MobileNetV2 cut at
  features_4 and features_14) copied into ``--work`` and calibrated there (``split-device
  calibrate``, board and host as below, the link unshaped: what the table needs is the board's
  and the host's times; its rates are the table's axis);
* the **board** is ``split-device`` pinned to one CPU of which it gets ``--board-cpu``
  (default 0.25; bench/slow_board.py: a real-time process takes the rest), the **host** (``split-host
  serve`` in the link's namespace, :func:`testbed.serve_in`) pinned to the other, as in
  bench/dynamic_split.py; both at ``--nice`` (default -10, as root): on a machine others use, the
  quarter core left to the board stays the board's rather than being shared with their work (a
  real board's CPU is its own), so the trial and its replay are not run on boards of other speeds;
* the **camera**: a video made of the test photos (``--fps``, a new photo every second), played
  with ``--realtime`` as a live camera, so both runs see the same frames at the same instants
  and the replay finds the input by itself (the trace names the file);
* the **original**: ``split-device run --split auto`` while a schedule drives the kernel link
  from the first traced frame (``testbed.trace_steps`` writes each step into its trace, as any
  testbed run does). ``--schedule auto`` (default): one step per cell of the calibrated table at
  batch 1, at the geometric middle of the cell's rates (the open ends at 10 times their edge,
  within 0.5-800 Mbit/s; none in a cell narrower than the hysteresis' margin, see
  :data:`NARROWEST_CELL`), high to low, then up and down again ``--sweeps`` times, ``--step-s`` each;
* the **replay**: :func:`testbed._replay.replay` of that trace with the same bundle and policy
  (its own link and host, set up afresh); its board decides with the head times the original
  recorded (``--board-times``, default recorded: the replay's own default for the trial's bundle)
  or, with ``--board-times measured``, with its own; and it runs at the original board's speed
  (``--board-speed``, default recorded, again the replay's own default: each stage held to its
  time in the original, frame by frame), which a board can only do where it is at least as fast:
  the replay's board gets ``--replay-board-cpu`` (default 0.3) of its CPU, a fifth more than the
  original's, so that a machine slower by a few per cent than during the original still leaves it
  room (the stages it ran slower are counted in its log, ``board.log``), while what the board does
  beside its stages (decoding the video, its event loop, its trace) runs at about the original's
  speed: with half a core it did that faster, and its frames waited less (1.6 against 4.3 ms);
* the **figures**: :func:`fieldtrial._compare.agreement` (frames matched by index: the share of
  the original's answered frames the replay answered on the same split, and the ratio of the
  p50 latencies), printed and written to ``--out``; ``--report DIR`` also writes
  ``split-device report`` of the two (the pictures of docs/fieldtrial.md).

    python bench/replay_fidelity.py --out build/bench/replay_fidelity.json --report build/bench/replay-report
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Sequence

from slow_board import slowed_cpu

from calibration.calibration_file import load
from fieldtrial._compare import agreement, write_comparison
from fieldtrial._trace import load_trace
from testbed import EmulatedLink, RateSchedule, trace_steps, unavailable_reason
from testbed._namespace_host import own_peer, serve_in
from testbed._replay import BOARD_LOG, MEASURED, OWN, RECORDED, TRACE_FILE, replay

PORT = 7767
BOARD_CPU, HOST_CPU = 1, 0
PINNED = {BOARD_CPU, HOST_CPU} <= os.sched_getaffinity(0)
#: The rates an automatic schedule keeps within (tbf shapes them faithfully on a veth).
LOWEST_MBIT, HIGHEST_MBIT = 0.5, 800.0
TARGET_AGREEMENT, TARGET_P50 = 0.9, 0.1
#: The open cells (below the first edge, above the last) end this many times past their edge. At 3
#: the low step sat where a board slowed to a quarter core, re-timing its heads as it ran, moved
#: the edge to (measured: the split there followed the board's speed, not the link).
OPEN_END = 10.0
#: A cell narrower than this (its upper edge over its lower) gets no step: with AutoPolicy's
#: hysteresis (a split must be predicted 10 % faster to take over) the three splits around it are
#: all within that margin there, and which one runs is whichever ran before (measured: at a step in
#: a 47.3-53.1 Mbit/s cell one run held offload and its replay held local for 4 s, after one
#: upload came back late in the replay) — a coin the run tosses, not anything a replay could repeat.
NARROWEST_CELL = 1.1 ** 2


def pinned_board() -> None:
    if PINNED:
        os.sched_setaffinity(0, {BOARD_CPU})


def device(argv: Sequence[str], log: Any) -> subprocess.Popen:
    """``split-device ARGV`` as the board, on its own (slowed) CPU: also the replay's launcher."""
    return subprocess.Popen([sys.executable, "-m", "device_runtime.cli", *argv], stdout=log,
                            stderr=subprocess.STDOUT, preexec_fn=pinned_board)


def make_video(photos: Path, path: Path, fps: float, seconds: float) -> Path:
    """A video of the photos, a new one every second, ``seconds`` long at ``fps``."""
    import cv2

    images = [cv2.resize(cv2.imread(str(p)), (320, 240)) for p in sorted(photos.glob("*.png"))]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (320, 240))
    if not writer.isOpened():
        raise SystemExit(f"cannot write {path} with OpenCV's mp4v codec")
    for i in range(int(seconds * fps)):
        writer.write(images[int(i / fps) % len(images)])
    writer.release()
    return path


def auto_schedule(calibration, step_s: float, sweeps: int) -> RateSchedule:
    """A step in the middle of each cell of the table at batch 1 (but those narrower than
    :data:`NARROWEST_CELL`), high to low and back up, ``sweeps`` times."""
    edges = [rate / 1e6 for rate, _, _ in calibration.table.boundaries(1)]
    if not edges:
        raise SystemExit("the calibrated table has one split at every rate: nothing to switch (give --schedule)")
    bounds = [edges[0] / OPEN_END, *edges, edges[-1] * OPEN_END]
    middles = [min(max(math.sqrt(lo * hi), LOWEST_MBIT), HIGHEST_MBIT) for lo, hi in zip(bounds, bounds[1:])
               if hi / lo >= NARROWEST_CELL]
    middles = [m for i, m in enumerate(middles) if i == 0 or m != middles[i - 1]]  # cells outside the range: one step
    rates = middles[::-1]
    for _ in range(sweeps):
        rates += middles[1:] + middles[::-1][1:]
    return RateSchedule.parse(",".join(f"{rate:.3g}:{step_s:g}" for rate in rates))


def calibrate(bundle: Path, host: str, link: EmulatedLink, fps: float) -> None:
    link.set_rate(None)
    with open(bundle.parent / "calibrate.log", "w") as log:
        proc = device(["calibrate", str(bundle), "--host", host, "--batch", "1", "--repeats", "20", "--threads", "1",
                       "--fps", f"{fps:g}"], log)
        if proc.wait(timeout=900) != 0:
            raise SystemExit(f"calibrate failed: see {bundle.parent / 'calibrate.log'}")


def original_run(bundle: Path, host: str, link: EmulatedLink, schedule: RateSchedule, video: Path,
                 trace: Path) -> None:
    """``split-device run --split auto`` on the video while ``schedule`` drives the link from the first
    traced frame; the run ends with the video."""
    link.set_rate(schedule.rate_at(0))
    trace.unlink(missing_ok=True)
    record = trace_steps(trace)  # imports the board runtime: before the clock starts
    with open(trace.with_suffix(".log"), "w") as log:
        proc = device(["run", str(bundle), "--host", host, "--split", "auto", "--camera", str(video), "--realtime",
                       "--trace", str(trace), "--threads", "1"], log)
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline and _lines(trace) < 2:
            time.sleep(0.02)
        asyncio.run(schedule.drive(link, record))
        if proc.wait(timeout=120) != 0:
            raise SystemExit(f"the original run failed: see {trace.with_suffix('.log')}")


def fresh_work(work: Path, source: Path) -> tuple[Path, Path]:
    """An empty work folder (its absolute path) with a copy of ``source`` in it as it was built
    (no calibration, run or bandit state of earlier runs); refused where no link can be emulated."""
    reason = unavailable_reason()
    if reason is not None:
        raise SystemExit(f"cannot emulate a link here: {reason}")
    work = work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    bundle = work / "bundle"
    shutil.copytree(source, bundle, ignore=shutil.ignore_patterns("calibration.json", "last-run.json", "bandit.json"))
    return work, bundle


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, default=Path("build/test-bundle"))
    parser.add_argument("--photos", type=Path, default=Path("build/photos"))
    parser.add_argument("--work", type=Path, default=Path("build/bench/replay_fidelity"))
    parser.add_argument("--schedule", default="auto", help="RATE_MBIT:SECONDS,... or auto (default auto)")
    parser.add_argument("--step-s", type=float, default=5.0, help="seconds per step of the auto schedule (default 5)")
    parser.add_argument("--sweeps", type=int, default=2,
                        help="times the auto schedule goes back up the table's cells and down again (default 2)")
    parser.add_argument("--fps", type=float, default=10.0, help="the video's frame rate (default 10)")
    parser.add_argument("--board-cpu", type=float, default=0.25, help="the board's CPU, in cores (default 0.25)")
    parser.add_argument("--nice", type=int, default=-10,
                        help="the board's and the host's nice value (default -10: ahead of other programs' work)")
    parser.add_argument("--out", type=Path, default=Path("build/bench/replay_fidelity.json"))
    parser.add_argument("--report", type=Path, help="also write split-device report of the two runs here")
    parser.add_argument("--board-times", choices=(RECORDED, MEASURED), default=RECORDED,
                        help="the replay's board decides with the original's head times or its own (default recorded)")
    parser.add_argument("--board-speed", choices=(RECORDED, OWN), default=RECORDED,
                        help="the replay's board runs at the original board's speed or its own (default recorded)")
    parser.add_argument("--replay-board-cpu", type=float, default=0.3,
                        help="the replay's board's CPU, in cores (default 0.3: a little faster than the original's, "
                        "to be held to its times)")
    args = parser.parse_args()
    load_at_start = os.getloadavg()  # a busy machine slows the board and the host: the figures say how busy
    work, bundle = fresh_work(args.work, args.bundle)
    original = work / "original.jsonl"
    if PINNED:
        os.sched_setaffinity(0, {HOST_CPU})  # the hosts (started from here) inherit it
    nice = _prioritized(args.nice)  # the hosts and the board inherit it
    with _slowed(args.board_cpu):
        # The host's own budget for a profile is too small for a quarter-core board's calibration.
        # ... and a host without a key passes a chain's second stage on only to a --peer: itself here.
        with EmulatedLink() as link, serve_in(link, [bundle], PORT, ["--profile-budget-ms", "2000", *own_peer(link, PORT)]):
            host = f"{link.namespace_address}:{PORT}"
            calibrate(bundle, host, link, args.fps)
            calibration = load(bundle / "calibration.json")
            schedule = (auto_schedule(calibration, args.step_s, args.sweeps) if args.schedule == "auto"
                        else RateSchedule.parse(args.schedule))
            video = make_video(args.photos, work / "clip.mp4", args.fps, schedule.duration_s + 2.0)
            print(f"table at batch 1: {[(round(r / 1e6, 2), a, b) for r, a, b in calibration.table.boundaries(1)]}")
            print(f"schedule: {', '.join(f'{s.rate_mbit:g} Mbit/s for {s.duration_s:g} s' for s in schedule.steps)}")
            original_run(bundle, host, link, schedule, video, original)
    with _slowed(args.replay_board_cpu):
        record = replay(original, bundle, work / "replay", policy="auto", launch=device, times=args.board_times,
                        speed=args.board_speed)
    held = [line.strip() for line in (work / "replay" / BOARD_LOG).read_text().splitlines()
            if "held to the times of" in line]
    first, again = load_trace(original), load_trace(work / "replay" / TRACE_FILE)
    figures = agreement(first.frames, again.frames)
    met = (figures["split_agreement"] is not None and figures["split_agreement"] >= TARGET_AGREEMENT
           and figures["p50_ratio"] is not None and abs(figures["p50_ratio"] - 1) <= TARGET_P50)
    result = {
        "benchmark": "replay_fidelity", "machine": platform.machine(), "python": platform.python_version(),
        "board_cpu": args.board_cpu if PINNED else None,
        "replay_board_cpu": args.replay_board_cpu if PINNED else None, "nice": nice, "fps": args.fps,
        "load_average": {"start": load_at_start, "end": os.getloadavg()},
        "schedule": [[s.rate_mbit, s.duration_s] for s in schedule.steps], "replay": record,
        "switches": {"original": _switches(first.frames), "replay": _switches(again.frames)},
        "stages": {"original": _stages(first.frames), "replay": _stages(again.frames)},
        "agreement": figures, "target_met": met, "held": held[-1] if held else None,
    }
    print(f"the replay's board decided with {record['board_times']} head times: {record['board_times_why']}")
    print(f"the replay's board ran at {record['board_speed']} speed: {record['board_speed_why']}"
          + (f"; {held[-1]}" if held else ""))
    print(f"original: {figures['reference_answered']} answered, p50 {figures['reference_p50_ms']:.1f} ms, "
          f"{result['switches']['original']} switches; replay: p50 {figures['p50_ms']:.1f} ms, "
          f"{result['switches']['replay']} switches")
    for split in sorted(set(result["stages"]["original"]) | set(result["stages"]["replay"])):
        print(f"  {split}: " + "; ".join(
            f"{run} " + (", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                                   for k, v in result["stages"][run][split].items())
                         if split in result["stages"][run] else "none")
            for run in ("original", "replay")))
    print(f"same split on {figures['split_agreement']:.1%} of the original's answered frames "
          f"({figures['split_agreement_answered']:.1%} of those both answered); p50 ratio {figures['p50_ratio']:.3f}; "
          f"target (≥ 90 %, within 10 %) {'met' if met else 'NOT met'}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")
    if args.report:
        write_comparison([original, work / "replay" / TRACE_FILE], args.report, labels=["original", "replay"])
        print(f"wrote {args.report}")


def _slowed(share: float):
    """The board's CPU left at ``share`` of a core while inside (where the bench has two CPUs to pin to)."""
    return slowed_cpu(BOARD_CPU, share) if PINNED and share < 1 else nullcontext(None)


def _prioritized(nice: int) -> int:
    """This process (and what it starts) at ``nice``; the nice value it got."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except PermissionError:
        print(f"cannot set nice {nice} (not root): the board and the host share their CPUs with other work",
              file=sys.stderr)
    return os.getpriority(os.PRIO_PROCESS, 0)


def _stages(frames: list[dict]) -> dict[str, dict[str, float]]:
    """Per split of the answered frames: how many, and the p50 of the total and of each stage (ms):
    where a difference in the p50 latency comes from (the board's head, the link, the host's tail)."""
    answered: dict[str, list[dict]] = {}
    for f in frames:
        if not f.get("dropped"):
            answered.setdefault(f["split"], []).append(f)
    return {split: {"frames": len(fs), **{f"{key}_p50": statistics.median(f[key] or 0.0 for f in fs)
                                          for key in ("total_ms", "head_ms", "transfer_ms", "tail_ms", "queue_ms")}}
            for split, fs in answered.items()}


def _switches(frames: list[dict]) -> int:
    answered = [f for f in sorted(frames, key=lambda f: f["index"]) if not f.get("dropped")]
    return sum(a["split"] != b["split"] for a, b in zip(answered, answered[1:]))


if __name__ == "__main__":
    main()
