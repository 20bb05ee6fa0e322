"""Fashion-MNIST: top-1 against bytes per image for every cut coding, with and without the
learned bottleneck (issue 47, point 5 and its Fashion-MNIST requirement).

For the suite's trained models (``exporter.zoo:fmnist_vgg``, ``fmnist_resnet``; weights from
``python -m exporter.zoo``), each bundle built as ``split-export build`` builds it, every coding
k in {8, 6, 4, 3, 2} calibrated on 64 images of Fashion-MNIST's *training* split and measured on
its 10,000 *test* images with their real labels, through the exported ONNX files and the wire's
own coding (``exporter._codings``):

- (a) **plain**: the network's own cuts (``--plain``), float32, today's per-tensor uint8 and k bits;
- (b) **ae**: I-SPLIT's autoencoder at ``--ae`` cuts (latent 10%), trained as ``--bottleneck ae``
  trains it, its latent coded in k bits after training;
- (c) **ae+rate@K**: the same autoencoder, same seed and images, trained with the learned rate
  term (``--bottleneck-bits K``: its end-to-end phase through the K-bit coding, distilled from
  the uncut model; ``exporter._rate``), one training per K of ``--trained-bits``;
- the ablation **ae+kd**: distilled as (c) is, the latent left float in training: what of (c)'s
  gain is distillation's, and what is the coding's.

The autoencoders train on ``--train-images`` training images (default 5,000 of 60,000) for the
recipe's 2 + 2 epochs: small, so a model takes minutes on one core (fmnist_vgg about 5, fmnist_resnet
at ``--train-images 2500`` about 6); more images and epochs would move every AE figure up, (b) and
(c) alike. One seed: between two runs differing only in their thread count (float sums in another
order), the plain autoencoder's k2 at one cut moved by 3.6 points, so a difference of a point or two
between families is within that noise. Every figure is a comparison within the run: the
smallest bytes per image at <= ``--max-loss`` (1 point) top-1 below the float32 model, in each
family, against today's uint8 cut (the smallest uint8 cut at the same floor). Each coded latent's
empirical entropy (bits a value, per-channel histograms of the codes the wire sends, on the test
images) says what an entropy coder could still take off (not yet on the wire).

    python bench/fmnist_codings.py --out build/bench/fmnist_codings.json
    python bench/fmnist_codings.py --models resnet --train-images 2500 --out build/bench/fmnist_codings-resnet.json

writes the JSON and a PNG beside it (top-1 against bytes per image, log scale, one line per
split and family, one panel per model).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from device_runtime.bundle import CUT_BITS, FLOAT32, HEAD, ONNX, Bundle  # noqa: E402
from device_runtime.engine import OnnxBackend  # noqa: E402
from device_runtime.wire.coding import CutCoding, unpack_bits  # noqa: E402
from exporter import BuildSpec, build_bundle  # noqa: E402
from exporter._bottleneck import BottleneckOptions  # noqa: E402
from exporter._codings import read_curve  # noqa: E402
from exporter._datasets import load_images  # noqa: E402

TRAIN, TEST = "fashion-mnist:train", "fashion-mnist:test"
SHAPE = (1, 28, 28)
#: model: (factory, default weights, plain cuts, autoencoder cuts)
MODELS = {
    "vgg": ("exporter.zoo:fmnist_vgg", "build/fmnist-vgg.pt", "_6,_13,_17,_19", "_13,_17"),
    "resnet": ("exporter.zoo:fmnist_resnet", "build/fmnist-resnet.pt", "_6_relu,_8", "_6_relu"),
}


@dataclass(frozen=True)
class Row:
    model: str
    family: str  # plain, ae, ae+rate@K
    split: str
    coding: str  # float32, uint8, k8 .. k2
    bits: int
    bytes_per_image: int
    top1: float
    entropy_bits: float | None  # per value, of the codes sent (k-bit codings only)


def entropy_bits(bundle: Path, split_id: str, test: np.ndarray) -> dict[str, float]:
    """Per coding of ``split_id``: the mean over channels of the empirical entropy (bits) of its
    codes on ``test``, as the wire's encode gives them."""
    b = Bundle.load(bundle)
    split = next(s for s in b.manifest.splits if s.id == split_id)
    head = next(a for a in split.artifacts if a.role == HEAD and a.format == ONNX and a.precision == FLOAT32)
    cut = np.concatenate([OnnxBackend(b.root / head.path).run(test[i : i + 1000]) for i in range(0, len(test), 1000)])
    out = {}
    for spec in split.codings:
        coding = CutCoding.of(spec)
        q = unpack_bits(coding.encode(cut), cut.size, coding.bits).reshape(cut.shape)
        per_channel = np.moveaxis(q, 1, 0).reshape(q.shape[1], -1)
        h = []
        for row in per_channel:
            p = np.bincount(row, minlength=1 << coding.bits) / row.size
            p = p[p > 0]
            h.append(float(-(p * np.log2(p)).sum()))
        out[spec.name] = float(np.mean(h))
    return out


def measure(model: str, family: str, spec: BuildSpec, root: Path, test: np.ndarray) -> tuple[list[Row], float]:
    out = root / f"{model}-{family}"
    start = time.perf_counter()
    manifest = build_bundle(spec, out, progress=False)
    seconds = time.perf_counter() - start
    curve = read_curve(out)
    assert curve is not None and curve.metric == "top1", curve
    rows = []
    for split in curve.splits:
        entropy = entropy_bits(out, split.split, test)
        for p in split.points:
            rows.append(Row(model, family, split.split, p.coding, p.bits, p.bytes_per_sample, p.accuracy,
                            entropy.get(p.coding)))
    print(f"  {model} {family}: built and measured in {seconds:.0f} s", file=sys.stderr, flush=True)
    assert manifest.model.accuracy is not None
    return rows, manifest.model.accuracy


def smallest(rows: list[Row], floor: float, codings: tuple[str, ...]) -> Row | None:
    fit = [r for r in rows if r.coding in codings and r.top1 >= floor]
    return min(fit, key=lambda r: (r.bytes_per_image, -r.top1)) if fit else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="vgg", help="some of vgg,resnet (default vgg: one model a run keeps it "
                        "to minutes)")
    parser.add_argument("--vgg-weights", default=MODELS["vgg"][1])
    parser.add_argument("--resnet-weights", default=MODELS["resnet"][1])
    parser.add_argument("--train-images", type=int, default=5000, help="autoencoder training images (default 5,000)")
    parser.add_argument("--trained-bits", default="4,2", help="K of the learned rate term, one training each")
    parser.add_argument("--max-loss", type=float, default=0.01, help="top-1 lost against float32 (default 0.01)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("build/bench/fmnist_codings.json"))
    args = parser.parse_args()
    trained_bits = [int(k) for k in args.trained_bits.split(",")]
    test = load_images(TEST, SHAPE).x
    rows: list[Row] = []
    full: dict[str, float] = {}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            factory, _, plain_cuts, ae_cuts = MODELS[model]
            weights = getattr(args, f"{model}_weights")
            common = dict(weights=weights, input_shape=SHAPE, seed=args.seed, cut_bits=CUT_BITS, calib_data=TRAIN,
                          calibration_samples=64)
            plain = BuildSpec(factory, splits=plain_cuts.split(","), test_data=TEST, **common)
            got, full[model] = measure(model, "plain", plain, Path(tmp), test)
            rows += got
            for family, bits in [("ae", None), ("ae+kd", None), *((f"ae+rate@{k}", k) for k in trained_bits)]:
                options = BottleneckOptions(train_data=TRAIN, test_data=TEST, train_images=args.train_images, bits=bits,
                                            distill=family == "ae+kd")
                got, _ = measure(model, family, BuildSpec(factory, splits=ae_cuts.split(","), bottleneck=options,
                                                          **common), Path(tmp), test)
                rows += got
    seconds = time.perf_counter() - start

    summary = {}
    print(f"{'model':7} {'family':10} {'split':9} {'coding':7} {'B/image':>8} {'top-1':>7} {'Δ float':>8} "
          f"{'H bits':>6}")
    for r in rows:
        h = "" if r.entropy_bits is None else f"{r.entropy_bits:.2f}"
        print(f"{r.model:7} {r.family:10} {r.split:9} {r.coding:7} {r.bytes_per_image:8,} {r.top1:7.4f} "
              f"{100 * (r.top1 - full[r.model]):+7.2f}p {h:>6}")
    print()
    for model, reference in full.items():
        floor = reference - args.max_loss
        mine = [r for r in rows if r.model == model]
        uint8 = smallest([r for r in mine if r.family == "plain"], floor, ("uint8",))
        line = {"float32_top1": reference, "floor": floor,
                "uint8": None if uint8 is None else {"split": uint8.split, "bytes": uint8.bytes_per_image,
                                                     "top1": uint8.top1}}
        print(f"{model}: float32 top-1 {reference:.4f}; at <= {100 * args.max_loss:.0f} point lost, today's uint8 cut: "
              + ("none" if uint8 is None else f"{uint8.split} {uint8.bytes_per_image:,} B ({uint8.top1:.4f})"))
        codings = tuple(f"k{k}" for k in CUT_BITS)
        for family in dict.fromkeys(r.family for r in mine):
            best = smallest([r for r in mine if r.family == family], floor, codings)
            ratio = None if best is None or uint8 is None else uint8.bytes_per_image / best.bytes_per_image
            line[family] = None if best is None else {"split": best.split, "coding": best.coding,
                                                      "bytes": best.bytes_per_image, "top1": best.top1,
                                                      "fewer_bytes_than_uint8": ratio}
            print(f"  {family:10} " + ("no coding within the floor" if best is None else
                  f"{best.split} {best.coding}: {best.bytes_per_image:,} B ({best.top1:.4f})"
                  + ("" if ratio is None else f", {ratio:.1f}x fewer bytes than uint8")))
        summary[model] = line
    print(f"\n{seconds:.0f} s in all")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "bench": "fmnist_codings", "python": platform.python_version(), "seconds": seconds,
        "train_images": args.train_images, "trained_bits": trained_bits, "max_loss": args.max_loss,
        "test": f"{len(test)} images of {TEST}, real labels", "calibration": f"64 images of {TRAIN}",
        "summary": summary, "rows": [r.__dict__ for r in rows],
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    plot(rows, full, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


def plot(rows: list[Row], full: dict[str, float], path: Path) -> None:
    fig, axes = plt.subplots(1, len(full), figsize=(7 * len(full), 5), squeeze=False)
    for ax, (model, reference) in zip(axes[0], full.items()):
        lines = dict.fromkeys((r.family, r.split) for r in rows if r.model == model)
        for i, (family, split) in enumerate(lines):
            points = sorted((r for r in rows if (r.model, r.family, r.split) == (model, family, split)
                             and r.coding.startswith("k")), key=lambda r: r.bytes_per_image)
            style = {"plain": "-", "ae": "--", "ae+kd": "-."}.get(family, ":")
            ax.plot([r.bytes_per_image for r in points], [r.top1 for r in points], style, marker="o",
                    color=plt.cm.tab20(i % 20),  # the default cycle repeats after ten lines
                    label=f"{family} at {split}")  # not led by "_": the legend keeps it
            for r in points:
                ax.annotate(r.coding, (r.bytes_per_image, r.top1), fontsize=7, xytext=(3, 3),
                            textcoords="offset points")
        ax.axhline(reference, color="grey", lw=0.8)
        ax.axhline(reference - 0.01, color="grey", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_xlabel("bytes per image (log)")
        ax.set_ylabel("top-1 on the 10,000 test images")
        ax.set_title(f"fmnist_{model}: float32 {reference:.4f} (grey), 1 point below (dashed)")
        low = min(r.top1 for r in rows if r.model == model and r.coding.startswith("k"))
        ax.set_ylim(max(0.0, min(low, reference - 0.02) - 0.005), min(1.0, reference + 0.015))
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
