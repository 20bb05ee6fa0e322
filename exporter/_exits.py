"""Early exits at the cut (``split-export build --exits``, issue 48): trained, exported, calibrated.

An exit is a small classifier on a layer split's cut tensor (BranchyNet, Teerapittayanon et al.
2016; SDN, Kaya et al. 2019, adds them to a frozen pretrained network as here):

* ``pool_linear``: global average pooling over the cut's spatial axes, then one linear layer;
* ``conv``: one 3x3 convolution block (convolution, batch norm, ReLU; as many channels as the
  cut) before them, for cuts whose pooled channels alone separate the classes poorly.

It is trained with the network frozen: the head's cut and the full model's logits are computed
once per training image (torch, eval mode), then the exit alone is trained on them by
:func:`exporter._train.train_classifier` with Hinton's distillation loss
(:func:`exporter._rate.distillation_loss`: KL at a temperature from the full model's logits, plus
cross-entropy on the labels where the data has the model's labels, else on the full model's top-1).

It is exported inside the head, as its second output (:data:`Exit.OUTPUT`), so the board runs
the head once and pays only the exit's own layers (:class:`WithExit`); every head artifact of the
split carries it and the build validates it against torch output by output. Its thresholds are
**measured, never guessed**: on held-out images (the build's ``--test-data``, or images held out
of the exits' training data, never one it trained on) the exported float32 head's exit and the
exported full model are run, and for each confidence of :data:`CONFIDENCES` (the exit's softmax
maximum) the table records the share of frames that would exit, their agreement with the full
model and, where the images carry the model's labels, the exit's top-1 and the full model's on
the same frames. The manifest keeps the table (:class:`device_runtime.Exit`); ``report/exits.json``
and ``exits.png`` draw it for people, beside nothing a board loads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from device_runtime import Exit
from exporter._codings import REPORT_DIR, read_bundle_report, write_bundle_report
from exporter._datasets import ImageSet
from exporter._train import train_classifier
from exporter._validate import Runner
from splitedge.errors import ExportError

__all__ = ["CONFIDENCES", "DEFAULT_KIND", "EXITS_JSON", "EXITS_PNG", "ExitOptions", "ExitReport", "WithExit",
           "describe_row", "exit_table", "kind_for", "make_exit", "measure_exit", "parameters", "read_exits",
           "train_exit", "write_exits"]

#: The default exit: measured by ``bench/early_exits.py`` (docs/benchmarks.md, issue 48).
DEFAULT_KIND = "conv"
#: The thresholds a table is measured at (the exit answers where its softmax maximum is at least
#: one). 0 is "always exit" (the exit's own accuracy); 1/K is the least a softmax of K classes gives.
CONFIDENCES = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.93, 0.95, 0.97, 0.98, 0.99, 0.995, 0.999)
EXITS_JSON, EXITS_PNG = "exits.json", "exits.png"
EXITS_SCHEMA_ID = "splitedge.exits/1"
#: The cut values held while training an exit (they are computed once, then the exit alone trains
#: on them): 10,000 Fashion-MNIST images at the widest cut are 50 MB, 2,000 MobileNetV2 crops at
#: features_14 160 MB; past this the build asks for fewer --train-images rather than swap.
MAX_FEATURE_BYTES = 2 << 30
#: Images run at once through torch while computing cuts, and through onnxruntime while measuring.
BATCH = 256
#: An exit's training, for a head that is frozen: a few epochs of Adam at a rate five times the
#: training helper's (a small layer on fixed features; on the suite's Fashion-MNIST VGG a pooled
#: linear exit at _13 agreed with the full model on 0.52 of the test images after 2 epochs at 2e-3,
#: 0.71 after 5 at 1e-2).
EPOCHS = 5
LR = 1e-2


@dataclass(frozen=True)
class ExitOptions:
    """What ``--exits`` trains: ``kind`` at every layer split, on ``train_data`` (at most
    ``train_images`` of it), its table measured on ``test_data`` (else held-out images)."""

    train_data: str
    test_data: str | None = None
    kind: str | None = None  # None: DEFAULT_KIND where the cut takes it, else pool_linear (:func:`kind_for`)
    train_images: int | None = 10_000
    epochs: int = EPOCHS
    lr: float = LR
    seed: int = 0


class PoolLinear(nn.Module):
    """Global average pooling over every axis after the channels, then a linear layer: the cheapest
    exit (a cut of C channels costs C x K + K parameters for K classes)."""

    def __init__(self, channels: int, classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(channels, classes)

    def forward(self, cut: torch.Tensor) -> torch.Tensor:
        pooled = cut.flatten(2).mean(2) if cut.dim() > 2 else cut  # (N, C)
        return self.linear(pooled)


class ConvExit(nn.Module):
    """One 3x3 convolution block (as many channels as the cut, batch norm, ReLU) before
    :class:`PoolLinear`: what SDN's internal classifiers add to pooling on early, wide cuts."""

    def __init__(self, channels: int, classes: int) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels),
                                   nn.ReLU())
        self.head = PoolLinear(channels, classes)

    def forward(self, cut: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(cut))


def kind_for(kind: str | None, cut_shape: Sequence[int]) -> str:
    """The exit trained at a cut of ``cut_shape``: ``kind`` as asked, or where none was asked
    :data:`DEFAULT_KIND` where the cut takes it (a convolution needs (C, H, W)), else pool_linear."""
    if kind is not None:
        return kind
    return DEFAULT_KIND if len(cut_shape) == 3 else "pool_linear"


def make_exit(kind: str, cut_shape: Sequence[int], classes: int) -> nn.Module:
    """An untrained exit of ``kind`` for a cut of ``cut_shape`` (per sample) and ``classes`` outputs;
    :class:`ExportError` in one line for a kind or a cut it cannot take."""
    if kind not in Exit.KINDS:
        raise ExportError(f"--exit-kind {kind}: an exit is one of {', '.join(Exit.KINDS)}")
    if not cut_shape:
        raise ExportError(f"an exit needs a cut with channels; this cut's shape is {list(cut_shape)}")
    if kind == "conv" and len(cut_shape) != 3:
        raise ExportError(f"--exit-kind conv convolves a (C, H, W) cut; this cut's shape is {list(cut_shape)}: "
                          "use --exit-kind pool_linear")
    return (PoolLinear if kind == "pool_linear" else ConvExit)(int(cut_shape[0]), classes)


def parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


class WithExit(nn.Module):
    """A head with its exit: ``input -> (cut, exit_logits)``, exported as one graph with two outputs,
    so the board computes the cut once and the exit from it."""

    def __init__(self, head: nn.Module, exit_: nn.Module) -> None:
        super().__init__()
        self.head, self.exit = head, exit_

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cut = self.head(x)
        return cut, self.exit(cut)


@torch.no_grad()
def _cuts_and_logits(head: nn.Module, tail: nn.Module, images: ImageSet) -> tuple[np.ndarray, np.ndarray]:
    """The frozen head's cut and the full model's logits (the tail after it) on every image."""
    head.eval(), tail.eval()
    cuts, logits = [], []
    for start in range(0, len(images), BATCH):
        cut = head(torch.from_numpy(np.ascontiguousarray(images.x[start : start + BATCH])))
        if start == 0 and cut.numel() // len(cut) * 4 * len(images) > MAX_FEATURE_BYTES:
            raise ExportError(f"an exit's training holds the cut of every training image: {len(images):,} images of "
                              f"{list(cut.shape[1:])} are over {MAX_FEATURE_BYTES >> 30} GiB; give fewer --train-images")
        cuts.append(cut.numpy())
        logits.append(tail(cut).numpy())
    return np.concatenate(cuts), np.concatenate(logits)


def train_exit(
    head: nn.Module, tail: nn.Module, cut_shape: Sequence[int], options: ExitOptions, train: ImageSet, progress: bool,
) -> nn.Module:
    """An exit of ``options.kind`` on the cut between ``head`` and ``tail``, trained on ``train``
    (torch's view of the images) with both frozen: distilled from the full model's logits, with
    cross-entropy on the images' labels where they are the model's, else on its top-1."""
    cuts, teacher = _cuts_and_logits(head, tail, train)
    labels = train.y if train.labelled else teacher.argmax(1).astype(np.int64)
    torch.manual_seed(options.seed)  # the exit's initial weights from the build's seed
    exit_ = make_exit(kind_for(options.kind, cut_shape), cut_shape, teacher.shape[1])
    features = ImageSet(cuts, labels, train.classes, train.source, train.labelled)
    return train_classifier(exit_, features, epochs=options.epochs, lr=options.lr, seed=options.seed,
                            progress=progress, teacher=teacher)


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64) - logits.max(1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(1, keepdims=True)


def exit_table(
    exit_logits: np.ndarray, full_logits: np.ndarray, labels: np.ndarray | None,
    confidences: Sequence[float] = CONFIDENCES,
) -> tuple[Exit.Threshold, ...]:
    """For each of ``confidences``, the frames whose exit softmax maximum reaches it: their share,
    their agreement with the full model's top-1 and (``labels``) both models' top-1 on them. A
    confidence no frame reaches measures nothing and has no row; the shares never grow."""
    confidence = _softmax(exit_logits).max(1)
    exit_top, full_top = exit_logits.argmax(1), full_logits.argmax(1)
    rows = []
    for c in confidences:
        exited = confidence >= c
        n = int(exited.sum())
        if n == 0:
            break
        top1 = full_top1 = None
        if labels is not None:
            top1 = float((exit_top[exited] == labels[exited]).mean())
            full_top1 = float((full_top[exited] == labels[exited]).mean())
        rows.append(Exit.Threshold(confidence=float(c), share=n / len(confidence),
                                   agreement=float((exit_top[exited] == full_top[exited]).mean()),
                                   top1=top1, full_top1=full_top1))
    return tuple(rows)


def measure_exit(head: Runner, full: Runner, images: ImageSet, output: str = Exit.OUTPUT) -> tuple[Exit.Threshold, ...]:
    """:func:`exit_table` of the exported ``head`` (its ``output``) against the exported ``full`` model
    on ``images`` (as the artifacts take them): what the board will run, measured."""
    exits, fulls = [], []
    (head_input,), (full_input,) = head.input_names, full.input_names
    for start in range(0, len(images), BATCH):
        x = images.x[start : start + BATCH]
        exits.append(head({head_input: x})[output])
        (logits,) = full({full_input: x}).values()
        fulls.append(logits)
    return exit_table(np.concatenate(exits), np.concatenate(fulls), images.y if images.labelled else None)


@dataclass(frozen=True)
class ExitReport:
    """What ``report/exits.json`` holds: each split's exit and its table, and the images in words."""

    model: str
    measured_on: str
    splits: tuple[tuple[str, Exit], ...]


_NULLABLE_UNIT = {"oneOf": [{"type": "number", "minimum": 0, "maximum": 1}, {"type": "null"}]}
_UNIT = {"type": "number", "minimum": 0, "maximum": 1}
SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": EXITS_SCHEMA_ID,
    "type": "object",
    "required": ["schema", "model", "measured_on", "splits"],
    "properties": {
        "schema": {"const": EXITS_SCHEMA_ID},
        "model": {"type": "string"},
        "measured_on": {"type": "string"},
        "splits": {"type": "array", "items": {
            "type": "object",
            "required": ["split", "kind", "params", "measured_on", "thresholds"],
            "properties": {
                "split": {"type": "string"}, "kind": {"enum": list(Exit.KINDS)},
                "params": {"type": "integer", "minimum": 1}, "measured_on": {"type": "integer", "minimum": 1},
                "thresholds": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "required": ["confidence", "share", "agreement", "top1", "full_top1"],
                    "properties": {"confidence": _UNIT, "share": _UNIT, "agreement": _UNIT, "top1": _NULLABLE_UNIT,
                                   "full_top1": _NULLABLE_UNIT},
                    "additionalProperties": False}},
            },
            "additionalProperties": False,
        }},
    },
    "additionalProperties": False,
}
#: A report's file is read whole: a split's table is a couple of kilobytes.
MAX_REPORT_BYTES = 4 << 20


def _report(report: ExitReport) -> dict[str, Any]:
    return {"schema": EXITS_SCHEMA_ID, "model": report.model, "measured_on": report.measured_on, "splits": [
        {"split": split, "kind": e.kind, "params": e.params, "measured_on": e.measured_on,
         "thresholds": [{"confidence": r.confidence, "share": r.share, "agreement": r.agreement, "top1": r.top1,
                         "full_top1": r.full_top1} for r in e.thresholds]}
        for split, e in report.splits]}


def write_exits(report: ExitReport, root: Path) -> tuple[Path, Path]:
    """``report/exits.json`` and ``report/exits.png`` in the bundle at ``root``; the JSON is held to
    :data:`SCHEMA` before it is written."""
    from exporter._plots import plot_exits  # matplotlib: only where a table is drawn

    return write_bundle_report(root, EXITS_JSON, EXITS_PNG, _report(report), SCHEMA, plot_exits)


def read_exits(bundle: str | Path) -> dict[str, Any] | None:
    """The exits report a build wrote into ``bundle`` (as :data:`SCHEMA`), or None where it trained
    none; :class:`ExportError` naming the file for one that is no report this module wrote."""
    path = Path(bundle) / REPORT_DIR / EXITS_JSON
    if not path.is_file():
        return None
    return read_bundle_report(path, SCHEMA, MAX_REPORT_BYTES, "an exits report")


def describe_row(row: Exit.Threshold) -> str:
    """``0.90  share 0.63  agreement 0.991  top-1 0.962 (full 0.968)``: one row of a table, for the summary."""
    text = f"{row.confidence:<5g}  share {row.share:.3f}  agreement {row.agreement:.3f}"
    if row.top1 is not None and row.full_top1 is not None:
        text += f"  top-1 {row.top1:.3f} (full {row.full_top1:.3f})"
    return text

