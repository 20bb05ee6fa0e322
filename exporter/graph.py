"""Find every place a traced network can be cut in two, and cut it there.

A cut after node *i* of the traced graph is valid when exactly one value computed from
the input is *live* there: produced at or before *i* and used after it. That one value is
the tensor that crosses the link; any second live value (the identity of a residual
block, the input of a squeeze-excitation ``mul``) would have to cross too, so cuts inside
such blocks are not offered. Parameters and buffers (``get_attr``) are constants that
both halves carry, never live values.

The analysis follows DSC (Bakhtiarnia et al., "Dynamic Split Computing for Efficient
Deep Edge Intelligence"): the compression ratio ``c_l = |h_l| / |x|``, natural
bottlenecks ``c_l < 1`` and compressive bottlenecks (Eq. 3).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Sequence

import torch
from torch import fx
from torch.fx.passes.shape_prop import ShapeProp, TensorMetadata

from device_runtime.bundle import CUT
from splitedge.errors import CutPointError

__all__ = ["CutPoint", "TracedModel", "trace", "find_cut_points", "get_cut_point", "split_at"]


@dataclass(frozen=True)
class TracedModel:
    """A network traced with torch.fx, with every node's output shape recorded (batch 1)."""

    module: fx.GraphModule
    input_shape: tuple[int, ...]  # per sample, e.g. (3, 224, 224)
    input_dtype: torch.dtype

    @property
    def input_bytes(self) -> int:
        return _numel(self.input_shape) * _itemsize(self.input_dtype)


@dataclass(frozen=True)
class CutPoint:
    """One valid cut: the head ends with node ``id`` and its output is all that crosses."""

    id: str  # fx node name, e.g. "features_14"
    position: int  # order of the node in the traced graph; larger = deeper
    op: str  # what the node computes, e.g. "Conv2d" or "add"
    shape: tuple[int, ...]  # per sample, batch dimension excluded
    dtype: str
    bytes_per_sample: int
    compression_ratio: float  # DSC: c_l = |h_l| / |x|, in bytes
    natural: bool  # DSC: c_l < 1
    compressive: bool  # DSC Eq. 3: c_l < 1 and smaller than every earlier cut's
    head_parameters: int  # parameters the board must hold for this head


def trace(model: torch.nn.Module, input_shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> TracedModel:
    """Trace ``model`` (in eval mode) with torch.fx and record shapes with one batch-1 sample.

    Raises :class:`CutPointError` when the model has data-dependent control flow that
    symbolic tracing cannot follow: without a graph there are no cut points to offer.
    """
    model = model.eval()
    try:
        gm = fx.symbolic_trace(model)
    except Exception as exc:  # fx raises TraceError, TypeError, NotImplementedError... for untraceable code
        raise CutPointError(f"cannot trace {type(model).__name__} with torch.fx: {exc}") from exc
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != 1:
        raise CutPointError(f"a splittable model takes exactly one input tensor; {type(model).__name__} takes {len(placeholders)}")
    try:
        with torch.no_grad():
            ShapeProp(gm).propagate(torch.zeros((1, *input_shape), dtype=dtype))
    except Exception as exc:  # whatever the model raises on a wrong input shape
        raise CutPointError(f"{type(model).__name__} does not run on an input of shape {(1, *input_shape)}: {exc}") from exc
    return TracedModel(module=gm, input_shape=tuple(input_shape), input_dtype=dtype)


def find_cut_points(traced: TracedModel) -> list[CutPoint]:
    """Every valid cut of the graph, in graph order, with its DSC analysis.

    Excluded: the input itself (a cut there is full offload) and the node producing the
    model's output (a cut there is local-only inference); the bundle has both already.
    """
    gm = traced.module
    nodes = list(gm.graph.nodes)
    position = {node: i for i, node in enumerate(nodes)}
    dynamic = _input_dependent(nodes)
    # last_use[n]: position of the last node reading n; a value is live after i while last_use > i.
    last_use = {n: max((position[u] for u in n.users), default=position[n]) for n in dynamic}
    output_node = nodes[-1]
    final_values = set(output_node.all_input_nodes)

    cuts: list[CutPoint] = []
    best_ratio = float("inf")
    live: set[fx.Node] = set()
    head_parameters = 0
    counted: set[int] = set()  # a module or tensor used twice is held once
    for i, node in enumerate(nodes):
        head_parameters += _new_parameters(gm, node, counted)
        if node in dynamic:
            live.add(node)
        live = {n for n in live if last_use[n] > i}
        if node.op in ("placeholder", "output") or node in final_values or live != {node}:
            continue
        meta = node.meta.get("tensor_meta")
        if not isinstance(meta, TensorMetadata):
            continue  # a tuple, a size or a Python scalar cannot be sent as one tensor
        shape = tuple(meta.shape[1:])
        nbytes = _numel(shape) * _itemsize(meta.dtype)
        ratio = nbytes / traced.input_bytes
        natural = ratio < 1
        # Eq. 3: c_j < 1 and c_j < c_i for every earlier i. Earlier non-natural cuts have
        # c_i >= 1 > c_j, so a strict running minimum over all cuts is the same test.
        compressive = natural and ratio < best_ratio
        best_ratio = min(best_ratio, ratio)
        cuts.append(
            CutPoint(
                id=node.name,
                position=i,
                op=_describe(gm, node),
                shape=shape,
                dtype=str(meta.dtype).removeprefix("torch."),
                bytes_per_sample=nbytes,
                compression_ratio=ratio,
                natural=natural,
                compressive=compressive,
                head_parameters=head_parameters,
            )
        )
    return cuts


def split_at(traced: TracedModel, cut_id: str) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Cut the traced graph after node ``cut_id``: ``tail(head(x)) == model(x)``.

    The head keeps every node up to the cut and returns the cut value; the tail starts
    from a placeholder named ``cut`` that stands for it. Constants (``get_attr`` and what
    is computed from them alone) are copied into whichever half uses them.
    """
    cut_pos = get_cut_point(find_cut_points(traced), cut_id).position
    gm = traced.module
    nodes = list(gm.graph.nodes)
    dynamic = _input_dependent(nodes)

    head_graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in nodes[: cut_pos + 1]:
        env[node] = head_graph.node_copy(node, env.__getitem__)
    head_graph.output(env[nodes[cut_pos]])

    tail_graph = fx.Graph()
    env = {nodes[cut_pos]: tail_graph.placeholder(CUT)}
    # Constants may be defined before the cut and used after it: copy them first.
    for node in nodes[:cut_pos]:
        if node not in dynamic and node.op != "placeholder":
            env[node] = tail_graph.node_copy(node, env.__getitem__)
    for node in nodes[cut_pos + 1 :]:
        env[node] = tail_graph.node_copy(node, env.__getitem__)

    return _module(gm, head_graph, "Head"), _module(gm, tail_graph, "Tail")


def get_cut_point(cuts: Sequence[CutPoint], cut_id: str) -> CutPoint:
    """The cut named ``cut_id``; a :class:`CutPointError` suggests near matches and lists the rest."""
    for cut in cuts:
        if cut.id == cut_id:
            return cut
    valid = [c.id for c in cuts]
    near = difflib.get_close_matches(cut_id, valid, n=3)
    hint = f"did you mean {', '.join(near)}? " if near else ""
    raise CutPointError(f"{cut_id!r} is not a valid cut point; {hint}valid cut points: {', '.join(valid)}")


def _module(root: fx.GraphModule, graph: fx.Graph, name: str) -> fx.GraphModule:
    module = fx.GraphModule(root, graph, class_name=f"{type(root).__name__}{name}")
    # Drop the constants only the other half uses, and the submodules they referenced, so
    # that a head does not carry the tail's weights (VGG16's classifier is 470 MB).
    module.graph.eliminate_dead_code()
    module.delete_all_unused_submodules()
    module.graph.lint()
    module.recompile()
    return module.eval()


def _input_dependent(nodes: list[fx.Node]) -> set[fx.Node]:
    """Nodes whose value depends on the input; the rest are constants of the model."""
    dynamic: set[fx.Node] = set()
    for node in nodes:
        if node.op == "placeholder" or any(arg in dynamic for arg in node.all_input_nodes):
            dynamic.add(node)
    return dynamic


def _describe(gm: fx.GraphModule, node: fx.Node) -> str:
    if node.op == "call_module":
        return type(gm.get_submodule(str(node.target))).__name__
    if node.op == "call_method":
        return f".{node.target}"
    return getattr(node.target, "__name__", str(node.target))


def _new_parameters(gm: fx.GraphModule, node: fx.Node, counted: set[int]) -> int:
    """Parameters ``node`` brings into the head that no earlier node brought."""
    if node.op == "call_module":
        tensors = list(gm.get_submodule(str(node.target)).parameters())
    elif node.op == "get_attr":
        value = _get_attr(gm, str(node.target))
        tensors = [value] if isinstance(value, torch.nn.Parameter) else []
    else:
        return 0
    fresh = [t for t in tensors if id(t) not in counted]
    counted.update(id(t) for t in fresh)
    return sum(t.numel() for t in fresh)


def _get_attr(gm: fx.GraphModule, target: str) -> object:
    value: object = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for dim in shape:
        count *= int(dim)
    return count


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()
