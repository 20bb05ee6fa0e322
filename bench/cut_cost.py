"""Cost of cutting: does head + tail take as long as the full model, split by split?

A cut should only move work, not add it. For MobileNetV2, this times each split's ONNX
head and tail in onnxruntime against the full ONNX model, in the same process, batch 1,
interleaved round by round (so that clock and cache drift hit every model alike), and
reports medians after a warm-up. Splits: the compressive bottlenecks (``auto``, DSC
Eq. 3) plus a few others. The artifacts are built and validated by ``build_bundle``,
so what is timed is exactly what a bundle ships.

    python bench/cut_cost.py --out cut_cost.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from exporter._build import BuildSpec, build_bundle
from exporter._graph import find_cut_points, trace
from exporter._models import load_model
from exporter._validate import OnnxRunner

MODEL = "torchvision:mobilenet_v2"
#: Non-compressive cuts for contrast: after the stem, a residual sum, inside the last
#: inverted residual, after the last 1x1 convolution.
EXTRA_SPLITS = ("features_0_2", "features_6_add", "features_17_conv_1_2", "features_18_2")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="JSON file for the results")
    parser.add_argument("--weights", help="state dict for the model (timing does not depend on it)")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args(argv)

    loaded = load_model(MODEL, args.weights)
    cuts = find_cut_points(trace(loaded.module, loaded.input_shape))
    splits = [c.id for c in cuts if c.compressive or c.id in EXTRA_SPLITS]
    x = np.random.default_rng(0).standard_normal((1, *loaded.input_shape), dtype=np.float32)

    with tempfile.TemporaryDirectory() as root:
        manifest = build_bundle(BuildSpec(MODEL, weights=args.weights, splits=splits), root, progress=False)
        full = OnnxRunner(Path(root) / manifest.full[0].path)
        # Each timed call: (name, runner, feeds); a tail is fed its own head's real output.
        calls = [("full", full, {"input": x})]
        for split in manifest.splits:
            head, tail = (OnnxRunner(Path(root) / a.path) for a in split.artifacts)
            calls.append((f"{split.id}/head", head, {"input": x}))
            calls.append((f"{split.id}/tail", tail, head({"input": x})))
        medians = _time(calls, args.warmup, args.repeats)

    rows = []
    for split in manifest.splits:
        head_ms, tail_ms = medians[f"{split.id}/head"], medians[f"{split.id}/tail"]
        rows.append(
            {
                "split": split.id,
                "compressive": split.compressive,
                "cut_bytes": split.tensor.bytes_per_sample,
                "head_ms": head_ms,
                "tail_ms": tail_ms,
                "sum_ms": head_ms + tail_ms,
                "full_ms": medians["full"],
                "ratio": (head_ms + tail_ms) / medians["full"],
            }
        )
    print(_table(rows))
    args.out.write_text(
        json.dumps(
            {
                "model": MODEL,
                "command": " ".join(["python", "bench/cut_cost.py", *(argv if argv is not None else sys.argv[1:])]),
                "batch": 1,
                "warmup": args.warmup,
                "repeats": args.repeats,
                "onnxruntime": ort.__version__,
                "machine": f"{platform.machine()}, {platform.processor() or 'unknown cpu'}, python {platform.python_version()}",
                "rows": rows,
            },
            indent=2,
        )
        + "\n"
    )
    return 0


def _time(calls: list, warmup: int, repeats: int) -> dict[str, float]:
    """Median milliseconds per call, measured round-robin over all calls."""
    samples: dict[str, list[float]] = {name: [] for name, _, _ in calls}
    for round_ in range(warmup + repeats):
        for name, runner, feeds in calls:
            start = time.perf_counter()
            runner(feeds)
            if round_ >= warmup:
                samples[name].append((time.perf_counter() - start) * 1000)
    return {name: statistics.median(values) for name, values in samples.items()}


def _table(rows: list[dict]) -> str:
    lines = [f"{'split':<22} {'C':1} {'cut bytes':>10} {'head ms':>8} {'tail ms':>8} {'sum ms':>8} {'full ms':>8} {'ratio':>6}"]
    for r in rows:
        lines.append(
            f"{r['split']:<22} {'C' if r['compressive'] else ' '} {r['cut_bytes']:>10,} {r['head_ms']:>8.2f} "
            f"{r['tail_ms']:>8.2f} {r['sum_ms']:>8.2f} {r['full_ms']:>8.2f} {r['ratio']:>6.2f}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
