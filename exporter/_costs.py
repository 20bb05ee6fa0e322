"""What each side of a cut costs: parameters to hold and multiply-accumulates to run.

Counted from the traced graph and the shapes ShapeProp recorded, so any traceable model is
covered. MACs come from the layers that dominate CNN compute: convolutions (dense,
grouped, depthwise) and fully connected layers, as modules or as ``F.linear``/``matmul``
calls. Element-wise ops, pooling and normalisation are counted as zero: they are a few
percent of a CNN's arithmetic and would drown the table in small numbers.
"""

from __future__ import annotations

import math

import torch
from torch import fx
from torch.fx.passes.shape_prop import TensorMetadata

from exporter._graph import TracedModel

__all__ = ["node_macs", "cumulative_macs", "total_parameters"]


def _numel(node: fx.Node) -> int:
    meta = node.meta.get("tensor_meta")
    return math.prod(meta.shape[1:]) if isinstance(meta, TensorMetadata) else 0


def node_macs(gm: fx.GraphModule, node: fx.Node) -> int:
    """Multiply-accumulates of one node for one sample."""
    if node.op == "call_module":
        module = gm.get_submodule(str(node.target))
        if isinstance(module, torch.nn.modules.conv._ConvNd):
            # each output element: in_channels / groups * kernel elements
            return _numel(node) * (module.in_channels // module.groups) * math.prod(module.kernel_size)
        if isinstance(module, torch.nn.Linear):
            return _numel(node) * module.in_features
    if node.op == "call_function" and node.target in (torch.nn.functional.linear, torch.matmul, torch.mm):
        first = node.args[0]
        meta = first.meta.get("tensor_meta") if isinstance(first, fx.Node) else None
        if isinstance(meta, TensorMetadata):
            return _numel(node) * int(meta.shape[-1])
    return 0


def cumulative_macs(traced: TracedModel) -> dict[str, int]:
    """node name → MACs of every node up to and including it (the head's cost if cut there)."""
    total, out = 0, {}
    for node in traced.module.graph.nodes:
        total += node_macs(traced.module, node)
        out[node.name] = total
    return out


def total_parameters(traced: TracedModel) -> int:
    return sum(p.numel() for p in traced.module.parameters())
