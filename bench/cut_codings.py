"""Fewer bytes for the same answer (issue 47): k-bit cut codings against today's uint8 cut.

For MobileNetV2 with its real ImageNet weights at each compressive cut of a bundle built as
``split-export build`` builds it: the codings of 8, 6, 4, 3 and 2 bits a value (per-channel
affine, ``device_runtime.wire.coding``) and today's per-tensor uint8, each calibrated on the
same 64 crops of the scikit-image photos the build calibrates on, then measured on held-out
images never calibrated on (``--images``: crops of other scikit-image photos, of Debian's
gnome-backgrounds, or frames of OpenCV's street video):

- agreement: top-1 of head → coding → tail equal to the float32 full model's, per image;
- bytes a frame crosses in: packed, and packed then compressed by zlib (level 1; the standard
  library, on every board) and zstd (level 3, where ``zstandard`` is installed);
- the smallest of those at agreement >= ``--min-agreement`` (0.97) against uint8's bytes;
- time, one thread, batch 1, medians of ``--repeats`` rounds run round robin: the board's
  encoding (and compressing) against its head, the host's decompressing and decoding against
  its tail, as ratios measured in the same run.

    python bench/cut_codings.py --weights mobilenet_v2-b0353104.pth --images skimage \
        --out build/bench/cut_codings-skimage.json

writes the JSON and a PNG (bytes a frame against agreement, one line per cut) beside it.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Callable, Iterator

import cv2
import matplotlib
import numpy as np
import skimage.data

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from tqdm import tqdm  # noqa: E402

from device_runtime.bundle import CUT_BITS, HEAD, LOCAL, FULL, TAIL, Bundle  # noqa: E402
from device_runtime.engine import OnnxBackend, preprocess  # noqa: E402
from device_runtime.wire import affine_params, dequantize, quantize  # noqa: E402
from device_runtime.wire.coding import CutCoding  # noqa: E402
from exporter import BuildSpec, build_bundle  # noqa: E402

try:
    import zstandard
except ImportError:  # measured where installed
    zstandard = None

sys.path.insert(0, str(Path(__file__).parent))
from variants import calibration_images  # noqa: E402  (the build's own calibration crops)

#: Colour photos of scikit-image that are not the calibration ones, and grey ones as three channels.
HELD_OUT_PHOTOS = ("hubble_deep_field", "immunohistochemistry", "retina", "stereo_motorcycle", "camera", "coins",
                   "grass", "gravel", "moon", "brick", "cell")
BACKGROUNDS = Path("/usr/share/backgrounds/gnome")
VIDEO = Path("/usr/share/doc/opencv-doc/examples/data/vtest.avi")
BATCH = 25


def _photos(kind: str) -> list[np.ndarray]:
    """RGB pictures to crop the held-out images from."""
    if kind == "skimage":
        out = []
        for name in HELD_OUT_PHOTOS:
            image = getattr(skimage.data, name)()
            for one in image[:2] if isinstance(image, tuple) else (image,):  # a stereo pair's two views
                out.append(np.repeat(one[..., None], 3, axis=2) if one.ndim == 2 else one[..., :3])
        return out
    if kind == "backgrounds":
        paths = sorted(p for p in BACKGROUNDS.glob("*.webp"))
        if not paths:
            raise SystemExit(f"no pictures under {BACKGROUNDS}: apt install gnome-backgrounds")
        return [cv2.cvtColor(cv2.imread(str(p)), cv2.COLOR_BGR2RGB) for p in paths]
    capture = cv2.VideoCapture(str(VIDEO))
    frames = []
    while len(frames) < 1000:
        ok, bgr = capture.read()
        if not ok:
            break
        frames.append(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
    capture.release()
    if not frames:
        raise SystemExit(f"cannot read {VIDEO}: apt install opencv-doc")
    return frames[::3]


def crops(kind: str, n: int, seed: int = 1) -> Iterator[np.ndarray]:
    """``n`` random RGB crops (30-100 % of each side, half of them mirrored) of ``kind``'s pictures."""
    rng = np.random.default_rng(seed)
    photos = _photos(kind)
    for _ in range(n):
        image = photos[rng.integers(len(photos))]
        h, w = image.shape[:2]
        ch, cw = int(h * rng.uniform(0.3, 1.0)), int(w * rng.uniform(0.3, 1.0))
        top, left = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
        crop = np.ascontiguousarray(image[top : top + ch, left : left + cw])
        yield np.ascontiguousarray(crop[:, ::-1]) if rng.random() < 0.5 else crop


def held_out(kind: str, n: int, spec, seed: int = 1) -> np.ndarray:
    """``n`` of :func:`crops`, preprocessed for the model."""
    return np.concatenate([preprocess(crop, spec) for crop in crops(kind, n, seed)])


def batched(run: Callable[[np.ndarray], np.ndarray], x: np.ndarray) -> np.ndarray:
    return np.concatenate([run(x[i : i + BATCH]) for i in range(0, len(x), BATCH)])


def median_ms(calls: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median ms of each call, timed round robin (one of each per round) after a warm-up round."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for round_ in range(repeats + 1):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            if round_:
                times[name].append((time.perf_counter() - start) * 1000.0)
    return {name: statistics.median(ms) for name, ms in times.items()}


def measure_cut(bundle: Bundle, split_id: str, calib: np.ndarray, test: np.ndarray, reference: np.ndarray,
                repeats: int) -> dict:
    head = OnnxBackend(bundle.artifact(split_id, HEAD), threads=1)
    tail = OnnxBackend(bundle.artifact(split_id, TAIL), threads=1)
    calib_cut, cut = batched(head.run, calib), batched(head.run, test)
    values = cut[0].size
    scale, zero = affine_params(float(calib_cut.min()), float(calib_cut.max()))
    rows = {"float32": {"bytes": values * 4, "agreement": float((batched(tail.run, cut).argmax(1) == reference).mean())}}
    rows["uint8"] = {"bytes": values, "agreement": float((batched(
        lambda c: tail.run(dequantize(quantize(c, scale, zero), scale, zero)), cut).argmax(1) == reference).mean())}
    one = cut[:1]
    calls: dict[str, Callable[[], object]] = {"head": lambda: head.run(test[:1]), "tail": lambda: tail.run(one)}
    for bits in CUT_BITS:
        coding = CutCoding.calibrate(calib_cut, bits)
        name = coding.name
        decoded = batched(lambda c: coding.decode(coding.encode(c), c.shape), cut)
        packed = [coding.encode(c[None]) for c in cut]
        row = {"bytes": len(packed[0]), "agreement": float((batched(tail.run, decoded).argmax(1) == reference).mean()),
               "zlib_bytes": float(np.mean([len(zlib.compress(p, 1)) for p in packed]))}
        bits_one = packed[0]
        calls[f"{name} encode"] = lambda coding=coding: coding.encode(one)
        calls[f"{name} decode"] = lambda coding=coding, b=bits_one: coding.decode(b, one.shape)
        calls[f"{name} zlib"] = lambda b=bits_one: zlib.compress(b, 1)
        compressed = zlib.compress(bits_one, 1)
        calls[f"{name} unzlib"] = lambda c=compressed: zlib.decompress(c)
        if zstandard is not None:
            packer, unpacker = zstandard.ZstdCompressor(level=3), zstandard.ZstdDecompressor()
            row["zstd_bytes"] = float(np.mean([len(packer.compress(p)) for p in packed]))
            calls[f"{name} zstd"] = lambda b=bits_one, z=packer: z.compress(b)
            calls[f"{name} unzstd"] = lambda c=packer.compress(bits_one), z=unpacker: z.decompress(c)
        rows[name] = row
    ms = median_ms(calls, repeats)
    for bits in CUT_BITS:
        row, name = rows[f"k{bits}"], f"k{bits}"
        row["encode_over_head"] = ms[f"{name} encode"] / ms["head"]
        row["decode_over_tail"] = ms[f"{name} decode"] / ms["tail"]
        row["encode_zlib_over_head"] = (ms[f"{name} encode"] + ms[f"{name} zlib"]) / ms["head"]
        row["decode_zlib_over_tail"] = (ms[f"{name} decode"] + ms[f"{name} unzlib"]) / ms["tail"]
        if zstandard is not None:
            row["encode_zstd_over_head"] = (ms[f"{name} encode"] + ms[f"{name} zstd"]) / ms["head"]
            row["decode_zstd_over_tail"] = (ms[f"{name} decode"] + ms[f"{name} unzstd"]) / ms["tail"]
    return {"values": values, "head_ms": ms["head"], "tail_ms": ms["tail"], "codings": rows}


def best(cut: dict, floor: float) -> dict:
    """The fewest bytes a frame at agreement >= floor: packed, or packed and compressed."""
    choices = []
    for name, row in cut["codings"].items():
        if row["agreement"] < floor:
            continue
        choices.append((row["bytes"], name))
        for coder in ("zlib", "zstd"):
            if f"{coder}_bytes" in row:
                choices.append((row[f"{coder}_bytes"], f"{name}+{coder}"))
    size, name = min(choices)
    return {"option": name, "bytes": size, "uint8_over_best": cut["codings"]["uint8"]["bytes"] / size}


def plot(results: dict, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for split_id, cut in results["cuts"].items():
        rows = cut["codings"]
        names = ["float32", "uint8", *(f"k{b}" for b in CUT_BITS)]
        ax.plot([rows[n]["bytes"] for n in names], [rows[n]["agreement"] for n in names], marker="o", label=split_id)
    ax.axhline(results["min_agreement"], color="grey", linestyle=":", label=f"floor {results['min_agreement']:g}")
    ax.set_xscale("log")
    ax.set_xlabel("bytes a frame crosses in (float32, uint8, k8 ... k2)")
    ax.set_ylabel(f"agreement with the float model ({results['images']} images)")
    ax.set_title(f"MobileNetV2 cut codings, held-out {results['image_set']} crops")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", required=True, help="MobileNetV2 ImageNet state dict")
    parser.add_argument("--images", choices=("skimage", "backgrounds", "video"), default="skimage",
                        help="the held-out pictures the codings are measured on (never calibrated on)")
    parser.add_argument("--count", type=int, default=500, help="held-out images (default 500)")
    parser.add_argument("--min-agreement", type=float, default=0.97)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--out", type=Path, default=Path("build/bench/cut_codings.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "bundle"
        manifest = build_bundle(BuildSpec("torchvision:mobilenet_v2", weights=args.weights, splits="auto"), root,
                                progress=False)
        bundle = Bundle.load(root)
        spec = manifest.model.preprocess
        calib = calibration_images(spec, 64)
        test = held_out(args.images, args.count, spec)
        reference = batched(OnnxBackend(bundle.artifact(LOCAL, FULL), threads=1).run, test).argmax(1)
        cuts = {}
        for split in tqdm([s for s in manifest.splits if s.compressive], desc="cuts", unit="cut"):
            cuts[split.id] = measure_cut(bundle, split.id, calib, test, reference, args.repeats)
            cuts[split.id]["best"] = best(cuts[split.id], args.min_agreement)
    results = {"machine": platform.machine(), "python": platform.python_version(), "image_set": args.images,
               "images": args.count, "min_agreement": args.min_agreement, "zstd": zstandard is not None, "cuts": cuts}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    plot(results, args.out.with_suffix(".png"))
    print(f"{'cut':22s} {'uint8 B':>8s} {'agr':>6s}  " + "  ".join(f"{f'k{b} B':>7s} {'agr':>6s}" for b in CUT_BITS)
          + f"  {'best':>14s} {'B':>8s} {'uint8/best':>10s} {'enc/head':>8s} {'dec/tail':>8s}")
    for split_id, cut in cuts.items():
        rows, chosen = cut["codings"], cut["best"]
        coding = chosen["option"].split("+")[0]
        enc = rows[coding].get("encode_over_head", 0.0) if coding.startswith("k") else 0.0
        dec = rows[coding].get("decode_over_tail", 0.0) if coding.startswith("k") else 0.0
        print(f"{split_id:22s} {rows['uint8']['bytes']:8d} {rows['uint8']['agreement']:6.3f}  "
              + "  ".join(f"{rows[f'k{b}']['bytes']:7d} {rows[f'k{b}']['agreement']:6.3f}" for b in CUT_BITS)
              + f"  {chosen['option']:>14s} {chosen['bytes']:8.0f} {chosen['uint8_over_best']:10.2f} {enc:8.3f} {dec:8.3f}")
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
