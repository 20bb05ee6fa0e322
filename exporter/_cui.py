"""CUmulated Importance (CUI) curves of I-SPLIT, at every cut point, in one pass per batch.

I-SPLIT (Cunico et al., "I-SPLIT: Deep Network Interpretability for Split Computing"),
Sec. III-A: for image j, class c and layer i,

- Eq. 1: ``alpha_k = 1/Z * sum_{n,m} d y^c / d F^k_{n,m}``  (Grad-CAM's channel weights),
- Eq. 2: ``L = ReLU(sum_k alpha_k F^k)``                  (the class activation map at layer i),
- ``CUI_{i,j,c} = sum_{n,m} L_{n,m}``, then averaged over images (all, per class, or a subset).

All cut points of a batch come from **one forward and one backward pass**: the traced graph
is given extra outputs (the feature map at every cut point) and ``torch.autograd.grad`` takes
the gradient of the target scores with respect to all of them at once. Parameters are
frozen, so no weight gradients are computed. Samples are independent in eval mode, so the
gradient of the summed batch scores is each sample's own gradient.

Choices the paper leaves open, made here and recorded in every report (:class:`CuiChoices`):
the score ``y^c`` is the pre-softmax logit (as in Grad-CAM; ``softmax`` is offered);
``Z`` in Eq. 1 is the number of spatial positions (Grad-CAM's; the paper writes ``1/z``
without defining it); ReLU is applied to the map before summing (Eq. 2 as written); the
map is *summed*, not averaged, over positions (Sec. III-A's text; Fig. 2's caption says
"average", which would divide by the map size and favour deep, small layers); curves are
not normalised across layers. A tensor without spatial dimensions (after pooling or
flattening) is a 1x1 map.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass
from typing import Literal, Sequence

import numpy as np
import torch
from torch import fx
from tqdm import tqdm

from exporter._graph import CutPoint, TracedModel

__all__ = ["CuiChoices", "CuiProbe", "CuiRun", "cui_per_image", "local_maxima", "probe_module"]


@dataclass(frozen=True)
class CuiChoices:
    """Every choice I-SPLIT leaves open, as data, so a report says how its numbers were made."""

    score: Literal["logit", "softmax"] = "logit"
    target: Literal["label", "predicted"] = "label"
    gradient_pooling: str = "mean over spatial positions (Z = n*m, Grad-CAM)"
    relu: str = "on the map, before summing (Eq. 2)"
    reduction: str = "sum over the map (Sec. III-A)"
    normalisation: str = "none across layers"
    aggregation: str = "mean over images"

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class CuiRun:
    cui: np.ndarray  # (N, cut points): CUI of each image at each cut point
    targets: np.ndarray  # (N,) the class each image's CUI was computed for
    predictions: np.ndarray  # (N,) the model's top-1, for the report's accuracy


def probe_module(traced: TracedModel, cut_ids: Sequence[str]) -> fx.GraphModule:
    """A copy of the traced model returning ``(logits, (feature at each cut, ...))``.

    In-place operations are turned off in the copy: an in-place ReLU after a cut point would
    overwrite the very feature map whose gradient is wanted.
    """
    gm = copy.deepcopy(traced.module)
    for module in gm.modules():
        if hasattr(module, "inplace"):
            module.inplace = False
    nodes = {node.name: node for node in gm.graph.nodes}
    for node in nodes.values():
        if node.op in ("call_function", "call_method") and node.kwargs.get("inplace"):
            node.kwargs = {**node.kwargs, "inplace": False}
    (output,) = [n for n in nodes.values() if n.op == "output"]
    output.args = ((output.args[0], tuple(nodes[c] for c in cut_ids)),)
    gm.recompile()
    for parameter in gm.parameters():
        parameter.requires_grad_(False)
    return gm.eval()


def _batch_cui(features: Sequence[torch.Tensor], grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """(B, L) CUI of one batch: Eq. 1 and 2 at every cut point, summed over each map.

    The channel-weighted sum of Eq. 2 is a batched matrix product, (B, 1, K) @ (B, K, S):
    no (B, K, S) temporary, which for VGG16's first layers would be 100 MB per batch of 8.
    """
    columns = []
    for feature, grad in zip(features, grads):
        batch, channels = feature.shape[0], feature.shape[1] if feature.dim() > 1 else 1
        f = feature.reshape(batch, channels, -1)  # (B, K, S); S = 1 without spatial dims
        alpha = grad.reshape(batch, channels, -1).mean(dim=2, keepdim=True)  # Eq. 1, (B, K, 1)
        cam = torch.relu(torch.bmm(alpha.transpose(1, 2), f))  # Eq. 2, (B, 1, S)
        columns.append(cam.sum(dim=(1, 2)))
    return torch.stack(columns, dim=1)


class CuiProbe:
    """The traced model with every cut point as an extra output: CUI of a batch in one pass."""

    def __init__(self, traced: TracedModel, cuts: Sequence[CutPoint], choices: CuiChoices = CuiChoices()) -> None:
        self.module = probe_module(traced, [c.id for c in cuts])
        self.choices = choices

    def __call__(self, x: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, cut points) CUI, the target classes and the predictions of one batch."""
        logits, features = self.module(x.requires_grad_(True))
        predicted = logits.argmax(dim=1)
        target = predicted if self.choices.target == "predicted" else labels
        scores = logits.softmax(dim=1) if self.choices.score == "softmax" else logits
        score = scores.gather(1, target[:, None]).sum()
        grads = torch.autograd.grad(score, features)  # the one backward pass for every cut point
        with torch.no_grad():
            return _batch_cui(features, grads), target, predicted


def cui_per_image(
    traced: TracedModel,
    cuts: Sequence[CutPoint],
    x: np.ndarray,
    labels: np.ndarray,
    choices: CuiChoices = CuiChoices(),
    batch_size: int = 32,
    progress: bool = True,
) -> CuiRun:
    """CUI of every image at every cut point, for the label or the prediction (``choices.target``)."""
    probe = CuiProbe(traced, cuts, choices)
    cui = np.empty((len(x), len(cuts)), dtype=np.float64)
    targets = np.empty(len(x), dtype=np.int64)
    predictions = np.empty(len(x), dtype=np.int64)
    for start in tqdm(range(0, len(x), batch_size), desc="CUI", unit="batch", disable=not progress):
        end = min(start + batch_size, len(x))
        xb = torch.from_numpy(np.ascontiguousarray(x[start:end]))
        batch_cui, target, predicted = probe(xb, torch.from_numpy(labels[start:end]).long())
        cui[start:end] = batch_cui.double().numpy()
        targets[start:end] = target.numpy()
        predictions[start:end] = predicted.numpy()
    return CuiRun(cui, targets, predictions)


def local_maxima(curve: Sequence[float]) -> list[int]:
    """Indices of I-SPLIT's candidate cuts: points higher than both neighbours (one at the ends).

    A plateau counts once, at its first point.
    """
    values = np.asarray(curve, dtype=np.float64)
    out = []
    for i, v in enumerate(values):
        left = values[i - 1] if i > 0 else -np.inf
        right = values[i + 1] if i + 1 < len(values) else -np.inf
        if v > left and v >= right and (i + 1 == len(values) or v > right or _plateau_falls(values, i)):
            out.append(i)
    return out


def _plateau_falls(values: np.ndarray, i: int) -> bool:
    """A run of equal values starting at ``i`` is a maximum if what follows it is lower."""
    j = i
    while j + 1 < len(values) and values[j + 1] == values[i]:
        j += 1
    return j + 1 == len(values) or values[j + 1] < values[i]
