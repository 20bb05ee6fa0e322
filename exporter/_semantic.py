"""Semantic splits (SplitPlace, seed-004 paper, Sec. 2 and 4): a shared trunk on the board, then K
narrow fragments on hosts, side by side, each scoring one group of classes.

The board runs the head up to a cut, exactly as a layer split's head (the trunk is the deployed
head, frozen). After the cut, the tail is replaced by K *fragments*: narrow copies of it (every
Conv/Linear/BatchNorm at ``width`` of its channels, the logits layer with one output per class of
its group), so each host holds about ``width**2`` of the tail's work and the fragments run in
parallel. The board scatters the fragments' logits into label order and takes the softmax over
all of them, as the SplitPlace authors' code merges its semantic fragments.

Which classes go together is read from the full model's confusion on the training data: classes it
confuses with each other land in the same fragment, where the fragment can still tell them apart,
so the merge loses least (:func:`group_classes`). Fragments are trained jointly by distillation
from the full model's logits (Hinton et al.: KL at a temperature) plus cross-entropy on the merged
output (:func:`train_fragments`).
"""

from __future__ import annotations

import copy
import operator
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import torch
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp
from tqdm import tqdm

from device_runtime.bundle import CUT, LOGITS
from exporter._datasets import ImageSet
from exporter._graph import CutPoint, TracedModel, get_cut_point, split_at
from exporter._rate import distillation_loss
from splitedge.errors import CutPointError, ExportError

__all__ = [
    "FragmentTraining", "Merged", "SemanticModel", "SemanticOptions", "SemanticParts", "check_fragment_count",
    "confusion_matrix", "default_cut", "group_classes", "kept_confusion", "make_semantic", "narrow_tail", "parameters",
    "train_fragments",
]

_LAYERS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)  # layers whose output width is chosen
_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)  # layers whose width follows their input
_LAZY_CONV = {nn.Conv1d: nn.LazyConv1d, nn.Conv2d: nn.LazyConv2d, nn.Conv3d: nn.LazyConv3d}
_LAZY_NORM = {nn.BatchNorm1d: nn.LazyBatchNorm1d, nn.BatchNorm2d: nn.LazyBatchNorm2d, nn.BatchNorm3d: nn.LazyBatchNorm3d}
#: Operations whose two tensor operands must have the same channel width (a residual sum, a gate).
_ELEMENTWISE = {operator.add, operator.iadd, operator.mul, operator.imul, operator.sub, operator.truediv,
                torch.add, torch.mul, torch.sub, torch.div, "add", "add_", "mul", "mul_", "sub", "div"}


@dataclass(frozen=True)
class FragmentTraining:
    """How the fragments are trained: Adam on KL(teacher ‖ merged) at ``temperature`` (scaled by T²,
    weight ``distillation``) plus cross-entropy of the merged logits (weight ``1 - distillation``)."""

    # Measured on Fashion-MNIST at width 0.5, 10,000 images, these 2 epochs: fmnist_vgg trained 3 epochs
    # (0.9061 top-1) cut at _17 gave 0.9049 (K=2) and 0.9107 (K=5); fmnist_resnet (0.8977) cut at
    # _5_relu 0.8846 and 0.8854 (tests/exporter/test_semantic.py).
    epochs: int = 2
    batch_size: int = 128
    lr: float = 2e-3
    temperature: float = 4.0
    distillation: float = 0.5
    seed: int = 0


@dataclass(frozen=True)
class SemanticOptions:
    """``split-export build --semantic K``: where to cut, how narrow, what to train on."""

    fragments: int  # K, 2..number of labels
    train_data: str
    test_data: str | None = None
    cut: str | None = None  # default: :func:`default_cut`
    width: float = 0.5  # each fragment's channel widths, as a fraction of the tail's
    train_images: int | None = 10_000  # at most this many training images (stratified, seeded); None: all
    training: FragmentTraining = FragmentTraining()


def default_cut(cuts: Sequence[CutPoint]) -> CutPoint:
    """The shallowest compressive bottleneck (DSC Eq. 3): the board sends less than the input and
    than at every earlier cut, and the fragments get as much of the network as such a cut leaves."""
    chosen = next((c for c in cuts if c.compressive), None)
    if chosen is None:
        raise CutPointError("the model has no natural bottleneck to cut a semantic split at; name one with --cut "
                            "(see `split-export points`)")
    return chosen


def check_fragment_count(fragments: int, labels: int) -> None:
    """K from 2 (one fragment is the tail) to one class per fragment."""
    if not 2 <= fragments <= labels:
        raise ExportError(f"--semantic {fragments}: a semantic split has 2 to {labels} fragments "
                          f"(one group of classes each; the model has {labels} labels)")


def confusion_matrix(predicted: np.ndarray, labels: np.ndarray, classes: int) -> np.ndarray:
    """``C[i, j]``: images of class i predicted as j."""
    return np.bincount(labels * classes + predicted, minlength=classes * classes).reshape(classes, classes)


def group_classes(confusion: np.ndarray, groups: int) -> tuple[tuple[int, ...], ...]:
    """``groups`` disjoint groups covering every class, sizes differing by at most one, holding as much
    of the model's confusion inside groups as a greedy start and pairwise swaps find; deterministic.

    Affinity is the symmetric confusion rate ``S = R + R^T`` (R: confusion row-normalised, diagonal
    zeroed), so a rare class counts as much as a common one. Groups are filled largest first, each
    seeded with the most confused pair left and grown by the class most confused with it; then a
    class of one group and a class of another swap while that keeps more confusion inside groups
    (Kernighan-Lin; sizes never change). Groups are returned sorted, each in label order.
    """
    n = len(confusion)
    counts = confusion.sum(1, keepdims=True).astype(np.float64)
    rate = confusion / np.maximum(counts, 1)
    np.fill_diagonal(rate, 0.0)
    affinity = rate + rate.T
    sizes = [n // groups + (1 if g < n % groups else 0) for g in range(groups)]
    left = list(range(n))
    members: list[list[int]] = []
    for size in sizes:
        block = affinity[np.ix_(left, left)] - np.diag(np.full(len(left), np.inf))  # a pair is two classes
        if size == 1 or len(left) == 1:
            group = [left[0]]
        else:
            i, j = np.unravel_index(np.argmax(block), block.shape)
            group = [left[i], left[j]]
        while len(group) < size:
            rest = [c for c in left if c not in group]
            group.append(rest[int(np.argmax(affinity[np.ix_(rest, group)].sum(1)))])
        members.append(group)
        left = [c for c in left if c not in group]
    assignment = np.empty(n, dtype=np.int64)
    for g, group in enumerate(members):
        assignment[group] = g
    for _ in range(10 * n):  # each swap strictly increases the confusion kept: a few passes at most
        # (n, groups): each class's confusion with each group, O(n^2) whatever the number of groups
        to_group = np.stack([affinity[:, assignment == g].sum(1) for g in range(groups)], 1)
        own = to_group[np.arange(n), assignment]
        moved = to_group[:, assignment] - own[:, None]  # [a, b]: a's gain from joining b's group
        gain = moved + moved.T - 2 * affinity
        gain[assignment[:, None] == assignment[None, :]] = 0.0
        a, b = np.unravel_index(np.argmax(gain), gain.shape)
        if gain[a, b] <= 1e-12:
            break
        assignment[a], assignment[b] = assignment[b], assignment[a]
    return tuple(sorted(tuple(int(c) for c in np.flatnonzero(assignment == g)) for g in range(groups)))


def kept_confusion(confusion: np.ndarray, groups: Sequence[Sequence[int]]) -> float:
    """The share of the model's confusions (errors) between classes of one group: 1.0 when every
    error the model makes is between classes that share a fragment."""
    off = confusion.astype(np.float64).copy()
    np.fill_diagonal(off, 0.0)
    total = off.sum()
    inside = sum(off[np.ix_(g, g)].sum() for g in groups)
    return 1.0 if total == 0 else float(inside / total)


def _narrow(channels: int, width: float) -> int:
    return max(1, round(channels * width))


def narrow_tail(tail: fx.GraphModule, example: torch.Tensor, width: float, outputs: int, seed: int = 0,
                where: str = "the tail") -> fx.GraphModule:
    """A narrow copy of ``tail`` (a traced tail from :func:`exporter._graph.split_at`), freshly
    initialised: every Conv/Linear layer with ``width`` of its output channels (a depthwise one with
    its groups scaled alike), every BatchNorm as wide as its input (lazy modules read the input
    widths on the first run, residual sums included), the layers producing the logits with
    ``outputs`` channels. A sum or product of a narrowed tensor and the full-width cut gets a 1x1
    projection of the cut, as ResNet's shortcut does where widths change. Raises
    :class:`ExportError` naming the layer that cannot be narrowed."""
    gm = copy.deepcopy(tail)
    ShapeProp(gm).propagate(example)  # the tail's own widths, for projections
    nodes = list(gm.graph.nodes)
    logits_layers = _logits_layers(gm, nodes, where)
    narrowed: set[fx.Node] = set()  # nodes whose output channels are narrowed (the rest are the cut's width)
    projections = 0
    for node in nodes:
        if node.op == "get_attr" and isinstance(_attr(gm, str(node.target)), nn.Parameter):
            raise ExportError(f"cannot narrow {where}: {node.name} uses the weight {node.target} directly, not "
                              "through a layer; semantic splits narrow Conv, Linear and BatchNorm layers")
        inputs = [a for a in node.all_input_nodes if "tensor_meta" in a.meta]
        if node.op == "call_module":
            module = gm.get_submodule(str(node.target))
            full_in = not any(a in narrowed for a in inputs)
            lazy = _lazy(module, node, full_in, width, outputs if node in logits_layers else None, where)
            if lazy is not None:
                gm.add_submodule(str(node.target), lazy)
                if node in logits_layers or not (full_in and _grouped(module)):
                    narrowed.add(node)
                continue
        if any(a in narrowed for a in inputs):
            narrowed.add(node)
        target = node.target if node.op in ("call_function", "call_method") else None
        if target in _ELEMENTWISE and len(inputs) == 2 and (inputs[0] in narrowed) != (inputs[1] in narrowed):
            full = next(a for a in inputs if a not in narrowed)
            shape = full.meta["tensor_meta"].shape
            if len(shape) < 2 or shape[1] == 1:
                continue  # a scalar per sample, or one channel broadcast: any width takes it
            channels = _narrow(node.meta["tensor_meta"].shape[1], width)
            projection = (nn.LazyLinear(channels) if len(shape) == 2
                          else _LAZY_CONV[{3: nn.Conv1d, 4: nn.Conv2d, 5: nn.Conv3d}[len(shape)]](channels, 1))
            name = f"semantic_projection_{projections}"
            projections += 1
            gm.add_submodule(name, projection)
            with gm.graph.inserting_before(node):
                projected = gm.graph.call_module(name, (full,))
            node.replace_input_with(full, projected)
    gm.graph.lint()
    gm.recompile()
    gm.eval()
    torch.manual_seed(seed)
    out = _Run(gm, where, width).run(example)  # materialises the lazy modules (their weights drawn from seed)
    if tuple(out.shape) != (len(example), outputs):
        raise ExportError(f"cannot narrow {where}: its narrow copy outputs {tuple(out.shape[1:])}, "
                          f"expected ({outputs},) logits")
    return gm.eval()


def _logits_layers(gm: fx.GraphModule, nodes: list[fx.Node], where: str) -> set[fx.Node]:
    """The Conv/Linear layers whose outputs reach the logits through no other such layer."""
    (output,) = [n for n in nodes if n.op == "output"]
    if not isinstance(output.args[0], fx.Node):
        raise ExportError(f"cannot narrow {where}: it returns {type(output.args[0]).__name__}, not one logits tensor")
    found, todo, seen = set(), [output.args[0]], set()
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        if node.op == "placeholder":
            raise ExportError(f"cannot narrow {where}: the cut reaches the logits through no Conv or Linear layer")
        if node.op == "call_module" and isinstance(gm.get_submodule(str(node.target)), _LAYERS):
            found.add(node)
            continue
        todo.extend(node.all_input_nodes)
    return found


def _grouped(module: nn.Module) -> bool:
    return isinstance(module, _LAYERS[:3]) and module.groups > 1


def _lazy(module: nn.Module, node: fx.Node, full_in: bool, width: float, outputs: int | None,
          where: str) -> nn.Module | None:
    """The lazy, narrow stand-in of one layer; None for a layer without weights (ReLU, pooling)."""
    if isinstance(module, nn.Linear):
        return nn.LazyLinear(outputs or _narrow(module.out_features, width), bias=module.bias is not None)
    if isinstance(module, _LAYERS):
        groups, out = module.groups, outputs or _narrow(module.out_channels, width)
        if groups > 1:
            if outputs is not None:
                raise ExportError(f"cannot narrow {where}: layer {node.target} ({type(module).__name__}, "
                                  f"groups={groups}) makes the logits; a grouped logits layer cannot take a group's width")
            if full_in:
                out = module.out_channels  # on the cut's full width: kept as it is
            elif groups == module.in_channels:
                groups = _narrow(groups, width)  # depthwise stays depthwise
        return _LAZY_CONV[type(module)](
            out, module.kernel_size, module.stride, module.padding, module.dilation, groups, module.bias is not None,
            module.padding_mode)
    if isinstance(module, _NORMS):
        return _LAZY_NORM[type(module)](module.eps, module.momentum, module.affine, module.track_running_stats)
    if any(True for _ in module.parameters()):
        raise ExportError(f"cannot narrow {where}: layer {node.target} ({type(module).__name__}) has weights of a "
                          "width semantic splits cannot scale (they narrow Conv, Linear and BatchNorm layers)")
    return None


class _Run(fx.Interpreter):
    """Runs the narrow copy node by node, so a failure names the layer it happened in."""

    def __init__(self, gm: fx.GraphModule, where: str, width: float) -> None:
        super().__init__(gm)
        self.where, self.width = where, width

    def run_node(self, n: fx.Node):
        try:
            with torch.no_grad():
                return super().run_node(n)
        except Exception as exc:  # whatever the layer raises on the narrowed widths
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ExportError(f"cannot narrow {self.where}: layer {n.name} fails at width {self.width:g}: {first}") from exc


def _attr(gm: fx.GraphModule, target: str) -> object:
    value: object = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _label_order(groups: Sequence[Sequence[int]]) -> torch.Tensor:
    """Indices that put the fragments' concatenated logits into label order."""
    return torch.from_numpy(np.argsort(np.concatenate([np.asarray(g) for g in groups]), kind="stable"))


class SemanticModel(nn.Module):
    """head ‖ link ‖ fragments side by side → logits scattered into label order: what the board and
    the hosts compute together, and what the exported files are validated against."""

    def __init__(self, head: nn.Module, fragments: Sequence[nn.Module], groups: Sequence[Sequence[int]]) -> None:
        super().__init__()
        self.head, self.fragments = head, nn.ModuleList(fragments)
        self.groups = tuple(tuple(g) for g in groups)
        self.register_buffer("order", _label_order(self.groups), persistent=False)

    def merge(self, cut: torch.Tensor) -> torch.Tensor:
        """The fragments on ``cut`` (B, *cut shape) → (B, labels) in label order."""
        return torch.cat([f(cut) for f in self.fragments], 1)[:, self.order]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.merge(self.head(x))


class Merged:
    """The hosts' fragments behind the validator's :class:`~exporter._validate.Runner` interface:
    ``cut`` in, each fragment run on it, their logits scattered into label order as the board does."""

    input_names, output_names = (CUT,), (LOGITS,)

    def __init__(self, fragments: Sequence, groups: Sequence[Sequence[int]]) -> None:
        self.fragments, self.order = list(fragments), _label_order(groups).numpy()

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        parts = [next(iter(f({f.input_names[0]: feeds[CUT]}).values())) for f in self.fragments]
        return {LOGITS: np.concatenate(parts, 1)[:, self.order]}


@dataclass(frozen=True)
class SemanticParts:
    """What :func:`make_semantic` made: the trained semantic model, the tail it stands beside (for
    the layer split's accuracy), the cut, and how the classes were grouped, in words."""

    model: SemanticModel
    tail: nn.Module
    cut: CutPoint
    grouping: str


def train_fragments(model: SemanticModel, data: ImageSet, teacher: torch.Tensor,
                    training: FragmentTraining = FragmentTraining(), progress: bool = True) -> SemanticModel:
    """Train the fragments jointly, the head frozen in eval mode: distillation from ``teacher`` (the
    full model's logits on ``data``) plus cross-entropy on the merged logits. Returns the model in eval mode."""
    torch.manual_seed(training.seed)
    rng = np.random.default_rng(training.seed)
    x, y = torch.from_numpy(data.x), torch.from_numpy(data.y)
    model.eval()
    model.fragments.train()
    optimiser = torch.optim.Adam(model.fragments.parameters(), lr=training.lr)
    t = training.temperature
    for epoch in range(training.epochs):
        order = torch.from_numpy(rng.permutation(len(data)))
        starts = range(0, len(data), training.batch_size)
        for start in tqdm(starts, desc=f"fragments {epoch + 1}/{training.epochs}", unit="batch", disable=not progress):
            idx = order[start : start + training.batch_size]
            with torch.no_grad():
                cut = model.head(x[idx])
            logits = model.merge(cut)
            optimiser.zero_grad()
            distillation_loss(logits, teacher[idx], y[idx], t, training.distillation).backward()
            optimiser.step()
    return model.eval()


@torch.no_grad()
def _logits(head: nn.Module, tail: nn.Module, x: np.ndarray, batch: int = 512) -> torch.Tensor:
    return torch.cat([tail(head(torch.from_numpy(x[i : i + batch]))) for i in range(0, len(x), batch)])


def make_semantic(traced: TracedModel, cuts: Sequence[CutPoint], options: SemanticOptions, train: ImageSet,
                  progress: bool = True) -> SemanticParts:
    """Cut ``traced`` at ``options.cut`` (or :func:`default_cut`), group the classes by the full
    model's confusion on ``train``, make K narrow fragments of the tail and train them."""
    cut = default_cut(cuts) if options.cut is None else get_cut_point(cuts, options.cut)
    head, tail = split_at(traced, cut.id)
    example = torch.zeros((2, *cut.shape))
    with torch.no_grad():
        labels = int(tail(example).shape[1])
    check_fragment_count(options.fragments, labels)
    if not 0 < options.width <= 1:
        raise ExportError(f"--width {options.width:g}: a fragment's width is a fraction of the tail's, in (0, 1]")
    teacher = _logits(head, tail, train.x)
    confusion = confusion_matrix(teacher.argmax(1).numpy(), train.y, labels)
    groups = group_classes(confusion, options.fragments)
    sizes = sorted({len(g) for g in groups}, reverse=True)
    grouping = (f"confusion of the full model on {len(train):,} training images, {train.source}; "
                f"{options.fragments} groups of {' or '.join(map(str, sizes))} classes, seeded with the most confused "
                f"pair left and refined by swaps; {kept_confusion(confusion, groups):.0%} of its confusions are "
                f"within a group; fragments at width {options.width:g}, distilled from the full model "
                f"(T={options.training.temperature:g}, {options.training.epochs} epochs)")
    fragments = [narrow_tail(tail, example, options.width, len(g), seed=options.training.seed + k,
                             where=f"the tail after {cut.id}") for k, g in enumerate(groups)]
    model = SemanticModel(copy.deepcopy(head), fragments, groups)
    for p in model.head.parameters():
        p.requires_grad_(False)  # the trunk is the deployed head, shared with the layer split
    train_fragments(model, train, teacher, options.training, progress)
    return SemanticParts(model=model, tail=tail, cut=cut, grouping=grouping)


def parameters(module: nn.Module) -> int:
    """A module's parameter count (a fragment's, against its tail's)."""
    return sum(p.numel() for p in module.parameters())

