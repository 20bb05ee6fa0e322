"""The block-level view DSC counts bottlenecks at: cut points grouped into the model's blocks.

DSC (Bakhtiarnia et al.) counts natural and compressive bottlenecks between blocks, not
between operators: inside a block (a residual block, an inverted residual, a conv-norm-act
unit) a cut is possible in the graph but is not what the paper calls a layer. Counting
operators inflates the numbers (EfficientNet-B0: 56 natural operator cuts, far fewer blocks).

A model's blocks are its top-level children, with plain containers (``nn.Sequential``,
``nn.ModuleList``, ``nn.ModuleDict`` themselves, not subclasses such as torchvision's
``Conv2dNormActivation``) opened one level at a time: ``features`` of MobileNetV2 gives
``features.0`` … ``features.18``; ResNet's ``layer1`` gives its residual blocks ``layer1.0``,
``layer1.1``. A stage of repeated blocks is opened too, wherever it is: a ``Sequential`` subclass
whose children are all of one type (RegNet's ``AnyStage``: its ``ResBottleneckBlock``\ s), and a
module holding a plain container of such blocks (a vision transformer's ``encoder``, whose
``layers`` are its encoder layers: each one a block, as DSC would count a layer). A cut point belongs to the block whose module holds its node (functional calls
at the top level are blocks of their own), and is a block-level cut when it is the last cut
of its block: the block's output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import fx

__all__ = ["BlockCounts", "block_of", "block_units", "count_blocks"]

_CONTAINERS = (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)


def block_units(model: torch.nn.Module) -> list[str]:
    """The qualified names of ``model``'s blocks, in definition order (see the module docstring)."""
    units: list[str] = []

    def visit(prefix: str, module: torch.nn.Module) -> None:
        for name, child in module.named_children():
            path = f"{prefix}{name}"
            if type(child) in _CONTAINERS or (isinstance(child, _CONTAINERS) and _stage(child)) or any(
                    type(c) in _CONTAINERS and _stage(c) for c in child.children()):
                visit(f"{path}.", child)
            else:
                units.append(path)

    visit("", model)
    return units


def _stage(module: torch.nn.Module) -> bool:
    """A run of repeated blocks: two children or more, all of one type."""
    children = list(module.children())
    return len(children) >= 2 and len({type(c) for c in children}) == 1


def block_of(node: fx.Node, units: Sequence[str]) -> str:
    """The block holding ``node``: the unit that is its module or encloses it, else the node's own name."""
    stack = node.meta.get("nn_module_stack") or {}
    paths = list(stack)
    if node.op == "call_module":
        paths.append(str(node.target))
    for path in reversed(paths):  # innermost first
        path = str(path).split("@")[0]
        for unit in units:
            if path == unit or path.startswith(unit + "."):
                return unit
    return node.name


@dataclass(frozen=True)
class BlockCounts:
    """DSC's counts at operator and at block level."""

    blocks: int
    cut_points: int
    natural: int
    compressive: int
    block_cut_points: int
    block_natural: int
    block_compressive: int

    def summary(self) -> str:
        return (f"{self.cut_points} cut points: {self.natural} natural, {self.compressive} compressive; "
                f"at block level ({self.blocks} blocks, as DSC counts): {self.block_cut_points} cut points, "
                f"{self.block_natural} natural, {self.block_compressive} compressive")


def count_blocks(cuts: Sequence) -> BlockCounts:
    """Counts over ``cuts`` (:class:`exporter._graph.CutPoint` with their block fields set); the
    blocks are those the cuts fall in (a block with no valid cut inside or after it is not counted)."""
    level = [c for c in cuts if c.block_output]
    return BlockCounts(
        blocks=len({c.block for c in cuts}), cut_points=len(cuts), natural=sum(c.natural for c in cuts),
        compressive=sum(c.compressive for c in cuts), block_cut_points=len(level),
        block_natural=sum(c.natural for c in level), block_compressive=sum(c.block_compressive for c in level),
    )
