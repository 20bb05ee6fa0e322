"""Find every place a traced network can be cut in two, and cut it there.

A cut after node *i* of the traced graph is valid when exactly one value computed from
the input is *live* there: produced at or before *i* and used after it. That one value is
the tensor that crosses the link; any second live value (the identity of a residual
block, the input of a squeeze-excitation ``mul``) would have to cross too, so cuts inside
such blocks are not offered. Parameters and buffers (``get_attr``) are constants that
both halves carry, never live values.

Shapes are not tensors: a model that reads ``x.size(0)`` or ``x.shape[0]`` early and uses it
late (``x.view(bs, -1)``) would keep that int live across every cut in between. Before the
analysis, :func:`fold_shapes` replaces every value that is only a shape, a size or arithmetic
on them: by a constant where it is the same at every batch size, else by ``t.size(0) * a + b``
read from a tensor the using node already has, so nothing but one tensor crosses a cut. What
cannot be folded is named by :func:`cut_blockers`.

The analysis follows DSC (Bakhtiarnia et al., "Dynamic Split Computing for Efficient
Deep Edge Intelligence"): the compression ratio ``c_l = |h_l| / |x|``, natural
bottlenecks ``c_l < 1`` and compressive bottlenecks (Eq. 3).
"""

from __future__ import annotations

import dataclasses
import difflib
import operator
import re
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import fx
from torch.fx.passes.shape_prop import ShapeProp, TensorMetadata

from device_runtime import CUT
from exporter.blocks import block_of, block_units
from splitedge import CutPointError

__all__ = ["CutPoint", "TracedModel", "cut_blockers", "find_cut_points", "fold_shapes", "get_chain", "get_cut_point",
           "name_calls_by_module", "split_at", "split_chain", "trace"]

#: Batch sizes the model runs at to tell constants (same at all) from batch-dependent sizes.
_PROBE_BATCHES = (1, 2, 3)


@dataclass(frozen=True)
class TracedModel:
    """A network traced with torch.fx, with every node's output shape recorded (batch 1)."""

    module: fx.GraphModule
    input_shape: tuple[int, ...]  # per sample, e.g. (3, 224, 224)
    input_dtype: torch.dtype
    blocks: tuple[str, ...] = ()  # the model's blocks (exporter.blocks.block_units)

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
    block: str = ""  # the model's block holding the node (exporter.blocks), e.g. "features.14"
    block_output: bool = False  # the last cut of its block: a cut DSC counts
    block_compressive: bool = False  # Eq. 3 among block-level cuts only


def trace(model: torch.nn.Module, input_shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> TracedModel:
    """Trace ``model`` (in eval mode) with torch.fx and record shapes with one batch-1 sample.

    Raises :class:`CutPointError` when the model has data-dependent control flow that
    symbolic tracing cannot follow: without a graph there are no cut points to offer.
    """
    model = model.eval()
    try:
        tracer = _ShapeTracer(input_shape, dtype)
        graph = tracer.trace(model)
        gm = fx.GraphModule(tracer.root, graph, type(model).__name__)
    except CutPointError:
        raise
    except Exception as exc:  # fx raises TraceError, TypeError, NotImplementedError... for untraceable code
        raise CutPointError(f"cannot trace {type(model).__name__} with torch.fx: {exc}") from exc
    name_calls_by_module(gm)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != 1:
        raise CutPointError(f"a splittable model takes exactly one input tensor; {type(model).__name__} takes {len(placeholders)}")
    try:
        with torch.no_grad():
            fold_shapes(gm, input_shape, dtype)
            ShapeProp(gm).propagate(torch.zeros((1, *input_shape), dtype=dtype))
    except Exception as exc:  # whatever the model raises on a wrong input shape
        raise CutPointError(f"{type(model).__name__} does not run on an input of shape {(1, *input_shape)}: {exc}") from exc
    return TracedModel(module=gm, input_shape=tuple(input_shape), input_dtype=dtype,
                       blocks=tuple(block_units(model)))


#: What a tensor says of its shape rather than its values: a condition built from these alone is
#: decided by the input shape, which a bundle fixes.
_SHAPE_ATTRIBUTES = frozenset({"shape", "ndim", "dtype", "device", "is_cuda", "is_nested", "is_sparse",
                               "is_quantized", "layout", "requires_grad"})
#: Modules of torch.nn that are stacks of layers: traced through (fx keeps every other torch.nn module
#: whole), so that each of their layers is a node and the tokens between two layers a cut.
_STACKS = (torch.nn.TransformerEncoder, torch.nn.TransformerDecoder)
_SHAPE_METHODS = frozenset({"size", "dim", "numel", "nelement"})


class _ShapeTracer(fx.Tracer):
    """fx's tracer, with ``if``/``while`` on shapes decided at the bundle's input shape.

    fx cannot follow Python control flow on traced values, so a ``forward`` with
    ``if x.shape[-1] > 100:`` could not be cut at all, though a bundle's input shape is fixed and
    decides the branch. Here a condition is evaluated, on the graph traced so far run at the
    probe batch sizes, when every value it is computed from is a shape (``x.shape``, ``x.size()``,
    ``x.dim()``...); the branch taken is what the graph holds. A condition on tensor values, or
    one the batch size changes, cannot be decided once for the bundle and is refused naming the
    user's line.
    """

    def __init__(self, input_shape: tuple[int, ...], dtype: torch.dtype) -> None:
        super().__init__()
        self.input_shape, self.dtype = tuple(input_shape), dtype
        self._evaluating = False  # running the graph so far: modules and attributes are real, not traced

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        return not isinstance(m, _STACKS) and super().is_leaf_module(m, module_qualified_name)

    def call_module(self, m: torch.nn.Module, forward: Any, args: Any, kwargs: Any) -> Any:
        return forward(*args, **kwargs) if self._evaluating else super().call_module(m, forward, args, kwargs)

    def getattr(self, attr: str, attr_val: Any, parameter_proxy_cache: dict[str, Any]) -> Any:
        return attr_val if self._evaluating else super().getattr(attr, attr_val, parameter_proxy_cache)

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return _ShapeProxy(node, self)

    def to_bool(self, obj: fx.Proxy) -> bool:
        return self.decided(obj.node, bool, "branches on")

    def decided(self, node: fx.Node, how: Any, what: str) -> Any:
        """``how(node's value)``, the same at every probe batch size and from shapes alone, or refused."""
        where = _user_line()
        if not _only_shapes(node):
            raise CutPointError(
                f"cannot trace {type(self.root).__name__}: its forward {what} tensor values at {where}; "
                "a split model's graph must be the same for every input: compute both sides and pick with "
                "torch.where, or move the branch out of forward")
        decided = {how(self._evaluate(node, batch)) for batch in _PROBE_BATCHES}
        if len(decided) > 1:
            raise CutPointError(
                f"cannot trace {type(self.root).__name__}: its forward {what} the batch size at {where}; "
                "a bundle serves every batch size with one graph: branch on the other dimensions only")
        return decided.pop()

    def _evaluate(self, node: fx.Node, batch: int) -> Any:
        """``node``'s value on zeros of the input shape at ``batch``, from the graph traced so far."""
        graph, copied = fx.Graph(), {}
        graph.graph_copy(self.graph, copied)
        graph.output(copied[node])
        self._evaluating = True  # fx patches nn.Module.__call__ and __getattr__ while it traces
        try:
            with torch.no_grad():
                return fx.GraphModule(self.root, graph)(torch.zeros((batch, *self.input_shape), dtype=self.dtype))
        finally:
            self._evaluating = False


class _ShapeProxy(fx.Proxy):
    """fx's proxy, whose ``len()`` of a shape is the number (``len(x.size())``, as
    ``nn.TransformerEncoder`` asks it)."""

    def __len__(self) -> int:
        return self.tracer.decided(self.node, len, "takes len() of")  # type: ignore[attr-defined]


def _only_shapes(node: fx.Node) -> bool:
    """Whether every tensor ``node`` is computed from is read for its shape only."""
    pending, seen = [node], set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        if current.op == "call_function" and current.target is getattr and current.args[1] in _SHAPE_ATTRIBUTES:
            continue
        if current.op == "call_method" and current.target in _SHAPE_METHODS:
            continue
        if current.op in ("placeholder", "get_attr", "call_module"):
            return False
        pending.extend(current.all_input_nodes)
    return True


def _user_line() -> str:
    """``FILE:LINE: source`` of the innermost frame outside torch and this module: the line of the
    user's ``forward`` being traced."""
    torch_dir = str(Path(torch.__file__).parent)
    for frame in reversed(traceback.extract_stack()):
        if frame.filename != __file__ and not frame.filename.startswith(torch_dir):
            return f"{frame.filename}:{frame.lineno} ({(frame.line or '').strip()})"
    return "an unknown line"


def name_calls_by_module(gm: fx.GraphModule) -> None:
    """Name every function and method call after the module whose ``forward`` makes it.

    fx names a call by its function and a counter (``add_6``, ``conv2d_35``), which says
    nothing of where in the network it is; a cut id must. ``x + identity`` in ResNet's
    ``layer4.0`` becomes ``layer4_0_add`` and ``F.conv2d`` in EfficientNet's
    ``_blocks.11._project_conv`` becomes ``_blocks_11__project_conv_conv2d``, as a module call
    there would be named. Calls made by the top-level ``forward`` keep fx's names.
    """
    for node in gm.graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if node.op not in ("call_function", "call_method") or not stack:
            continue
        path = next(reversed(stack.values()))[0]  # the innermost module: (qualified name, type)
        if not path:
            continue
        node._rename(f"{path.replace('.', '_')}_{_call_name(node)}")
    gm.recompile()


def _call_name(node: fx.Node) -> str:
    """What a call computes, as fx names it before numbering (``add``, ``conv2d``, ``view``)."""
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "call")
    return str(name).strip("_") or "call"


class _Recorder(fx.Interpreter):
    """Runs the graph and keeps every node's value that is not a tensor (sizes, shapes, ints)."""

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm)
        self.values: dict[fx.Node, Any] = {}

    def run_node(self, n: fx.Node) -> Any:
        value = super().run_node(n)
        if not isinstance(value, torch.Tensor):
            self.values[n] = tuple(value) if isinstance(value, torch.Size) else value
        return value


def _is_shape(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return all(_is_shape(v) for v in value)
    return isinstance(value, int) and not isinstance(value, bool)


def fold_shapes(gm: fx.GraphModule, input_shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> int:
    """Replace in ``gm`` every use of an input-dependent shape value by what the using node can
    compute itself (see the module docstring); returns how many uses were replaced.

    The graph runs at batch 1, 2 and 3: a value equal in all three is a constant of the traced
    shape; an int ``a*B + b`` (``x.size(0)``, ``bs * 4``) is read again from a tensor argument of
    the node that uses it, whose dimension 0 is the batch. Anything else is left as it is.
    """
    runs = []
    for batch in _PROBE_BATCHES:
        recorder = _Recorder(gm)
        recorder.run(torch.zeros((batch, *input_shape), dtype=dtype))
        runs.append(recorder.values)
    dynamic = _input_dependent(list(gm.graph.nodes))
    shapes = {n for n in runs[0] if n in dynamic and n.op != "output" and all(_is_shape(r.get(n)) for r in runs)}
    replaced = 0
    for user in list(gm.graph.nodes):
        if user in shapes or user.op == "output":
            continue
        uses = [a for a in user.all_input_nodes if a in shapes]
        if not uses:
            continue
        carrier = next((a for a in user.all_input_nodes if a in dynamic and a not in shapes), None)
        mapping: dict[fx.Node, Any] = {}
        for node in uses:
            folded = _fold(gm.graph, user, carrier, [r[node] for r in runs])
            if folded is not None:
                mapping[node] = folded
        if mapping:
            user.args = fx.node.map_arg(user.args, lambda a: mapping.get(a, a))
            user.kwargs = fx.node.map_arg(user.kwargs, lambda a: mapping.get(a, a))
            replaced += len(mapping)
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()
    return replaced


def _fold(graph: fx.Graph, user: fx.Node, carrier: fx.Node | None, values: list[Any]) -> Any:
    """What replaces a shape value seen as ``values`` at the probe batch sizes, or None."""
    if all(v == values[0] for v in values):
        return values[0]  # a constant of the traced shape
    if isinstance(values[0], (tuple, list)):
        parts = [_fold(graph, user, carrier, [v[i] for v in values]) for i in range(len(values[0]))] \
            if all(isinstance(v, (tuple, list)) and len(v) == len(values[0]) for v in values) else None
        return None if parts is None or any(p is None for p in parts) else type(values[0])(parts)
    a = values[1] - values[0]
    b = values[0] - a
    if carrier is None or any(v != a * batch + b for v, batch in zip(values, _PROBE_BATCHES)):
        return None
    with graph.inserting_before(user):
        value = graph.call_method("size", (carrier, 0))
        if a != 1:
            value = graph.call_function(operator.mul, (value, a))
        if b != 0:
            value = graph.call_function(operator.add, (value, b))
    return value


def cut_blockers(traced: TracedModel) -> list[str]:
    """Values other than tensors that stay live across part of the graph, so no cut is offered
    there: each as one line naming the node, what it is, and the nodes between its definition
    and its last use. Empty when every shape value was folded (:func:`fold_shapes`)."""
    nodes = list(traced.module.graph.nodes)
    position = {node: i for i, node in enumerate(nodes)}
    found = []
    for node in _input_dependent(nodes):
        if node.op == "placeholder" or isinstance(node.meta.get("tensor_meta"), TensorMetadata):
            continue
        users = [u for u in node.users if u.op != "output"]
        if not users:
            continue
        last = max(users, key=position.__getitem__)
        if position[last] - position[node] > 1:
            found.append(f"{node.name} ({_describe(traced.module, node)}, not a tensor) is computed at node "
                         f"{position[node]} and used by {last.name} at node {position[last]}: no cut between them")
    return found


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
                block=block_of(node, traced.blocks),
            )
        )
    return _with_block_level(cuts)


def _with_block_level(cuts: list[CutPoint]) -> list[CutPoint]:
    """Mark each block's last cut and Eq. 3 among those (:mod:`exporter.blocks`)."""
    marked: list[CutPoint] = []
    best = float("inf")
    for i, cut in enumerate(cuts):
        output = i + 1 == len(cuts) or cuts[i + 1].block != cut.block
        compressive = output and cut.natural and cut.compression_ratio < best
        if output:
            best = min(best, cut.compression_ratio)
        marked.append(dataclasses.replace(cut, block_output=output, block_compressive=compressive))
    return marked


def split_at(traced: TracedModel, cut_id: str) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Cut the traced graph after node ``cut_id``: ``tail(head(x)) == model(x)``.

    The head keeps every node up to the cut and returns the cut value; the tail starts
    from a placeholder named ``cut`` that stands for it. Constants (``get_attr`` and what
    is computed from them alone) are copied into whichever half uses them.
    """
    head, tail = _cut(traced, [get_cut_point(find_cut_points(traced), cut_id)])
    return head, tail


def split_chain(traced: TracedModel, cut_ids: Sequence[str]) -> list[fx.GraphModule]:
    """Cut the traced graph after each of ``cut_ids`` (two or more, in graph order) into a chain
    of ``len(cut_ids) + 1`` stages: stage 0 (the head) from the input to the first cut, stage k
    from cut k to cut k+1, the last from the last cut to the output, so that running them in
    turn is the model. Each stage after the head starts from a placeholder named ``cut``;
    constants are copied into whichever stage uses them, as :func:`split_at` does."""
    return _cut(traced, get_chain(find_cut_points(traced), cut_ids))


def get_chain(cuts: Sequence[CutPoint], cut_ids: Sequence[str]) -> list[CutPoint]:
    """The cuts a chain named by ``cut_ids`` is cut at; a :class:`CutPointError` in one line for
    fewer than two, an id named twice, an unknown id (as :func:`get_cut_point`) or ids out of
    graph order (naming the order they must be in)."""
    named = ",".join(cut_ids)
    if len(cut_ids) < 2:
        raise CutPointError(f"chain {named or '(empty)'}: a chain needs two cuts or more "
                            "(one cut is a layer split: give it to --splits)")
    twice = sorted({i for i in cut_ids if list(cut_ids).count(i) > 1})
    if twice:
        raise CutPointError(f"chain {named}: names {', '.join(twice)} twice; each cut of a chain comes once")
    try:
        chosen = [get_cut_point(cuts, i) for i in cut_ids]
    except CutPointError as exc:
        raise CutPointError(f"chain {named}: {exc}") from None
    ordered = sorted(chosen, key=lambda c: c.position)
    if ordered != chosen:
        raise CutPointError(f"chain {named}: cuts out of graph order; "
                            f"a chain runs from the input on, so name them as {','.join(c.id for c in ordered)}")
    return chosen


def _cut(traced: TracedModel, cuts: Sequence[CutPoint]) -> list[fx.GraphModule]:
    """The stages between consecutive ``cuts`` (in graph order): the head, then one per cut."""
    gm = traced.module
    nodes = list(gm.graph.nodes)
    dynamic = _input_dependent(nodes)
    positions: list[int | None] = [c.position for c in cuts]
    bounds = zip([None, *positions], [*positions, None])
    names = ["Head", *(f"Stage{k}" for k in range(1, len(cuts))), "Tail"]
    return [_module(gm, _stage(nodes, dynamic, start, end), name) for (start, end), name in zip(bounds, names)]


def _stage(nodes: list[fx.Node], dynamic: set[fx.Node], start: int | None, end: int | None) -> fx.Graph:
    """The nodes after ``start`` (the input where None) up to ``end`` (the output where None):
    a stage that starts at a cut takes it as a placeholder named ``cut`` and returns ``end``."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    if start is not None:
        env[nodes[start]] = graph.placeholder(CUT)
        # Constants may be defined before the cut and used after it: copy them first.
        for node in nodes[:start]:
            if node not in dynamic and node.op != "placeholder":
                env[node] = graph.node_copy(node, env.__getitem__)
    first = 0 if start is None else start + 1
    for node in nodes[first : len(nodes) if end is None else end + 1]:
        env[node] = graph.node_copy(node, env.__getitem__)
    if end is not None:
        graph.output(env[nodes[end]])
    return graph


def get_cut_point(cuts: Sequence[CutPoint], cut_id: str) -> CutPoint:
    """The cut named ``cut_id``; a :class:`CutPointError` suggests near matches and lists the rest."""
    for cut in cuts:
        if cut.id == cut_id:
            return cut
    valid = [c.id for c in cuts]
    # An id of fx's own (``add_6``) may name a call now named after its module (``layer4_0_add``).
    op = re.sub(r"_\d+$", "", cut_id)
    near = difflib.get_close_matches(cut_id, valid, n=3)
    near += [v for v in valid if re.search(rf"_{re.escape(op)}(_\d+)?$", v) and v not in near][:8]
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
