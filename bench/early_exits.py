"""An answer from the cut (issue 48): early exits, trained and calibrated by ``split-export build --exits``.

Every figure comes from bundles built as the command line builds them (``build_bundle`` with
:class:`exporter._exits.ExitOptions`), their tables read from the manifests, measured by the build
on images never trained on:

(a) the suite's Fashion-MNIST networks (``build/fmnist-vgg.pt``, ``build/fmnist-resnet.pt``: the
    Makefile's recipe, one epoch on 10,000 images), exits trained on 10,000 labelled training
    images, tables on the 10,000 test images (real labels): per cut and kind, the largest share of
    test images an exit answers within 1 point of the full model's top-1 on those same images
    (the issue's target: at least half), and the share at agreement >= 0.95;
(b) MobileNetV2 with its real ImageNet weights, cut at the test bundle's two cuts: exits distilled
    (no labels) from the full model on ``--train-crops`` crops of Debian's gnome backgrounds and of
    OpenCV's street video (half each), tables on ``--test-crops`` crops of scikit-image photos (another
    set: never a training image): the share of frames exiting at the lowest threshold whose
    agreement with the full model is >= 0.95;
(c) one thread, batch 1: the head with each exit kind (both outputs fetched, what a board pays to
    consult the exit) over the head alone, medians of ``--repeats`` rounds run round robin; and, for
    the record, the head with an exit asked for its cut alone (what a board pays that ignores it).

    nice -n 19 .venv/bin/python bench/early_exits.py --weights mobilenet_v2-b0353104.pth \\
        --out build/bench/early_exits.json
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from cut_codings import _photos, median_ms  # noqa: E402  (the held-out pictures of issue 47's bench)

from device_runtime import Bundle  # noqa: E402
from device_runtime.engine import OnnxBackend  # noqa: E402
from exporter import BuildSpec, ExitOptions, build_bundle, export_onnx, split_at, trace  # noqa: E402
from exporter._exits import WithExit, make_exit  # noqa: E402
from exporter._models import load_model  # noqa: E402

FMNIST = {"fmnist_vgg": ("build/fmnist-vgg.pt", ["_6", "_13", "_17"]),
          "fmnist_resnet": ("build/fmnist-resnet.pt", ["_4_relu", "_6_relu"])}
MOBILENET_CUTS = ["features_4_conv_2", "features_14_conv_2"]
KINDS = ("pool_linear", "conv")


def write_crops(kinds: list[str], n: int, folder: Path, seed: int) -> Path:
    """``n`` random crops (30-100 % of each side, half mirrored) of ``kinds``' pictures, in equal parts,
    as PNG in one class folder no label names (so the build distils: no labels)."""
    rng = np.random.default_rng(seed)
    (folder / "crops").mkdir(parents=True)
    i = 0
    for kind in kinds:
        photos = _photos(kind)
        for _ in range(n // len(kinds)):
            image = photos[rng.integers(len(photos))]
            h, w = image.shape[:2]
            ch, cw = int(h * rng.uniform(0.3, 1.0)), int(w * rng.uniform(0.3, 1.0))
            top, left = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
            crop = image[top : top + ch, left : left + cw]
            crop = crop[:, ::-1] if rng.random() < 0.5 else crop
            scale = 320 / min(crop.shape[:2])  # a camera-like frame: the board resizes to 256 and crops 224
            crop = cv2.resize(np.ascontiguousarray(crop), None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)
            cv2.imwrite(str(folder / "crops" / f"{i}.png"), cv2.cvtColor(crop, cv2.COLOR_RGB2BGR))
            i += 1
    return folder


def tables(manifest) -> dict[str, dict]:
    return {s.id: {"kind": s.exit.kind, "params": s.exit.params, "measured_on": s.exit.measured_on,
                   "max_rel_error": s.exit.max_rel_error,
                   "thresholds": [r.__dict__ for r in s.exit.thresholds],
                   "within_1_point": None if s.exit.thresholds[0].top1 is None
                   else _row(s.exit.threshold(top1_loss=0.01)),
                   "agreement_0.95": _row(s.exit.threshold(agreement=0.95))}
            for s in manifest.splits if s.exit is not None}


def _row(row) -> dict | None:
    return None if row is None else dict(row.__dict__)


def head_times(module: torch.nn.Module, shape: tuple[int, ...], cuts: list[str], repeats: int, work: Path) -> dict:
    """Per cut: ms of the head alone, with each exit kind (both outputs; and the cut alone), one thread."""
    traced = trace(module, shape)
    x = np.random.default_rng(0).standard_normal((1, *shape), dtype=np.float32)
    out = {}
    for cut in cuts:
        head, _ = split_at(traced, cut)
        with torch.no_grad():
            cut_shape = tuple(head(torch.from_numpy(x)).shape[1:])
            classes = int(module(torch.from_numpy(x)).shape[1])
        paths = {"head": work / f"{cut}.onnx"}
        export_onnx(head, "head", torch.from_numpy(x), paths["head"])
        for kind in KINDS:
            torch.manual_seed(0)
            paths[kind] = work / f"{cut}.{kind}.onnx"
            export_onnx(WithExit(head, make_exit(kind, cut_shape, classes).eval()), "head", torch.from_numpy(x),
                        paths[kind], ("input", "cut", "exit_logits"))
        sessions = {name: OnnxBackend(path, threads=1) for name, path in paths.items()}
        calls = {"head": lambda: sessions["head"].run(x)}
        for kind in KINDS:
            calls[kind] = (lambda s: lambda: s.run_outputs(x, ("cut", "exit_logits")))(sessions[kind])
            calls[f"{kind} (cut alone)"] = (lambda s: lambda: s.run(x))(sessions[kind])
        ms = median_ms(calls, repeats)
        out[cut] = {"ms": ms, **{f"{name} / head": ms[name] / ms["head"] for name in ms if name != "head"}}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--weights", required=True, help="MobileNetV2's ImageNet state dict")
    parser.add_argument("--train-crops", type=int, default=2000)
    parser.add_argument("--test-crops", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--kinds", default=",".join(KINDS), help="the exit kinds (b) builds (comma-separated)")
    parser.add_argument("--cuts", default=",".join(MOBILENET_CUTS), help="MobileNetV2's cuts (b) builds")
    parser.add_argument("--only", default="fmnist,mobilenet_v2,head_time",
                        help="the parts to run (fmnist, mobilenet_v2, head_time); the others are kept from --out")
    parser.add_argument("--out", default="build/bench/early_exits.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    results: dict = json.loads(out.read_text()) if out.is_file() else {"fmnist": {}, "mobilenet_v2": {}, "head_time": {}}
    results |= {"machine": platform.processor() or platform.machine(), "date": time.strftime("%Y-%m-%d")}
    parts = set(args.only.split(","))

    def save() -> None:  # after each part: a long run keeps what it measured
        out.write_text(json.dumps(results, indent=2) + "\n")

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name, (weights, cuts) in FMNIST.items() if "fmnist" in parts else ():
            for kind in KINDS:
                start = time.perf_counter()
                manifest = build_bundle(BuildSpec(
                    f"exporter.zoo:{name}", weights=weights, splits=cuts, input_shape=(1, 28, 28),
                    exits=ExitOptions(train_data="fashion-mnist", kind=kind)), work / f"{name}-{kind}", progress=False)
                results["fmnist"].setdefault(name, {})[kind] = tables(manifest)
                print(f"{name} {kind}: built in {time.perf_counter() - start:.0f} s", flush=True)
                save()
        if "mobilenet_v2" in parts:
            train = write_crops(["backgrounds", "video"], args.train_crops, work / "train", seed=0)
            test = write_crops(["skimage"], args.test_crops, work / "test", seed=1)
        for kind in args.kinds.split(",") if "mobilenet_v2" in parts else ():
            start = time.perf_counter()
            manifest = build_bundle(BuildSpec(
                "torchvision:mobilenet_v2", weights=args.weights, splits=args.cuts.split(","),
                exits=ExitOptions(train_data=str(train), test_data=str(test), kind=kind,
                                  train_images=args.train_crops)), work / f"mobilenet-{kind}", progress=False)
            results["mobilenet_v2"][kind] = tables(manifest)
            print(f"mobilenet_v2 {kind}: built in {time.perf_counter() - start:.0f} s", flush=True)
            shutil.rmtree(work / f"mobilenet-{kind}")
            save()
        if "head_time" in parts:
            for name, (weights, cuts) in FMNIST.items():
                loaded = load_model(f"exporter.zoo:{name}", weights, input_shape=(1, 28, 28))
                results["head_time"][name] = head_times(loaded.module.eval(), (1, 28, 28), cuts, args.repeats, work)
            loaded = load_model("torchvision:mobilenet_v2", args.weights)
            results["head_time"]["mobilenet_v2"] = head_times(loaded.module.eval(), loaded.input_shape,
                                                              MOBILENET_CUTS, max(20, args.repeats // 4), work)
            save()
    report(results)


def report(results: dict) -> None:
    print("\n(a)/(b) per cut and exit kind: at the lowest threshold within 1 point of the full model's top-1 on "
          "the same frames (labels), and at agreement >= 0.95")
    for family in ("fmnist", "mobilenet_v2"):
        models = results[family] if family == "fmnist" else {"mobilenet_v2": results[family]}
        for model, kinds in models.items():
            for kind, splits in kinds.items():
                for split, t in splits.items():
                    first = t["thresholds"][0]
                    line = f"  {model} {split} {kind} ({t['params']:,} params, on {t['measured_on']}): always-exit " \
                           f"agreement {first['agreement']:.3f}"
                    if first["top1"] is not None:
                        line += f", top-1 {first['top1']:.3f} (full {first['full_top1']:.3f})"
                    w = t["within_1_point"]
                    if w is not None:
                        line += (f"; within 1 point: threshold {w['confidence']:g}, share {w['share']:.3f}, "
                                 f"top-1 {w['top1']:.4f} vs full {w['full_top1']:.4f}")
                    a = t["agreement_0.95"]
                    line += ("; agreement >= 0.95: none" if a is None else
                             f"; agreement >= 0.95: threshold {a['confidence']:g}, share {a['share']:.3f} "
                             f"(agreement {a['agreement']:.3f})")
                    print(line)
    print("\n(c) head time with each exit over the head alone, one thread, batch 1")
    for model, cuts in results["head_time"].items():
        for cut, t in cuts.items():
            print(f"  {model} {cut}: head {t['ms']['head']:.3f} ms; "
                  + "; ".join(f"{name} {ratio:.3f}" for name, ratio in t.items() if name.endswith("/ head")))


if __name__ == "__main__":
    main()
