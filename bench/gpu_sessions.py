"""One shape per session on a GPU (issue 32): what a change of shape costs a session, what each batch
size costs on a session of its own, which buckets cover ``--max-batch`` with little padding, the GPU
memory the sessions hold, and what ``--tf32`` costs.

All on the tail of ``--split`` as the host builds it (:class:`~host_runtime._tails.TailSession`, I/O
binding on CUDA, one caller thread, a cut of seeded noise):

- **shape changes**: one session fed batches of 8 and 16 in turn (both warmed first), as a host
  with ``--buckets off`` (cuDNN's heuristic search) or with one session for every bucket
  (exhaustive search) sees them, against a session per size fed the same turns; median ms per run.
- **per size**: a session for each of ``--sizes`` (up to ``--max-batch``), warmed, then ``--runs``
  runs each; the median ms (sizes between those measured: interpolated). From it, for a few bucket sets, the compute a batch of n costs once padded to its
  bucket against unpadded (n uniform over 1..max): mean and worst, and the sessions each set needs.
- **memory**: the GPU's free memory (``cudaMemGetInfo``) before and after the per-size sessions are
  made and warmed, per session.
- **tf32**: every tail of ``--bundle`` (not only ``--split``) on CUDA with and without TF32 against the
  CPU, 64 samples each, in batches of 8: cuts made by the head from seeded random images, and cuts of
  seeded noise (what the tests send); the largest absolute difference of each.

    python bench/gpu_sessions.py --bundle build/test-bundle --device cuda --out build/bench/gpu_sessions.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np

from device_runtime import FULL, HEAD, LOCAL, TAIL, Bundle
from device_runtime.engine._backend import OnnxBackend
from host_runtime._tails import TailRegistry, TailSession, bucket_for, cuda_memory, providers_for

SPLIT = "features_14_conv_2"
#: Bucket sets compared; ``max`` is replaced by --max-batch.
CANDIDATES = {
    "powers of 2": lambda m: sorted({1 << k for k in range(m.bit_length()) if 1 << k <= m} | {m}),
    "powers of 4": lambda m: sorted({4**k for k in range(m.bit_length()) if 4**k <= m} | {m}),
    "1, 8, max": lambda m: sorted({1, min(8, m), m}),
    "1, max": lambda m: sorted({1, m}),
    "max only": lambda m: [m],
    "steps of 1.5": lambda m: sorted({s for s in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128) if s <= m} | {m}),
    "1, 2, 4, then steps of 4": lambda m: sorted({s for s in (1, 2, 4) if s <= m} | set(range(8, m + 1, 4)) | {m}),
    "every size": lambda m: list(range(1, m + 1)),
}


def noise(shape: tuple[int, ...], batch: int, seed: int, dtype: str = "float32") -> np.ndarray:
    """Seeded noise of ``batch`` samples of ``shape``, as the tests make it: normal floats for a cut,
    random pixels (0..255) for an image (3 channels) or a uint8 input."""
    rng = np.random.default_rng(seed)
    if dtype == "uint8" or len(shape) == 3 and shape[0] == 3:
        return rng.integers(0, 256, (batch, *shape)).astype(dtype)
    return rng.standard_normal((batch, *shape), dtype=np.float32)


def timed(tail: TailSession, x: np.ndarray) -> float:
    start = time.perf_counter()
    tail.run(x)
    return (time.perf_counter() - start) * 1000.0


def shape_changes(path: Path, sample: tuple[int, ...], device: str, turns: int) -> dict[str, float]:
    """Median ms per run when one session sees batches of 8 and 16 in turn, against a session per size."""
    out = {}
    x8, x16 = noise(sample, 8, 1), noise(sample, 16, 2)
    for name, fixed, per_size in (("one session, heuristic search", False, False),
                                  ("one session, exhaustive search", True, False),
                                  ("a session per size", True, True)):
        tail = TailSession(path, None, providers_for(device, fixed_shapes=fixed), device == "cuda", (8, 16),
                           providers_for(device, fixed_shapes=True), per_bucket=per_size)
        for x in (x8, x16, x8, x16):  # warmed: each size seen, and a change of shape seen, before timing
            tail.run(x)
        times = [timed(tail, x) for _ in range(turns) for x in (x8, x16)]
        out[name] = statistics.median(times)
        print(f"  {name:32s}: {out[name]:8.2f} ms per run (median), max {max(times):8.2f}", flush=True)
    return out


def per_size(path: Path, sample: tuple[int, ...], device: str, sizes: list[int], runs: int) -> dict[str, Any]:
    """A session per batch size of ``sizes``: median ms per run of each, and the memory they hold."""
    before = cuda_memory() if device == "cuda" else None
    start = time.perf_counter()
    tail = TailSession(path, None, providers_for(device), device == "cuda", sizes,
                       providers_for(device, fixed_shapes=True), per_bucket=True)
    made_s = time.perf_counter() - start
    inputs = {size: noise(sample, size, size) for size in sizes}
    start = time.perf_counter()
    for size in sizes:
        tail.run(inputs[size])
    warm_s = time.perf_counter() - start
    after = cuda_memory() if device == "cuda" else None
    ms = {}
    for size in sizes:
        for _ in range(3):
            tail.run(inputs[size])
        ms[size] = statistics.median(timed(tail, inputs[size]) for _ in range(runs))
    held = None if before is None or after is None else before[0] - after[0]
    print(f"  {len(sizes)} sessions made in {made_s:.1f} s, warmed in {warm_s:.1f} s"
          + ("" if held is None else f", holding {held / 2**20:,.0f} MiB of GPU memory "
                                     f"({held / len(sizes) / 2**20:,.1f} MiB a session)"), flush=True)
    print("  ms per run: " + ", ".join(f"{s}: {ms[s]:.2f}" for s in sizes), flush=True)
    return {"ms": ms, "sessions_made_s": made_s, "warm_s": warm_s, "gpu_bytes_held": held,
            "gpu_bytes_per_session": None if held is None else held / len(sizes)}


def padding(measured: dict[int, float], max_batch: int) -> list[dict[str, Any]]:
    """For each candidate bucket set: a batch of n's compute padded to its bucket against unpadded."""
    known = sorted(measured)
    every = range(1, max_batch + 1)
    ms = dict(zip(every, np.interp(list(every), known, [measured[s] for s in known]).tolist()))
    rows = []
    for name, make in CANDIDATES.items():
        buckets = make(max_batch)
        ratios = [ms[bucket_for(n, buckets)] / ms[n] for n in range(1, max_batch + 1)]
        rows.append({"set": name, "buckets": buckets, "sessions": len(buckets),
                     "mean_cost": statistics.mean(ratios), "worst_cost": max(ratios),
                     "worst_at": 1 + ratios.index(max(ratios))})
    print(f"  {'bucket set':26s} {'buckets':32s} {'sessions':>8s} {'mean':>6s} {'worst':>6s}", flush=True)
    for r in rows:
        print(f"  {r['set']:26s} {','.join(map(str, r['buckets'])):32s} {r['sessions']:8d} "
              f"{r['mean_cost']:6.2f} {r['worst_cost']:6.2f} (at {r['worst_at']})", flush=True)
    return rows


def tf32_error(bundle: Bundle, samples: int) -> dict[str, dict[str, float]]:
    """Largest |CUDA - CPU| per tail, with and without TF32, on real cuts and on noise."""
    registries = {"tf32": TailRegistry([bundle], device="cuda", tf32=True),
                  "exact": TailRegistry([bundle], device="cuda", tf32=False)}
    cpu = TailRegistry([bundle], threads=None, device="cpu")
    rng = np.random.default_rng(0)
    model = bundle.manifest.model
    # Pixels as the head takes them: 0..255 where the normalisation is folded into it, else 0..1.
    images = rng.integers(0, 256, (samples, *model.input_shape)).astype(model.input_dtype)
    if not model.preprocess.folded:
        images = (images / 255).astype(model.input_dtype)
    out: dict[str, dict[str, float]] = {}
    for (bundle_id, split_id), reference in cpu.tails.items():
        shape = tuple(int(d) for d in reference.input_shape[1:])
        inputs = {"noise": noise(shape, samples, 7, reference.input_dtype)}
        if split_id == "offload":
            inputs["images"] = images
        elif "#" not in split_id and bundle.has(split_id, HEAD):  # a chain's stages have no head of their own
            head = OnnxBackend(bundle.artifact(split_id, HEAD))
            inputs["cuts"] = np.concatenate([head.run(images[i:i + 8]) for i in range(0, samples, 8)])
        for kind, x in inputs.items():
            expected = np.concatenate([reference.run(x[i:i + 8]) for i in range(0, samples, 8)])
            for name, registry in registries.items():
                tail = registry.tails[(bundle_id, split_id)]
                got = np.concatenate([tail.run(x[i:i + 8]) for i in range(0, samples, 8)])
                error = float(np.abs(got - expected).max())
                out.setdefault(split_id, {})[f"{name}/{kind}"] = error
        print(f"  {split_id:40s} " + "  ".join(f"{k} {v:.2e}" for k, v in out[split_id].items()), flush=True)
    return out


def gpu_name() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, default=Path("build/test-bundle"))
    parser.add_argument("--split", default=SPLIT)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--max-batch", type=int, default=32)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32],
                        help="batch sizes given a session each and timed (those above --max-batch are dropped)")
    parser.add_argument("--runs", type=int, default=30, help="timed runs per batch size")
    parser.add_argument("--turns", type=int, default=10, help="8-then-16 turns timed per session kind")
    parser.add_argument("--tf32-samples", type=int, default=64)
    parser.add_argument("--skip", nargs="*", default=[], choices=("shapes", "sizes", "tf32"))
    parser.add_argument("--out", type=Path, default=Path("build/bench/gpu_sessions.json"))
    args = parser.parse_args()
    import onnxruntime

    bundle = Bundle.load(args.bundle)
    path = bundle.artifact(args.split, TAIL) if args.split != "offload" else bundle.artifact(LOCAL, FULL)
    sample = tuple(int(d) for d in OnnxBackend(path).input_shape[1:])
    result: dict[str, Any] = {"benchmark": "gpu_sessions", "gpu": gpu_name(), "device": args.device,
                              "onnxruntime": onnxruntime.__version__, "python": platform.python_version(),
                              "split": args.split, "max_batch": args.max_batch}
    print(f"{result['gpu']}, onnxruntime {onnxruntime.__version__}, tail of {args.split} ({list(sample)})", flush=True)
    if "shapes" not in args.skip:
        print("shape changes (batches of 8 and 16 in turn):", flush=True)
        result["shape_changes_ms"] = shape_changes(path, sample, args.device, args.turns)
    if "sizes" not in args.skip:
        sizes = sorted({s for s in args.sizes if s <= args.max_batch} | {1, args.max_batch})
        print(f"a session per batch size ({','.join(map(str, sizes))}):", flush=True)
        result["per_size"] = per_size(path, sample, args.device, sizes, args.runs)
        print("padding to buckets (compute of a padded batch / unpadded, n uniform):", flush=True)
        result["bucket_sets"] = padding(result["per_size"]["ms"], args.max_batch)
    if "tf32" not in args.skip and args.device == "cuda":
        print(f"largest |CUDA - CPU| per tail, {args.tf32_samples} samples:", flush=True)
        result["tf32_error"] = errors = tf32_error(bundle, args.tf32_samples)
        result["tf32_error_max"] = max(v for e in errors.values() for k, v in e.items() if k.startswith("tf32/"))
        result["exact_error_max"] = max(v for e in errors.values() for k, v in e.items() if k.startswith("exact/"))
        print(f"  largest: TF32 {result['tf32_error_max']:.3e}, without {result['exact_error_max']:.3e}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
