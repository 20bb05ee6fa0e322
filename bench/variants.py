"""Head variants for the board: float32 / int8 × ONNX / TFLite, against the float32 ONNX head.

For MobileNetV2 (real ImageNet weights) at each compressive bottleneck: every variant's
head latency at batch 1 on this machine (median of ``--repeats`` rounds after warm-up, the
variants timed round-robin within each round, each run by the board's own backend,
``device_runtime.engine._backend.load_backend``) and file size, as ratios to
the float32 ONNX head of the same split measured in the same run; and the bytes the cut
tensor puts on the link as float32 and as uint8.

int8 heads are calibrated on 64 random crops and flips of the scikit-image photos (the only
real photos offline), preprocessed as the board does. Latency does not depend on how good
the calibration is; accuracy does, and is measured in the tests, not here.

    python bench/variants.py --weights mobilenet_v2-b0353104.pth --out build/bench/variants.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import skimage.data
import torch
from tqdm import tqdm

from device_runtime.engine._backend import load_backend
from device_runtime.engine._preprocess import preprocess
from exporter._build import BuildSpec, build_bundle
from exporter._graph import split_at, trace
from exporter._models import load_model
from exporter._quantize import quantize_onnx
from exporter._tflite_export import export_tflite
from splitedge.errors import SplitEdgeError

PHOTOS = ("coffee", "chelsea", "astronaut", "rocket")


def calibration_images(spec, n: int, seed: int = 0) -> np.ndarray:
    """Random crops (60-100% of each side) and flips of the photos, preprocessed for the model."""
    rng = np.random.default_rng(seed)
    photos = [getattr(skimage.data, name)() for name in PHOTOS]
    out = []
    for i in range(n):
        image = photos[i % len(photos)]
        h, w = image.shape[:2]
        ch, cw = int(h * rng.uniform(0.6, 1.0)), int(w * rng.uniform(0.6, 1.0))
        top, left = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
        crop = image[top : top + ch, left : left + cw]
        out.append(preprocess(crop[:, ::-1] if rng.random() < 0.5 else crop, spec))
    return np.concatenate(out)


def latencies_ms(backends: dict, x: np.ndarray, repeats: int) -> dict:
    """Median ms of each backend, timed round-robin (one run of each per round) so that load
    and clock drift during the run hit every variant alike."""
    for backend in backends.values():
        for _ in range(10):
            backend.run(x)
    times: dict = {key: [] for key in backends}
    for _ in range(repeats):
        for key, backend in backends.items():
            start = time.perf_counter()
            backend.run(x)
            times[key].append(time.perf_counter() - start)
    return {key: statistics.median(t) * 1000.0 for key, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", required=True, help="MobileNetV2 ImageNet state dict")
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--out", type=Path, default=Path("build/bench/variants.json"))
    args = parser.parse_args()

    loaded = load_model("torchvision:mobilenet_v2", args.weights)
    traced = trace(loaded.module, loaded.input_shape)
    samples = calibration_images(loaded.preprocess, 64)
    x = samples[:1]
    rows, failures = [], []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        manifest = build_bundle(BuildSpec("torchvision:mobilenet_v2", weights=args.weights, splits="auto"), root, progress=False)
        for split in tqdm(manifest.splits, desc="variants", unit="split"):
            head, _ = split_at(traced, split.id)
            paths = {("onnx", "float32"): root / f"head/{split.id}.onnx"}
            paths[("onnx", "int8")] = root / f"head/{split.id}.int8.onnx"
            quantize_onnx(paths[("onnx", "float32")], paths[("onnx", "int8")], samples)
            for precision in ("float32", "int8"):
                path = root / f"head/{split.id}.{precision}.tflite"
                export_tflite(head, "head", torch.from_numpy(samples[:2]), path, precision=precision,
                              calibration=samples if precision == "int8" else None)
                paths[("tflite", precision)] = path
            backends = {}
            for (fmt, precision), path in paths.items():
                try:
                    backends[fmt, precision] = load_backend(path, fmt=fmt)
                except SplitEdgeError as exc:  # a variant the runtime cannot run is a finding, not a crash
                    failures.append({"split": split.id, "format": fmt, "precision": precision, "error": str(exc)})
            measured = latencies_ms(backends, x, args.repeats)
            base_ms = measured["onnx", "float32"]
            base_bytes = paths[("onnx", "float32")].stat().st_size
            for (fmt, precision), ms in measured.items():
                path = paths[fmt, precision]
                rows.append({
                    "split": split.id, "format": fmt, "precision": precision,
                    "head_ms": ms, "latency_ratio": ms / base_ms,
                    "file_bytes": path.stat().st_size, "size_ratio": path.stat().st_size / base_bytes,
                    "wire_bytes_float32": split.tensor.bytes_per_sample,
                    "wire_bytes_uint8": split.tensor.bytes_per_sample // 4,
                })

    print(f"{'split':22s} {'variant':15s} {'head ms':>8s} {'× f32 onnx':>10s} {'file KB':>9s} {'× size':>7s} "
          f"{'wire f32 B':>10s} {'wire u8 B':>9s}")
    for r in rows:
        print(f"{r['split']:22s} {r['format'] + ' ' + r['precision']:15s} {r['head_ms']:8.2f} {r['latency_ratio']:10.2f} "
              f"{r['file_bytes'] / 1024:9.0f} {r['size_ratio']:7.2f} {r['wire_bytes_float32']:10d} {r['wire_bytes_uint8']:9d}")
    for f in failures:
        print(f"{f['split']:22s} {f['format'] + ' ' + f['precision']:15s} FAILED: {f['error'][-160:]}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "variants", "machine": platform.machine(), "python": platform.python_version(),
        "repeats": args.repeats, "rows": rows, "failures": failures,
    }, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
