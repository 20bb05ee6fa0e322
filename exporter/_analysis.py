"""Where to cut a model: DSC's bottlenecks and I-SPLIT's CUI curves side by side, in one report.

``analyze`` writes ``points.json`` (schema: :mod:`exporter._report_schema`) and the plots of
:mod:`exporter._plots`, and returns the report. The two papers answer different questions —
DSC: where is the tensor small (cheap to send)? I-SPLIT: where does the information the
decision needs still flow? — and the report keeps both per cut point so that a user can
weigh them against the head's cost.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal, Sequence

import numpy as np
import torch
from torch.fx.passes.shape_prop import TensorMetadata

from exporter._blocks import BlockCounts, count_blocks
from exporter._costs import cumulative_macs, total_parameters
from exporter._cui import CuiChoices, cui_per_image, local_maxima
from exporter._datasets import DataError, ImageSet, load_images, read_synonyms
from exporter._graph import CutPoint, TracedModel, find_cut_points, trace
from exporter._models import load_model
from exporter._preprocessing import PreprocessFlags
from exporter._plots import write_plots
from exporter._report_schema import SCHEMA_ID, write_report

__all__ = ["AnalysisSpec", "analyze", "build_report", "class_subset", "summary_text"]

TOP_MAXIMA = 5  # the summary names this many candidates; points.json keeps them all


def _outputs(traced: TracedModel) -> int:
    (output,) = [n for n in traced.module.graph.nodes if n.op == "output"]
    meta = output.args[0].meta.get("tensor_meta")
    if not isinstance(meta, TensorMetadata) or len(meta.shape) != 2:
        raise DataError("CUI needs a classifier: a model whose output is (batch, classes)")
    return int(meta.shape[1])


def class_subset(spec: str | None, classes: Sequence[str]) -> list[int] | None:
    """``--classes 3,5,7`` or ``--classes Bag,Sandal``: indices into ``classes``."""
    if spec is None:
        return None
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if not parts:
        raise DataError("--classes is empty; give class indices or names, e.g. --classes 3,5,7")
    chosen = []
    for part in parts:
        if part.isdigit() and int(part) < len(classes):
            chosen.append(int(part))
        elif part in classes:
            chosen.append(classes.index(part))
        else:
            raise DataError(f"--classes: unknown class {part!r}; classes are 0..{len(classes) - 1}: {', '.join(classes)}")
    return sorted(set(chosen))


def _check_labels(images: ImageSet, outputs: int) -> None:
    bad = images.y[(images.y < 0) | (images.y >= outputs)]
    if len(bad):
        raise DataError(
            f"{images.source}: labels {sorted(set(bad.tolist()))[:5]} are outside the model's {outputs} outputs (0..{outputs - 1})"
        )


@dataclasses.dataclass(frozen=True)
class AnalysisSpec:
    """What ``split-export analyze`` measures: the model, the images and how each is scored, as
    its flags say it. Defaults are the flags' defaults."""

    model: str  # torchvision:NAME or package.module:factory
    data: str  # fashion-mnist, a folder of class folders, or an .npz
    weights: str | Path | None = None
    classes: str | None = None  # comma-separated labels for the per-class curves
    images: int | None = None  # at most this many, drawn with ``seed``
    target: Literal["label", "predicted"] = "label"
    score: Literal["logit", "softmax"] = "logit"
    input_shape: tuple[int, ...] | None = None
    batch_size: int = 32
    seed: int = 0
    preprocessing: PreprocessFlags | None = None
    synonyms: str | Path | None = None  # NAME = LABEL lines for folders not named after labels
    output: str | None = None  # a model of several outputs: the one analysed (index or key)


def analyze(spec: AnalysisSpec, out_dir: str | Path, progress: bool = True) -> dict[str, Any]:
    """Analyse every cut point of ``spec.model`` on ``spec.data``; write the report and plots to
    ``out_dir``. ``spec.synonyms`` maps class folders not named after the model's labels
    (:func:`exporter._datasets.read_synonyms`)."""
    model, data, weights, classes, images, target, score = (
        spec.model, spec.data, spec.weights, spec.classes, spec.images, spec.target, spec.score)
    input_shape, batch_size, seed, preprocessing, synonyms = (
        spec.input_shape, spec.batch_size, spec.seed, spec.preprocessing, spec.synonyms)
    torch.manual_seed(seed)
    loaded = load_model(model, weights, preprocessing, input_shape, output=spec.output)
    traced = trace(loaded.module, loaded.input_shape)
    outputs = _outputs(traced)
    aliases = None
    if synonyms is not None:
        if not loaded.categories:
            raise DataError(f"--synonyms {synonyms}: {loaded.name} has no labels to map folder names to "
                            "(its weights or factory name none)")
        aliases = read_synonyms(synonyms, loaded.categories)
    image_set = load_images(data, traced.input_shape, loaded.preprocess, loaded.categories,
                            synonyms=aliases).subset(images, seed)
    _check_labels(image_set, outputs)
    subset = class_subset(classes, image_set.classes)
    if subset is not None and not np.isin(image_set.y, subset).any():
        raise DataError(f"--classes {classes}: none of the {len(image_set)} images belongs to these classes")
    empty = [image_set.classes[c] for c in subset or () if not (image_set.y == c).any()]
    if empty:
        raise DataError(f"--classes {classes}: no images of {', '.join(map(repr, empty))} in {data}: "
                        "a CUI curve needs images of every class it names")
    cuts = find_cut_points(traced)
    choices = CuiChoices(score=score, target=target)
    run = cui_per_image(traced, cuts, image_set.x, image_set.y, choices, batch_size, progress)
    report = build_report(loaded.name, traced, cuts, image_set, run.cui, subset, choices, seed)
    report["data"]["accuracy"] = float((run.predictions == image_set.y).mean())
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_report(out / "points.json", report)
    write_plots(report, out)
    return report


def build_report(
    name: str,
    traced: TracedModel,
    cuts: Sequence[CutPoint],
    images: ImageSet,
    cui: np.ndarray,
    subset: list[int] | None,
    choices: CuiChoices,
    seed: int,
) -> dict[str, Any]:
    """The ``points.json`` dictionary: per-cut facts, CUI global / per class / subset, summary."""
    present = [c for c in range(len(images.classes)) if (images.y == c).any()]
    global_curve = cui.mean(axis=0)
    per_class = {images.classes[c]: cui[images.y == c].mean(axis=0) for c in present}
    subset_curve = cui[np.isin(images.y, subset)].mean(axis=0) if subset else None
    macs = cumulative_macs(traced)
    total_macs = max(macs.values())
    params = total_parameters(traced)
    points = []
    for i, cut in enumerate(cuts):
        elements = cut.bytes_per_sample // np.dtype(cut.dtype).itemsize
        points.append({
            "id": cut.id,
            "position": cut.position,
            "op": cut.op,
            "shape": list(cut.shape),
            "bytes_per_sample": {"float32": int(elements * 4), "uint8": int(elements)},
            "compression_ratio": cut.compression_ratio,
            "natural": cut.natural,
            "compressive": cut.compressive,
            "head": {"parameters": cut.head_parameters, "macs": macs[cut.id]},
            "tail": {"parameters": params - cut.head_parameters, "macs": total_macs - macs[cut.id]},
            "cui": {
                "global": float(global_curve[i]),
                "per_class": {k: float(v[i]) for k, v in per_class.items()},
                "subset": None if subset_curve is None else float(subset_curve[i]),
            },
        })
    ids = [c.id for c in cuts]
    return {
        "schema": SCHEMA_ID,
        "model": {"name": name, "input_shape": list(traced.input_shape), "parameters": params, "macs": total_macs},
        "data": {
            "source": images.source,
            "images": len(images),
            "classes": list(images.classes),
            "images_per_class": {images.classes[c]: int((images.y == c).sum()) for c in present},
            "class_subset": None if subset is None else [images.classes[c] for c in subset],
            "seed": seed,
        },
        "choices": choices.as_dict(),
        "points": points,
        "summary": {
            "compressive": [c.id for c in cuts if c.compressive],
            "cui_maxima": [ids[i] for i in local_maxima(global_curve)],
            "recommended": ids[int(np.argmax(global_curve))],
            "recommended_subset": None if subset_curve is None else ids[int(np.argmax(subset_curve))],
            "blocks": dataclasses.asdict(count_blocks(cuts)),
            **_recommendation(traced, cuts, ids[int(np.argmax(global_curve))]),
        },
    }


#: What the CUI validation (docs/cui-validation.md) found, by kind of network.
EVIDENCE_RESIDUAL = ("weak: on a residual network the CUI validation found no correlation between the CUI and the "
                     "accuracy kept after the cut (Spearman rho = -0.003, docs/cui-validation.md); measure the "
                     "candidates instead (build --test-data)")
EVIDENCE_PLAIN = ("moderate: on a plain (VGG-style) network the CUI validation found the CUI ranks cuts by the "
                  "accuracy kept (Spearman rho = 0.66, p = 0.03; one data set, one seed: docs/cui-validation.md)")


def _residual(traced: TracedModel) -> bool:
    """Whether two values computed from the input meet anywhere (a residual add, a gate's mul)."""
    nodes = list(traced.module.graph.nodes)
    dynamic = {n for n in nodes if n.op == "placeholder"}
    for node in nodes:
        inputs = [a for a in node.all_input_nodes if a in dynamic]
        if inputs:
            dynamic.add(node)
        if len(set(inputs)) > 1 and isinstance(node.meta.get("tensor_meta"), TensorMetadata):
            return True
    return False


def _recommendation(traced: TracedModel, cuts: Sequence[CutPoint], recommended: str) -> dict[str, Any]:
    """How strong the evidence for the CUI's pick is, and whether ``build --splits auto`` exports it."""
    cut = next(c for c in cuts if c.id == recommended)
    if cut.compressive:
        auto = f"{recommended} is one of the cuts build --splits auto exports"
    else:
        earlier = [c for c in cuts if c.position < cut.position]
        smaller = min(earlier, key=lambda c: c.compression_ratio, default=None)
        why = ("its cut tensor is not smaller than the input (c_l >= 1)" if not cut.natural else
               f"{smaller.id} before it sends less (c_l {smaller.compression_ratio:.3f} vs {cut.compression_ratio:.3f})"
               if smaller is not None else "it is not a compressive bottleneck")
        auto = f"build --splits auto does not export {recommended}: {why}; name it to export it: --splits {recommended}"
    return {"recommended_evidence": EVIDENCE_RESIDUAL if _residual(traced) else EVIDENCE_PLAIN,
            "recommended_in_auto": cut.compressive, "recommended_auto_note": auto}


def summary_text(report: dict[str, Any]) -> str:
    """What ``split-export analyze`` prints: the bottlenecks, the CUI maxima, the recommendation."""
    summary, data = report["summary"], report["data"]
    by_id = {p["id"]: p for p in report["points"]}

    top = sorted(summary["cui_maxima"], key=lambda c: -by_id[c]["cui"]["global"])[:TOP_MAXIMA]

    def describe(cut_id: str) -> str:
        p = by_id[cut_id]
        return f"{cut_id} (CUI {p['cui']['global']:.4g}, c_l {p['compression_ratio']:.3f}, {p['bytes_per_sample']['float32']:,} B)"

    lines = [
        f"{report['model']['name']} on {data['source']}: {data['images']} images, top-1 accuracy {data['accuracy']:.3f}",
        f"compressive bottlenecks (DSC Eq. 3): {', '.join(summary['compressive']) or 'none'}",
        *([BlockCounts(**summary["blocks"]).summary()] if "blocks" in summary else []),
        f"CUI local maxima (I-SPLIT candidates), the {min(TOP_MAXIMA, len(summary['cui_maxima']))} highest of "
        f"{len(summary['cui_maxima'])}: " + ", ".join(describe(c) for c in top),
        f"recommended cut (global CUI maximum): {describe(summary['recommended'])}",
        *([f"  evidence: {summary['recommended_evidence']}", f"  {summary['recommended_auto_note']}"]
          if "recommended_evidence" in summary else []),
    ]
    if summary["recommended_subset"]:
        lines.append(
            f"recommended cut for classes {', '.join(data['class_subset'])}: {summary['recommended_subset']}"
        )
    return "\n".join(lines)
