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

import contextlib
import copy
import dataclasses
import difflib
import inspect
import math
import operator
import re
import traceback
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch
from torch import fx
from torch.fx.passes.shape_prop import ShapeProp, TensorMetadata

from device_runtime.bundle import CUT
from exporter._blocks import block_of, block_units
from splitedge.errors import CutPointError

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
    blocks: tuple[str, ...] = ()  # the model's blocks (exporter._blocks.block_units)

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
    block: str = ""  # the model's block holding the node (exporter._blocks), e.g. "features.14"
    block_output: bool = False  # the last cut of its block: a cut DSC counts
    block_compressive: bool = False  # Eq. 3 among block-level cuts only
    # Rows of the cut tensor per sample: more than 1 after a window or patch partition, whose first
    # dimension is batch x rows. Such a cut crosses as (batch, rows, ...): the head ends by
    # reshaping to it and the tail starts by reshaping back, so the wire's first dimension is the
    # batch as everywhere else and ``shape`` (rows first) and ``bytes_per_sample`` are a sample's.
    rows: int = 1


def trace(model: torch.nn.Module, input_shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> TracedModel:
    """Trace ``model`` (in eval mode) with torch.fx and record shapes with one batch-1 sample.

    Raises :class:`CutPointError` when the model has data-dependent control flow that
    symbolic tracing cannot follow: without a graph there are no cut points to offer.
    """
    model = model.eval()
    name = type(model).__name__
    try:
        tracer = _ShapeTracer(input_shape, dtype)
        with _python_state_kept(model), _one_input(model):
            graph = tracer.trace(model)
        gm = fx.GraphModule(tracer.root, graph, name)
    except CutPointError:
        raise
    except Exception as exc:  # fx raises TraceError, TypeError, NotImplementedError... for untraceable code
        raise CutPointError(f"cannot trace {name} with torch.fx at {_user_line(exc.__traceback__)}: "
                            f"{_cause(exc)}; a split model's forward is tensor operations on its input, with "
                            "Python deciding only from shapes: change that line (--debug shows torch.fx's own "
                            "error)") from exc
    name_calls_by_module(gm)
    try:
        with torch.no_grad():
            runs = _probe(gm, input_shape, dtype)
            _fold_shapes(gm, runs)
            _record_rows(gm, runs)  # folding adds sizes only: every tensor's shapes are as recorded
            ShapeProp(gm).propagate(torch.zeros((1, *input_shape), dtype=dtype))
    except Exception as exc:  # whatever the model raises on a wrong input shape
        said = (str(exc).strip().splitlines() or [""])[0][:300]
        raise CutPointError(f"{name} does not run on an input of shape {(1, *input_shape)}: {type(exc).__name__}: "
                            f"{said} at {_node_line(getattr(exc, 'node', None))}; give the shape it takes with "
                            "--input-shape C,H,W (--debug shows the whole error)") from exc
    return TracedModel(module=gm, input_shape=tuple(input_shape), input_dtype=dtype,
                       blocks=tuple(block_units(model)))


@contextlib.contextmanager
def _one_input(model: torch.nn.Module) -> Iterator[None]:
    """``model`` seen by fx as taking its first input alone, the others left to their defaults
    (``forward(x, mask=None)``, Hugging Face's ``forward(pixel_values=None, labels=None, ...)``):
    fx would make each a placeholder and guard it, and a split model takes one tensor. A forward
    that needs a second input is refused in one line."""
    base = type(model)
    parameters = list(inspect.signature(base.forward).parameters.values())[1:]  # after self
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p.name for p in parameters if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if not positional or len(required) > 1 or (required and required[0] != positional[0].name):
        names = ", ".join(required) or "none"
        raise CutPointError(f"{base.__name__}.forward takes {len(required)} required inputs ({names}); a split model "
                            "takes one tensor: wrap it in a module whose forward(x) makes the others from x or "
                            "holds them as constants")
    if len(parameters) == 1:
        yield
        return

    def forward(self: torch.nn.Module, x: Any) -> Any:
        return base.forward(self, x)
    forward.__name__ = "forward"
    model.__class__ = type(base.__name__, (base,), {"forward": forward, "__module__": base.__module__})
    try:
        yield
    finally:
        model.__class__ = base


def _cause(exc: BaseException) -> str:
    """What a model asked of torch.fx that it cannot give, in a user's words."""
    text = str(exc)
    for known, said in _CAUSES:
        if known in text:
            return said
    return f"{type(exc).__name__} while tracing"


#: torch.fx's errors, by a phrase of theirs, as a user would say what their code did.
_CAUSES = (
    ("cannot be iterated", "it iterates over a tensor's values"),
    ("cannot be used as inputs to control flow", "it branches on a tensor's values"),
    ("not supported in symbolic tracing", "it asks Python for a tensor's value"),
    ("must be real number", "it takes a number from a tensor"),
    ("argument must be", "it passes a traced value where Python wants a number or a string"),
    ("Expected `device_type`", "it passes a traced value where torch wants a device name"),
)


#: The most the tracer keeps of the values of the graph traced so far, in bytes, all probe batch
#: sizes together: enough for the edge models a board runs, not for a ViT-H at batch 3.
_KEPT_BYTES = 1 << 30

#: What torch keeps in every module's ``__dict__``: its own state, which tracing does not change.
_TORCH_STATE = frozenset(vars(torch.nn.Module()))


@contextlib.contextmanager
def _python_state_kept(model: torch.nn.Module) -> Iterator[None]:
    """The modules' own Python attributes as they were before tracing, after it. A model that
    caches in ``forward`` (timm's EfficientViT keeps its attention biases in a dict per device)
    would otherwise keep fx's proxies there, and fail when it next runs as itself."""
    saved = []
    for module in model.modules():
        entries = {k: v for k, v in vars(module).items() if k not in _TORCH_STATE}
        contents = {k: copy.copy(v) for k, v in entries.items() if isinstance(v, (dict, list, set))}
        saved.append((module, entries, contents))
    try:
        yield
    finally:
        for module, entries, contents in saved:
            for k in set(vars(module)) - set(entries) - _TORCH_STATE:
                if not isinstance(module.__dict__[k], torch.Tensor):  # fx's own constants are kept
                    del module.__dict__[k]
            module.__dict__.update(entries)
            for k, content in contents.items():  # the same container, as whoever holds it expects
                entries[k].clear()
                if isinstance(content, list):
                    entries[k].extend(content)
                else:
                    entries[k].update(content)


#: What a tensor says of its shape rather than its values: a condition built from these alone is
#: decided by the input shape, which a bundle fixes.
_SHAPE_ATTRIBUTES = frozenset({"shape", "ndim", "dtype", "device", "is_cuda", "is_nested", "is_sparse",
                               "is_quantized", "layout", "requires_grad"})
#: Modules of torch.nn that are stacks of layers: traced through (fx keeps every other torch.nn module
#: whole), so that each of their layers is a node and the tokens between two layers a cut.
_STACKS = (torch.nn.TransformerEncoder, torch.nn.TransformerDecoder)
_SHAPE_METHODS = frozenset({"size", "dim", "numel", "nelement"})
#: What a tensor says of itself that no batch size changes: read as the value, not traced.
_CONSTANT_ATTRIBUTES = frozenset({"device", "dtype", "ndim", "is_cuda", "layout", "is_sparse", "is_quantized",
                                  "is_nested", "requires_grad"})


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
        self.record_stack_traces = True  # each node's user line, for what a failing node says
        self.input_shape, self.dtype = tuple(input_shape), dtype
        self._evaluating = False  # running the graph so far: modules and attributes are real, not traced
        self._runners: dict[int, fx.Interpreter] = {}  # per probe batch: the values of the graph so far
        self._kept_bytes = 0  # the tensors they hold

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

    def iter(self, obj: fx.Proxy) -> Iterator[Any]:
        """``*x.shape[1:]``, ``for d in x.size()``: a shape's items, one proxy each."""
        return iter([obj[i] for i in range(self.decided(obj.node, len, "iterates over"))])

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
        """``node``'s value on zeros of the input shape at ``batch``, from the graph traced so far.

        Each probe batch keeps the values of the nodes it has run, and runs only the nodes traced
        since: a model that asks ``x.dtype`` in every block (timm's) costs three forward passes
        in all, not three per question (MobileViT-XXS traced in 161 s, re-running from the input)."""
        runner = self._runners.get(batch)
        if runner is None:
            runner = self._runners[batch] = fx.Interpreter(self.root, garbage_collect_values=False, graph=self.graph)
        self._evaluating = True  # fx patches nn.Module.__call__ and __getattr__ while it traces
        try:
            with torch.no_grad():
                for current in self.graph.nodes:
                    if current not in runner.env:
                        value = torch.zeros((batch, *self.input_shape), dtype=self.dtype) \
                            if current.op == "placeholder" else runner.run_node(current)
                        runner.env[current] = value
                        self._kept_bytes += value.nbytes if isinstance(value, torch.Tensor) else 0
                    if current is node:
                        return runner.env[node]
        finally:
            self._evaluating = False
            if self._kept_bytes > _KEPT_BYTES:  # a large model: run from the input next time instead
                self._runners.clear()
                self._kept_bytes = 0
        raise AssertionError(f"{node.name} is not in the graph traced so far")


class _Decided:
    """What Python asks of a value as a number, answered where the value is a shape: ``len()``
    (``len(x.size())``, as ``nn.TransformerEncoder`` asks it), ``int()``, ``float()``,
    ``math.ceil``/``floor``/``trunc``, ``round()``, ``range()``'s index; and what a tensor says of
    itself, not of its values (``.device``, ``.dtype``, ``.ndim``: ``torch.autocast(device_type=
    x.device.type)``). fx's proxies refuse all of these, though a bundle's input shape decides them."""

    tracer: "_ShapeTracer"
    node: fx.Node

    def _decide(self, how: Any, what: str) -> Any:
        return self.tracer.decided(self.node, how, what)

    def __len__(self) -> int:
        return self._decide(len, "takes len() of")

    def __int__(self) -> int:
        return self._decide(int, "takes int() of")

    def __index__(self) -> int:
        return self._decide(operator.index, "uses as an index")

    def __float__(self) -> float:
        return self._decide(float, "takes float() of")

    def __ceil__(self) -> int:
        return self._decide(math.ceil, "rounds")

    def __floor__(self) -> int:
        return self._decide(math.floor, "rounds")

    def __trunc__(self) -> int:
        return self._decide(math.trunc, "rounds")

    def __round__(self, ndigits: int | None = None) -> Any:
        return self._decide(lambda v: round(v, ndigits), "rounds")

    def __getattr__(self, k: str) -> Any:
        if k in _CONSTANT_ATTRIBUTES:
            read = self.tracer.create_proxy("call_function", getattr, (self, k), {})
            return self.tracer.decided(read.node, _same, f"reads .{k} of")
        return _ShapeAttribute(self, k)


def _same(value: Any) -> Any:
    return value


class _ShapeProxy(_Decided, fx.Proxy):
    """fx's proxy for every node the tracer makes, with :class:`_Decided`'s answers."""


class _ShapeAttribute(_Decided, fx.proxy.Attribute):
    """fx's attribute proxy (``x.shape``, before a call or an index makes it a node), likewise."""


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


def _node_line(node: fx.Node | None) -> str:
    """The user's line that made ``node``, from the stack fx recorded as it traced it."""
    frames = re.findall(r'File "([^"]+)", line (\d+)', (node.meta.get("stack_trace") or "") if node else "")
    torch_dir = str(Path(torch.__file__).parent)
    theirs = [f for f in frames if f[0] != __file__ and not f[0].startswith(torch_dir)]
    return f"{theirs[-1][0]}:{theirs[-1][1]}" if theirs else f"node {node.name}" if node else "an unknown line"


def _user_line(tb: types.TracebackType | None = None) -> str:
    """``FILE:LINE (source)`` of the innermost frame outside torch and this module: the line of the
    user's ``forward`` being traced (of the stack now, or of where ``tb`` was raised)."""
    torch_dir = str(Path(torch.__file__).parent)
    frames = traceback.extract_tb(tb) if tb is not None else traceback.extract_stack()
    for frame in reversed(frames):
        if frame.filename != __file__ and not frame.filename.startswith(torch_dir):
            return f"{frame.filename}:{frame.lineno} ({(frame.line or '').strip()})"
    return "a line of torch's own"


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
    """Runs the graph and keeps every node's value that is not a tensor (sizes, shapes, ints), and
    every tensor's shape."""

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm)
        self.values: dict[fx.Node, Any] = {}
        self.shapes: dict[fx.Node, tuple[int, ...]] = {}

    def run_node(self, n: fx.Node) -> Any:
        try:
            value = super().run_node(n)
        except Exception as exc:
            exc.node = n  # type: ignore[attr-defined]  # whose line the error names (_node_line)
            raise
        if isinstance(value, torch.Tensor):
            self.shapes[n] = tuple(value.shape)
        else:
            self.values[n] = tuple(value) if isinstance(value, torch.Size) else value
        return value


def _probe(gm: fx.GraphModule, input_shape: tuple[int, ...], dtype: torch.dtype) -> list[_Recorder]:
    """The graph run on zeros at each of :data:`_PROBE_BATCHES`, every value recorded."""
    runs = []
    for batch in _PROBE_BATCHES:
        recorder = _Recorder(gm)
        recorder.run(torch.zeros((batch, *input_shape), dtype=dtype))
        runs.append(recorder)
    return runs


def _rows(shapes: Sequence[tuple[int, ...]]) -> int | None:
    """Rows per sample of a tensor seen with ``shapes`` at the probe batch sizes: k where its first
    dimension is k x the batch and the others do not change (1 for a plain batch-first tensor; more
    after a window or patch partition), else None (the batch is in another dimension, or nowhere)."""
    if any(len(s) == 0 or s[1:] != shapes[0][1:] for s in shapes):
        return None
    k = shapes[0][0]
    return k if k > 0 and all(s[0] == k * batch for s, batch in zip(shapes, _PROBE_BATCHES)) else None


def _record_rows(gm: fx.GraphModule, runs: Sequence[_Recorder]) -> None:
    """Each tensor node's rows per sample (:func:`_rows`) in its ``meta["rows"]``: what a cut there
    sends per sample is measured at several batch sizes, never inferred from batch 1."""
    for node in gm.graph.nodes:
        if all(node in r.shapes for r in runs):
            node.meta["rows"] = _rows([r.shapes[node] for r in runs])


class _Keeper(fx.Interpreter):
    """Runs the graph and keeps the values of ``wanted`` nodes."""

    def __init__(self, gm: fx.GraphModule, wanted: set[fx.Node]) -> None:
        super().__init__(gm)
        self.wanted, self.kept = wanted, {}

    def run_node(self, n: fx.Node) -> Any:
        value = super().run_node(n)
        if n in self.wanted:
            self.kept[n] = value
        return value


def _mark_batch_major(traced: TracedModel, nodes: set[fx.Node]) -> None:
    """Whether each of ``nodes`` (k rows per sample, k > 1) holds sample i's rows at i*k..(i+1)*k
    (``meta["batch_major"]``): only then is it sample-major and can cross as (batch, k, ...), and a
    host that batches requests by concatenation hands the tail what the model computes. Two random
    samples run together and each alone; their rows must agree."""
    generator = torch.Generator().manual_seed(0)
    x = (torch.rand((2, *traced.input_shape), generator=generator) * 255).to(traced.input_dtype)
    with torch.no_grad():
        together = _Keeper(traced.module, nodes)
        together.run(x)
        apart = []
        for i in range(2):
            alone = _Keeper(traced.module, nodes)
            alone.run(x[i:i + 1])
            apart.append(alone.kept)
    for node in nodes:
        k, both = node.meta["rows"], together.kept[node].double()
        tolerance = 1e-4 * float(both.abs().max()) + 1e-6  # batch 2 and batch 1 may take other kernels
        node.meta["batch_major"] = all(
            torch.allclose(both[i * k:(i + 1) * k], apart[i][node].double(), rtol=0, atol=tolerance) for i in range(2))


def _is_shape(value: Any) -> bool:
    if isinstance(value, (tuple, list)):
        return all(_is_shape(v) for v in value)
    return isinstance(value, int) and not isinstance(value, bool)


def fold_shapes(gm: fx.GraphModule, input_shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> int:
    """Replace in ``gm`` every use of an input-dependent shape value by what the using node can
    compute itself (see the module docstring); returns how many uses were replaced.

    The graph runs at batch 1, 2 and 3: a value equal in all three is a constant of the traced
    shape; an int ``a*B + b`` (``x.size(0)``, ``bs * 4``) is read again from a tensor argument of
    the node that uses it, whose dimension 0 is the batch or k x the batch (:func:`_carrier`).
    Anything else is left as it is, and :func:`cut_blockers` names what it keeps from being cut.
    """
    return _fold_shapes(gm, _probe(gm, input_shape, dtype))


def _fold_shapes(gm: fx.GraphModule, recorded: Sequence[_Recorder]) -> int:
    """:func:`fold_shapes` from the graph's values recorded at the probe batch sizes."""
    runs = [r.values for r in recorded]
    dynamic = _input_dependent(list(gm.graph.nodes))
    shapes = {n for n in runs[0] if n in dynamic and n.op != "output" and all(_is_shape(r.get(n)) for r in runs)}
    replaced = 0
    for user in list(gm.graph.nodes):
        if user in shapes or user.op == "output":
            continue
        uses = [a for a in user.all_input_nodes if a in shapes]
        if not uses:
            continue
        carrier = _carrier(user, recorded)
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


def _carrier(user: fx.Node, recorded: Sequence[_Recorder]) -> tuple[fx.Node, int] | None:
    """A tensor ``user`` takes whose first dimension is k x the batch, and k: the batch size is read
    back from it as ``t.size(0) // k``. After a window or patch partition a tensor's first
    dimension is the batch times the windows, and reading it as the batch gives sizes k times too
    large (a reshape that fails, or worse, one that succeeds)."""
    for node in user.all_input_nodes:
        if all(node in r.shapes for r in recorded):
            rows = _rows([r.shapes[node] for r in recorded])
            if rows is not None:
                return node, rows
    return None


def _fold(graph: fx.Graph, user: fx.Node, carrier: tuple[fx.Node, int] | None, values: list[Any]) -> Any:
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
    tensor, rows = carrier
    with graph.inserting_before(user):
        value = graph.call_method("size", (tensor, 0))
        if rows != 1:
            value = graph.call_function(operator.floordiv, (value, rows))
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
        rows = _sendable_rows(traced, node)
        if rows is None:
            continue
        shape = tuple(meta.shape) if rows > 1 else tuple(meta.shape[1:])
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
                rows=rows,
            )
        )
    return _with_block_level(cuts)


def _sendable_rows(traced: TracedModel, node: fx.Node) -> int | None:
    """The rows per sample a cut after ``node`` sends, or None where it cannot be sent as a batch:
    the batch in another dimension than the first (a sequence-first transformer's ``(L, B, E)``),
    or k rows per sample not in sample order. Computed once per node."""
    rows = node.meta.get("rows")
    if rows is None or rows == 1:
        return rows
    if "batch_major" not in node.meta:
        _mark_batch_major(traced, {n for n in traced.module.graph.nodes
                                   if (n.meta.get("rows") or 1) > 1 and "batch_major" not in n.meta})
    return rows if node.meta["batch_major"] else None


def _with_block_level(cuts: list[CutPoint]) -> list[CutPoint]:
    """Mark each block's last cut and Eq. 3 among those (:mod:`exporter._blocks`)."""
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
    bounds = zip([None, *cuts], [*cuts, None])
    names = ["Head", *(f"Stage{k}" for k in range(1, len(cuts))), "Tail"]
    return [_module(gm, _stage(nodes, dynamic, start, end), name) for (start, end), name in zip(bounds, names)]


def _stage(nodes: list[fx.Node], dynamic: set[fx.Node], start_cut: CutPoint | None,
           end_cut: CutPoint | None) -> fx.Graph:
    """The nodes after ``start_cut`` (the input where None) up to ``end_cut`` (the output where None):
    a stage that starts at a cut takes it as a placeholder named ``cut`` and returns ``end_cut``'s
    value, a cut of several rows per sample as (batch, rows, ...) (:attr:`CutPoint.rows`)."""
    start = None if start_cut is None else start_cut.position
    end = None if end_cut is None else end_cut.position
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    if start_cut is not None:
        env[nodes[start]] = graph.placeholder(CUT)
        if start_cut.rows > 1:
            env[nodes[start]] = graph.call_method("reshape", (env[nodes[start]], -1, *start_cut.shape[1:]))
        # Constants may be defined before the cut and used after it: copy them first.
        for node in nodes[:start]:
            if node not in dynamic and node.op != "placeholder":
                env[node] = graph.node_copy(node, env.__getitem__)
    first = 0 if start is None else start + 1
    for node in nodes[first : len(nodes) if end is None else end + 1]:
        env[node] = graph.node_copy(node, env.__getitem__)
    if end_cut is not None:
        value = env[nodes[end]]
        graph.output(graph.call_method("reshape", (value, -1, *end_cut.shape)) if end_cut.rows > 1 else value)
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
