"""Does the CUI curve predict post-split accuracy, as I-SPLIT claims? (issue 4's experiment)

On Fashion-MNIST, for a VGG-style and a residual CNN (``exporter.zoo``), trained here:

1. the CUI curve (I-SPLIT Eq. 1–2) at every cut point, on held-out test images;
2. at every candidate cut point, the bottleneck of I-SPLIT injected and trained the same way
   (``exporter._bottleneck``, latent 10%), and its test accuracy. Candidates are the outputs
   of activations, pooling, residual additions and linear layers: a convolution's and its
   batch norm's outputs have the size of the ReLU that follows them, so the ReLU stands for
   the three (and keeps the bottleneck count, hence the run time, in check);
3. Spearman's rank correlation (with p-value) between CUI and post-split accuracy, and the
   same for the compression-ratio heuristic (a larger cut tensor keeps more);
4. one plot per architecture (I-SPLIT Fig. 3 style) and ``cui_validation.json`` beside them.

Reproducible: every seed is fixed and recorded with the library versions.

    python bench/cui_validation.py --out docs/cui-validation
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import scipy  # noqa: E402
import torch  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402
from tqdm import tqdm  # noqa: E402

from exporter._bottleneck import BottleneckTraining, SplitModel, make_autoencoder, train_bottleneck  # noqa: E402
from exporter._cui import cui_per_image  # noqa: E402
from exporter._datasets import load_images  # noqa: E402
from exporter._graph import find_cut_points, split_at, trace  # noqa: E402
from exporter._train import accuracy, train_classifier  # noqa: E402
from exporter.zoo import fmnist_resnet, fmnist_vgg  # noqa: E402

SHAPE = (1, 28, 28)
ARCHITECTURES = {"fmnist_vgg": fmnist_vgg, "fmnist_resnet": fmnist_resnet}
SKIPPED_OPS = {"Conv2d", "BatchNorm2d"}  # same-size stand-ins for the activation after them


def correlation(x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    result = spearmanr(x, y)
    return {"rho": float(result.statistic), "p": float(result.pvalue)}


def run(name: str, args: argparse.Namespace, train, ae_train, test) -> dict:
    torch.manual_seed(args.seed)
    model = train_classifier(ARCHITECTURES[name](), train, epochs=args.epochs, seed=args.seed, progress=False)
    base_accuracy = accuracy(model, test)
    traced = trace(model, SHAPE)
    cuts = find_cut_points(traced)
    curve = cui_per_image(traced, cuts, test.x, test.y, progress=False).cui.mean(axis=0)
    candidates = [(cut, cui) for cut, cui in zip(cuts, curve) if cut.op not in SKIPPED_OPS]
    rows = []
    for cut, cui in tqdm(candidates, desc=f"{name}: bottleneck per cut", unit="cut"):
        head, tail = split_at(trace(copy.deepcopy(model), SHAPE), cut.id)
        split = SplitModel(head, make_autoencoder(cut.shape, args.latent_ratio), tail)
        train_bottleneck(split, ae_train, BottleneckTraining(seed=args.seed), progress=False)
        rows.append({
            "id": cut.id, "op": cut.op, "shape": list(cut.shape), "cui": float(cui),
            "compression_ratio": cut.compression_ratio, "accuracy": accuracy(split, test),
        })
    acc = np.array([r["accuracy"] for r in rows])
    return {
        "architecture": name,
        "base_accuracy": base_accuracy,
        "cut_points": rows,
        "spearman_cui_vs_accuracy": correlation(np.array([r["cui"] for r in rows]), acc),
        "spearman_compression_vs_accuracy": correlation(np.array([r["compression_ratio"] for r in rows]), acc),
        "best_by_cui": rows[int(np.argmax([r["cui"] for r in rows]))]["id"],
        "best_by_accuracy": rows[int(np.argmax(acc))]["id"],
    }


def plot(result: dict, path: Path) -> None:
    rows = result["cut_points"]
    ids = [r["id"] for r in rows]
    fig, ax = plt.subplots(figsize=(max(8, 0.45 * len(ids)), 5))
    ax.plot([r["cui"] for r in rows], color="goldenrod", lw=2, marker="o", label="CUI (I-SPLIT Eq. 1-2)")
    ax.set_ylabel("CUI")
    ax.set_xticks(range(len(ids)))
    ax.set_xticklabels(ids, rotation=90, fontsize=8)
    acc_ax = ax.twinx()
    acc_ax.plot([r["accuracy"] for r in rows], color="seagreen", lw=2, marker="s", label="post-split test accuracy")
    acc_ax.axhline(result["base_accuracy"], color="seagreen", ls=":", label="accuracy without a cut")
    acc_ax.set_ylabel("accuracy")
    ratio_ax = ax.twinx()
    ratio_ax.spines["right"].set_position(("axes", 1.12))
    ratio_ax.plot([r["compression_ratio"] for r in rows], color="steelblue", ls="--", label="$c_l$ (DSC)")
    ratio_ax.set_yscale("log")
    ratio_ax.set_ylabel("$c_l$")
    handles = sum((a.get_legend_handles_labels()[0] for a in (ax, acc_ax, ratio_ax)), [])
    ax.legend(handles=handles, fontsize=8, loc="lower left")
    rho = result["spearman_cui_vs_accuracy"]
    ax.set_title(f"{result['architecture']}: CUI vs post-split accuracy (Spearman {rho['rho']:.2f}, p={rho['p']:.3f})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train-images", type=int, default=20000, help="images the base models train on")
    parser.add_argument("--ae-images", type=int, default=5000, help="images each bottleneck trains on")
    parser.add_argument("--test-images", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=2, help="epochs of the base models")
    parser.add_argument("--latent-ratio", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("build/cui-validation"))
    args = parser.parse_args()

    start = time.time()
    train = load_images("fashion-mnist:train", SHAPE).subset(args.train_images, args.seed)
    ae_train = train.subset(args.ae_images, args.seed + 1)
    test = load_images("fashion-mnist:test", SHAPE).subset(args.test_images, args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for name in ARCHITECTURES:
        result = run(name, args, train, ae_train, test)
        plot(result, args.out / f"{name}.png")
        results.append(result)
        cui_rho, ratio_rho = result["spearman_cui_vs_accuracy"], result["spearman_compression_vs_accuracy"]
        print(f"{name}: base accuracy {result['base_accuracy']:.4f}; {len(result['cut_points'])} cuts; "
              f"Spearman CUI~accuracy {cui_rho['rho']:.3f} (p={cui_rho['p']:.3g}); "
              f"c_l~accuracy {ratio_rho['rho']:.3f} (p={ratio_rho['p']:.3g}); "
              f"best by CUI {result['best_by_cui']}, best by accuracy {result['best_by_accuracy']}")
    (args.out / "cui_validation.json").write_text(json.dumps({
        "settings": vars(args) | {"out": str(args.out)},
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
                     "scipy": scipy.__version__, "machine": platform.machine()},
        "seconds": time.time() - start,
        "results": results,
    }, indent=2))
    print(f"wrote {args.out} in {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
