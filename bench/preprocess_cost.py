"""What preprocessing costs the board against MobileNetV2's local head (issue 29, target: at most 10 %).

In one run, on one CPU left at ``--share`` of its time (``bench/slow_board.py``: a real-time process
takes the rest of every millisecond; a quarter, as ``bench/dynamic_split.py`` gives the board):
the exact preprocessing (PIL's resize in numpy, :func:`device_runtime.engine._preprocess`) and the
fast one (OpenCV in uint8, :func:`device_runtime.engine._fast_preprocess`) of a 640×480 camera frame
(a scikit-image photo as the camera hands it over: an RGB view of BGR memory) for the bundle's 224
crop, and the bundle's full model, one thread, batch 1 (the "local head"). Each is timed
round-robin within every round, so the machine's load moves them alike; medians are reported, and
each preprocessing's ratio to the head.

    .venv-device/bin/python bench/preprocess_cost.py BUNDLE --out build/bench/preprocess_cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from slow_board import slowed_cpu  # noqa: E402

from device_runtime import FULL, LOCAL, Bundle  # noqa: E402
from device_runtime.engine import EXACT, FAST, DeviceRunner  # noqa: E402

BOARD_CPU = 1
FRAME = (640, 480)


def camera_frame(photo: Path) -> np.ndarray:
    """A 640×480 frame as the camera sources hand it over: RGB, a view of OpenCV's BGR memory."""
    return cv2.resize(cv2.imread(str(photo)), FRAME, interpolation=cv2.INTER_AREA)[..., ::-1]


def measure(bundle: Path, frame: np.ndarray, rounds: int) -> dict[str, list[float]]:
    """ms of each stage, one sample of each per round, round-robin."""
    loaded = Bundle.load(bundle, roles=(FULL,))
    exact, fast = DeviceRunner(loaded, threads=1, preprocess=EXACT), DeviceRunner(loaded, threads=1, preprocess=FAST)
    x = fast.preprocess(frame)
    stages = {"exact": lambda: exact.preprocess(frame), "fast": lambda: fast.preprocess(frame),
              "head": lambda: fast.run_full(x)}
    for run in stages.values():  # warm-up: sessions' lazy allocations, OpenCV's first call
        run()
    times: dict[str, list[float]] = {name: [] for name in stages}
    for _ in range(rounds):
        for name, run in stages.items():
            start = time.perf_counter()
            run()
            times[name].append((time.perf_counter() - start) * 1e3)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("bundle", type=Path, help="a MobileNetV2 bundle (split-export build)")
    parser.add_argument("--photo", type=Path, default=Path("build/photos/chelsea.png"))
    parser.add_argument("--share", type=float, default=0.25, help="the board's share of its CPU (1: all of it)")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--out", type=Path, default=Path("build/bench/preprocess_cost.json"))
    args = parser.parse_args()
    frame = camera_frame(args.photo)
    os.sched_setaffinity(0, {BOARD_CPU})
    cv2.setNumThreads(1)  # one CPU: OpenCV's worker threads would only wait for each other
    with slowed_cpu(BOARD_CPU, args.share) if args.share < 1 else nullcontext(None) as slowed:
        times = measure(args.bundle, frame, args.rounds)
    share = args.share if args.share >= 1 or slowed is not None else 1.0
    median = {name: statistics.median(values) for name, values in times.items()}
    result = {
        "machine": f"{platform.machine()}, {platform.processor() or platform.node()}", "cpu_share": share,
        "frame": list(FRAME), "crop": Bundle.load(args.bundle, roles=()).manifest.model.preprocess.crop,
        "rounds": args.rounds, "median_ms": median,
        "ratio_to_head": {name: median[name] / median["head"] for name in ("exact", "fast")},
        "samples_ms": times,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"640x480 frame -> 224 crop, MobileNetV2 full model, 1 thread, {share:g} of CPU {BOARD_CPU}, "
          f"median of {args.rounds} rounds")
    print(f"{'stage':<28}{'ms':>9}{'of the head':>14}")
    for name, what in (("exact", "preprocess, exact (numpy)"), ("fast", "preprocess, fast (OpenCV)"),
                       ("head", "local head (full model)")):
        print(f"{what:<28}{median[name]:>9.2f}{median[name] / median['head']:>13.1%}")
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
