"""Write heads, tails and full models as TFLite flatbuffers with litert-torch, float32 or int8.

The artifact keeps the bundle's contract (:data:`device_runtime.bundle.IO_NAMES`): one signature
(``serving_default``) whose input and output carry the names of ``IO_NAMES[role]``, NCHW
layout as in torch, and a dynamic batch axis (``shape_signature`` ``[-1, ...]``), so that
one file serves any batch size once the interpreter resizes its input.

Three things litert-torch (0.10) does not do by itself are done here:

* Names. litert-torch names signature inputs after the keyword arguments of the sample
  and outputs after the keys of a returned dict, so the module is wrapped to take
  ``input=`` (or ``cut=``) and return ``{"cut": ...}`` (or ``{"logits": ...}``).
* Flattening a dynamic batch. ``torch.flatten(x, 1)`` (every torchvision classifier)
  exports as a reshape to ``[batch, C]`` with a symbolic ``batch``, which litert-torch's
  lowering rejects ("Shapes must be 1D sequences of concrete values"). Such reshapes are
  rewritten to ``[-1, C]``: the same tensor, with the batch inferred at run time.
* Global pooling with a dynamic batch. ``adaptive_avg_pool2d(x, 1)`` (MobileNetV2's cut
  before the classifier, every squeeze-and-excitation block) lowers to a MEAN and a
  RESHAPE whose shape holds the traced batch size, so the interpreter fails to allocate at
  any other batch. Such reshapes get ``-1`` for the batch in the flatbuffer afterwards.

int8 is static post-training quantization through PT2E (torchao ``prepare_pt2e`` /
``convert_pt2e`` with litert-torch's ``PT2EQuantizer``: symmetric per-channel int8 weights,
int8 activations ranged by histogram observers over the calibration samples). The
artifact keeps float32 input and output tensors with quantize/dequantize inside, so a
board feeds it the same preprocessed frame as the float model.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import numpy as np
import torch

from device_runtime.bundle import FLOAT32, IO_NAMES, PRECISIONS
from exporter._fold import described
from splitedge.errors import ExportError, brief

__all__ = ["MIN_CALIBRATION_SAMPLES", "MAX_BATCH", "export_tflite", "tflite_bytes"]

#: Fewer samples leave activation ranges to chance (and a histogram observer needs a spread).
MIN_CALIBRATION_SAMPLES = 32
#: Upper bound torch.export needs for the symbolic batch; the interpreter accepts any size up to it.
MAX_BATCH = 1024
#: The batch a model is traced at for TFLite: the ops that carry it are found by its value (:func:`_free_batch`),
#: so it must not be a layer's size too. It was 2, as are ShuffleNetV2's channel groups.
TRACE_BATCH = 7
CALIBRATION_CHUNK = 8  # samples per forward pass while calibrating: bounded memory, same statistics

#: The ops a flatten or reshape of the batch exports to (before litert-torch's own decompositions).
_RESHAPES = frozenset(
    {torch.ops.aten.flatten.using_ints, torch.ops.aten.view.default, torch.ops.aten.reshape.default, torch.ops.aten._unsafe_view.default}
)


def export_tflite(
    module: torch.nn.Module,
    role: str,
    example: torch.Tensor,
    target: str | Path | BinaryIO,
    precision: str = FLOAT32,
    calibration: np.ndarray | None = None,
    outputs: tuple[str, ...] | None = None,
) -> None:
    """Convert ``module`` for ``role`` (``head``, ``tail``, ``full``) to a ``.tflite`` file or buffer.

    ``example`` fixes every dimension except the batch. ``calibration`` (int8 only, at
    least :data:`MIN_CALIBRATION_SAMPLES` samples shaped like ``example``) is what the
    activation ranges are measured on: real inputs of this artifact (for a tail, the
    head's outputs on real images), not random noise. Every failure of torch.export,
    the quantizer, litert-torch or the file system becomes :class:`ExportError`.
    """
    content = tflite_bytes(module, role, example, precision, calibration, outputs)
    where = target if isinstance(target, (str, Path)) else getattr(target, "name", "buffer")
    try:
        if isinstance(target, (str, Path)):
            Path(target).parent.mkdir(parents=True, exist_ok=True)
            Path(target).write_bytes(content)
        else:
            target.write(content)
    except OSError as exc:
        raise ExportError(f"cannot write the {role} TFLite file {where}: {exc}") from exc


def tflite_bytes(
    module: torch.nn.Module,
    role: str,
    example: torch.Tensor,
    precision: str = FLOAT32,
    calibration: np.ndarray | None = None,
    outputs: tuple[str, ...] | None = None,
) -> bytes:
    """The serialized TFLite model, for checks that do not need a file on disk (see :func:`export_tflite`).
    ``outputs``: the names of a module returning several tensors (a head with an early exit: cut,
    exit_logits); default the role's one output."""
    if role not in IO_NAMES:
        raise ExportError(f"unknown artifact role {role!r}; expected one of {', '.join(IO_NAMES)}")
    if precision not in PRECISIONS:
        raise ExportError(f"unknown TFLite precision {precision!r}; expected one of {', '.join(PRECISIONS)}")
    samples = _check_calibration(calibration, example, precision, role)
    litert_torch = _import_litert_torch()

    input_name, output_name = IO_NAMES[role]
    output_names = outputs or (output_name,)
    # torch.export specializes a dimension seen as 1, and the converted ops are told from their batch
    # by its value (_free_batch): traced at a batch no layer's size is likely to equal.
    example = example.detach().float()[:1].repeat(TRACE_BATCH, *(1,) * (example.dim() - 1))
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    what = described(role, module)
    try:
        with torch.no_grad(), _quiet():
            program = torch.export.export(
                _Named(module.eval(), output_names),
                (),
                {input_name: example},
                dynamic_shapes={"feeds": {input_name: {0: batch}}},
            )
            graph = _batch_free_reshapes(program.module())
            quant_config = None
            if samples is not None:
                graph, quant_config = _quantize_pt2e(graph, input_name, samples)
            # Exported from an eval() module, so the ops are inference ops already; torch.export
            # refuses .eval() on its modules, so clear the flag litert-torch warns about directly.
            graph.training = False
            edge = litert_torch.convert(
                graph,
                sample_kwargs={input_name: example},
                dynamic_shapes={input_name: {0: batch}},
                quant_config=quant_config,
            )
            return _free_batch(edge.model_content(), int(example.shape[0]))
    except ExportError:
        raise
    except Exception as exc:  # torch.export, torchao and litert-torch raise many unrelated types
        site = _lowering_site(exc)
        raise ExportError(f"cannot convert {what} to TFLite ({precision})"
                          + ("" if site is None else f": LiteRT cannot lower {site}") + f": {brief(exc)}") from exc


def _lowering_site(exc: BaseException) -> str | None:
    """The op litert-torch failed to lower and the model's line that called it, read from the
    error it raised (torch.fx's "While executing ... target=torch.ops.aten.view.default" and
    the original traceback under it): what a user can change, where a JAX trace says nothing of it."""
    text = "\n".join(str(e) for e in _chain(exc))
    op = re.search(r"target=torch\.ops\.(aten\.\w+)", text)
    if op is None:
        return None
    frames = re.findall(r'File "([^"]+)", line (\d+), in \w+\n\s*(.+)', text)
    # The model's own line: the innermost frame outside torch and this exporter (torch's are its modules').
    model = [f for f in frames if not f[0].startswith(_NOT_THE_MODELS)]
    if not model:
        return op.group(1)
    path, line, code = model[-1]
    inner = f" from `{frames[-1][2].strip()}`" if frames[-1] != model[-1] else ""
    if path.startswith("<eval_with_key>"):  # torch.fx's code for the traced graph: `layer = ...(input)`
        layer = re.match(r"(\w+) = ", code.strip())
        return f"{op.group(1)}{inner}, in " + (f"layer {layer.group(1)}" if layer else f"`{code.strip()}`")
    return f"{op.group(1)}{inner}, called at {Path(path).name}:{line} (`{code.strip()}`)"


#: Where frames are torch's or this exporter's, not the model's.
_NOT_THE_MODELS = (str(Path(torch.__file__).parent) + os.sep, str(Path(__file__).parent) + os.sep)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


class _Named(torch.nn.Module):
    """``module`` taking its input by keyword and returning ``{output_name: y}`` (a module returning
    several tensors: one entry per name, in order): litert-torch names the signature after both."""

    def __init__(self, module: torch.nn.Module, output_names: tuple[str, ...]) -> None:
        super().__init__()
        self.module = module
        self.output_names = output_names

    def forward(self, **feeds: torch.Tensor) -> dict[str, torch.Tensor]:
        (x,) = feeds.values()
        y = self.module(x)
        return dict(zip(self.output_names, y if len(self.output_names) > 1 else (y,)))


def _batch_free_reshapes(graph: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Rewrite reshapes to ``[batch, d1, ...]`` (symbolic batch, static rest) as ``[-1, d1, ...]``.

    Same result on every batch size; it is what litert-torch's lowering can express.
    """
    changed = False
    for node in list(graph.graph.nodes):
        if node.op != "call_function" or node.target not in _RESHAPES:
            continue
        value = node.meta.get("val")
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else ()
        if not shape or not isinstance(shape[0], torch.SymInt) or not all(isinstance(d, int) for d in shape[1:]):
            continue
        with graph.graph.inserting_before(node):
            reshape = graph.graph.call_function(torch.ops.aten.reshape.default, (node.args[0], [-1, *shape[1:]]))
        reshape.meta = dict(node.meta)
        node.replace_all_uses_with(reshape)
        graph.graph.erase_node(node)
        changed = True
    if changed:
        graph.graph.lint()
        graph.recompile()
    return graph


def _free_batch(content: bytes, batch: int) -> bytes:
    """Give every RESHAPE whose target shape, and every SLICE whose size, starts with the traced
    ``batch`` a ``-1`` there instead.

    litert-torch lowers ``mean(..., keepdim=True)`` (global average pooling, squeeze-and-
    excitation) and the NHWC↔NCHW transposes of 1×1 maps to RESHAPEs with the sample's
    concrete shape, so the interpreter fails to allocate at any other batch size; and a
    ``chunk`` along the channels (ShuffleNetV2's split of each block) to SLICEs of the traced
    batch's rows, so a larger batch lost its last rows and a smaller one was refused. Only
    ops whose input also starts with ``batch`` (and slices from row 0) are changed: those
    carry the batch through, and ``-1`` makes the interpreter infer it, or slice to the end.
    Edited with LiteRT's own flatbuffer tools; the content comes back unchanged when nothing needs it.
    """
    from ai_edge_litert import schema_py_generated as schema
    from ai_edge_litert.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model_from_bytearray(bytearray(content))
    kinds = {index: builtin for index, code in enumerate(model.operatorCodes)
             if (builtin := flatbuffer_utils.get_builtin_code_from_operator_code(code))
             in (schema.BuiltinOperator.RESHAPE, schema.BuiltinOperator.SLICE)}

    def constant(subgraph: Any, tensor: int) -> np.ndarray | None:
        data = model.buffers[subgraph.tensors[tensor].buffer].data
        return None if data is None else np.frombuffer(bytes(data), dtype=np.int32).copy()

    changed = False
    for subgraph in model.subgraphs:
        for op in subgraph.operators:
            kind = kinds.get(op.opcodeIndex)
            slicing = kind == schema.BuiltinOperator.SLICE
            if kind is None or len(op.inputs) < (3 if slicing else 2):
                continue
            data = subgraph.tensors[op.inputs[0]]
            if len(data.shape) == 0 or data.shape[0] != batch:
                continue
            if slicing and ((begin := constant(subgraph, op.inputs[1])) is None or len(begin) == 0 or begin[0] != 0):
                continue
            target = op.inputs[2 if slicing else 1]
            shape = constant(subgraph, target)
            if shape is None or len(shape) == 0 or shape[0] not in (batch, -1):  # -1: a buffer shared, freed already
                continue
            shape[0] = -1
            model.buffers[subgraph.tensors[target].buffer].data = np.frombuffer(shape.tobytes(), dtype=np.uint8)
            if isinstance(op.builtinOptions, schema.ReshapeOptionsT) and op.builtinOptions.newShape:
                op.builtinOptions.newShape = [int(d) for d in shape]
            output = subgraph.tensors[op.outputs[0]]
            output.shapeSignature = [-1, *list(output.shape)[1:]]
            changed = True
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model)) if changed else content


def _quantize_pt2e(graph: torch.fx.GraphModule, input_name: str, samples: np.ndarray) -> tuple[torch.fx.GraphModule, object]:
    """Static int8 PTQ: observe ``samples``, then fold the ranges into quantize/dequantize pairs."""
    from litert_torch.quantize.pt2e_quantizer import PT2EQuantizer, get_symmetric_quantization_config
    from litert_torch.quantize.quant_config import QuantConfig
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = PT2EQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True, is_dynamic=False))
    prepared = prepare_pt2e(graph, quantizer)
    for start in range(0, len(samples), CALIBRATION_CHUNK):
        prepared(**{input_name: torch.from_numpy(samples[start : start + CALIBRATION_CHUNK])})
    # fold_quantize=False keeps weights as float + quantize ops, which litert-torch folds itself.
    return convert_pt2e(prepared, fold_quantize=False), QuantConfig(pt2e_quantizer=quantizer)


def _check_calibration(calibration: np.ndarray | None, example: torch.Tensor, precision: str, role: str) -> np.ndarray | None:
    if precision == FLOAT32:
        return None
    if calibration is None:
        raise ExportError(f"int8 {role}: calibration samples are required (at least {MIN_CALIBRATION_SAMPLES} real inputs)")
    samples = np.ascontiguousarray(calibration, dtype=np.float32)
    if samples.shape[1:] != tuple(example.shape[1:]):
        raise ExportError(
            f"int8 {role}: calibration samples have shape {list(samples.shape)}, "
            f"expected [N, {', '.join(map(str, example.shape[1:]))}]"
        )
    if len(samples) < MIN_CALIBRATION_SAMPLES:
        raise ExportError(f"int8 {role}: {len(samples)} calibration samples, at least {MIN_CALIBRATION_SAMPLES} needed")
    return samples


def _import_litert_torch() -> Any:
    """litert-torch, loaded so that its libraries print nothing a user did not ask for: TensorFlow's
    note that oneDNN is on (logged through absl before any log set-up, which TF_CPP_MIN_LOG_LEVEL
    does not reach; oneDNN speeds TensorFlow's own kernels, which a conversion does not run, so it
    is off unless the user set it), the converter's informational lines ("Estimated count of
    arithmetic ops", each file; its warnings and errors still show) and torch's deprecation of an
    enum torchao registers. Both variables are read once, as TensorFlow loads."""
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    pytree = logging.getLogger("torch.utils._pytree")
    level = pytree.level
    pytree.setLevel(logging.ERROR)
    try:
        import litert_torch
    except ImportError as exc:
        raise ExportError("litert-torch is not installed: pip install 'splitedge[export]'") from exc
    finally:
        pytree.setLevel(level)
    return litert_torch


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence litert-torch's progress lines for this conversion only (it reads an environment variable)."""
    key = "LITERT_TORCH_SHOW_PROGRESS"
    before = os.environ.get(key)
    os.environ[key] = "n"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before
