"""CUI cost: every cut point in one pass, against one plain pass and against one pass per cut point.

For VGG16 and MobileNetV2 at 224x224 (random weights, seed 0; the cost does not depend on
the weight values), on the same images in the same run:

- one pass: ``exporter._cui.CuiProbe`` on a batch (one forward, one backward, Grad-CAM at
  every cut point);
- plain, weights: one forward and ``backward()`` of the same target scores with the
  parameters trainable (what a training step's backward costs);
- plain, input: the same with frozen parameters and the gradient taken to the input only
  (the least backward work any gradient method needs) — the stricter baseline;
- naive: one forward + backward per cut point, the gradient taken at that cut point only
  (what computing Grad-CAM layer by layer costs).

Target (issue 3): one pass at most 1.5x the plain pass.

    python bench/cui_cost.py --out build/bench/cui_cost.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from tqdm import tqdm

from exporter._cui import CuiProbe, probe_module
from exporter._graph import find_cut_points, trace
from exporter._models import load_model


def median_time(fn: Callable[[], object], repeats: int) -> float:
    for _ in range(2):  # warm-up: oneDNN primitives per shape, first-touch of activation memory
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def plain_pass(module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, train_weights: bool) -> None:
    for p in module.parameters():
        p.requires_grad_(train_weights)
    inputs = x.clone().requires_grad_(not train_weights)
    logits = module(inputs)
    score = logits.gather(1, y[:, None]).sum()
    if train_weights:
        score.backward()
        module.zero_grad(set_to_none=True)
    else:
        torch.autograd.grad(score, inputs)


def naive_passes(traced, cuts, x: torch.Tensor, y: torch.Tensor) -> float:
    """Seconds for one pass per cut point; building each probe is not timed, only its pass."""
    total = 0.0
    for cut in tqdm(cuts, desc="naive", unit="cut", leave=False):
        probe = probe_module(traced, [cut.id])
        inputs = x.clone().requires_grad_(True)
        start = time.perf_counter()
        logits, (feature,) = probe(inputs)
        torch.autograd.grad(logits.gather(1, y[:, None]).sum(), feature)
        total += time.perf_counter() - start
        del probe
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="vgg16,mobilenet_v2")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("build/bench/cui_cost.json"))
    args = parser.parse_args()

    rows = []
    for name in args.models.split(","):
        torch.manual_seed(0)
        loaded = load_model(f"torchvision:{name}")
        traced = trace(loaded.module, loaded.input_shape)
        cuts = find_cut_points(traced)
        rng = np.random.default_rng(0)
        x_np = rng.standard_normal((args.batch, *traced.input_shape), dtype=np.float32)
        y_np = rng.integers(0, 1000, args.batch)
        x, y = torch.from_numpy(x_np), torch.from_numpy(y_np)
        probe = CuiProbe(traced, cuts)  # built once, as an analysis does; its passes are what is timed
        one = median_time(lambda: probe(x.clone(), y), args.repeats)
        weights = median_time(lambda: plain_pass(loaded.module, x, y, True), args.repeats)
        inputs = median_time(lambda: plain_pass(loaded.module, x, y, False), args.repeats)
        naive = naive_passes(traced, cuts, x, y)
        rows.append({
            "model": name, "cut_points": len(cuts), "batch": args.batch,
            "one_pass_s": one, "plain_weights_s": weights, "plain_input_s": inputs, "naive_s": naive,
            "one_pass_vs_plain_weights": one / weights, "one_pass_vs_plain_input": one / inputs,
            "naive_vs_one_pass": naive / one,
        })

    print(f"{'model':14s} {'cuts':>5s} {'one pass s':>11s} {'plain(w) s':>11s} {'plain(x) s':>11s} {'naive s':>9s} "
          f"{'1p/plain(w)':>12s} {'1p/plain(x)':>12s} {'naive/1p':>9s}")
    for r in rows:
        print(f"{r['model']:14s} {r['cut_points']:5d} {r['one_pass_s']:11.3f} {r['plain_weights_s']:11.3f} "
              f"{r['plain_input_s']:11.3f} {r['naive_s']:9.2f} {r['one_pass_vs_plain_weights']:12.2f} "
              f"{r['one_pass_vs_plain_input']:12.2f} {r['naive_vs_one_pass']:9.1f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "cui_cost", "machine": platform.machine(), "torch": torch.__version__,
        "threads": torch.get_num_threads(), "rows": rows,
    }, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
