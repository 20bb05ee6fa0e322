"""Run TFLite artifacts on the board with the LiteRT interpreter (``ai-edge-litert``).

``tflite-runtime`` is the fallback for boards where only it installs; it works only with
numpy<2 (its 2.14 wheels are the last). Never imports torch.

One interpreter per artifact, created once. Its tensors are allocated for one input
shape; a frame of another batch size resizes the input and re-allocates, and only then,
so a camera loop at a steady batch size never re-allocates.

Whatever the model stores inside, the backend is float32 in and float32 out, like the
ONNX backend: a model with quantized (int8/uint8) input has each frame quantized with the
input's scale and zero point, and a quantized output is dequantized, so heads, tails and
the validator never see the difference. The arithmetic is the wire's (:mod:`device_runtime.wire._quantization`,
which the link's uint8 uses too), given the tensor's dtype. Models from :mod:`exporter._tflite_export`
have float I/O already; quantized I/O comes from other converters.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import itertools
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from device_runtime.bundle import CUT
from device_runtime.engine._backend import check_input
from device_runtime.engine._cpus import usable_cpus
from device_runtime.wire import dequantize, quantize
from splitedge.errors import BackendError

__all__ = ["LiteRTBackend", "load_interpreter_class"]

_QUANTIZED = (np.int8, np.uint8, np.int16)


def load_interpreter_class() -> type:
    """``ai_edge_litert``'s Interpreter, else ``tflite_runtime``'s; :class:`BackendError` without either,
    or with a tflite-runtime that cannot work beside this numpy."""
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        _check_tflite_runtime_numpy()
        try:
            from tflite_runtime.interpreter import Interpreter
        except ImportError as exc:
            raise BackendError("no TFLite interpreter is installed: pip install 'splitedge[tflite]'") from exc
    return Interpreter


def _check_tflite_runtime_numpy() -> None:
    """tflite-runtime's last wheels (2.14) were built against numpy 1: beside numpy 2 they import,
    then fail at the first interpreter with "_ARRAY_API not found" after numpy's page-long warning
    (found on aarch64 in the board in a box, where ``pip install tflite-runtime`` brings numpy 2)."""
    try:
        version = importlib.metadata.version("tflite-runtime")
    except importlib.metadata.PackageNotFoundError:
        return  # not installed (the import says so) or installed without metadata: nothing to judge
    if int(np.__version__.split(".")[0]) >= 2 and _release(version) <= (2, 14):
        raise BackendError(
            f"tflite-runtime {version} works only with numpy<2 and numpy {np.__version__} is installed: "
            "pip install 'splitedge[tflite]' (ai-edge-litert, numpy 2), or pip install 'numpy<2'"
        )


def _release(version: str) -> tuple[int, ...]:
    numbers = []
    for part in version.split(".")[:2]:
        digits = "".join(itertools.takewhile(str.isdigit, part))
        numbers.append(int(digits or 0))
    return tuple(numbers)


#: What LiteRT's C++ writes to stderr as a process's first interpreter starts, whatever the settings.
_DELEGATE_NOTICE = b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU."


@contextlib.contextmanager
def _without_delegate_notice() -> Iterator[None]:
    """Hold back LiteRT's ``INFO: Created TensorFlow Lite XNNPACK delegate for CPU.``: written to the
    process's stderr from C++ (no setting or variable turns it off), it was a line at every start of
    a board's run, in its journal too. The process's stderr is a file meanwhile; whatever else was
    written to it is passed on after, in order."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no stderr (a daemon's closed descriptor): nothing to hold back
        yield
        return
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            kept = b"".join(line for line in caught.read().splitlines(keepends=True)
                            if not line.startswith(_DELEGATE_NOTICE))
            if kept:
                os.write(2, kept)


class LiteRTBackend:
    """One TFLite interpreter for one artifact with a single input and a single output, or a head with
    an early exit (issue 48): ``cut`` beside the exit's output, :meth:`run` giving the cut.

    ``input_name`` and ``output_name`` are the signature's names (the bundle contract:
    ``input``/``cut``/``logits``) when the file has one signature, else the tensors' names.
    """

    def __init__(self, path: str | Path, threads: int | None = None) -> None:
        self.name = Path(path).name
        interpreter_class = load_interpreter_class()
        try:
            with _without_delegate_notice():
                # As many threads as the process may use (engine/cpus.py), not the machine's cores.
                self._interpreter = interpreter_class(model_path=str(path), num_threads=threads or usable_cpus())
                self._interpreter.allocate_tensors()
        except Exception as exc:  # the interpreter raises ValueError/RuntimeError for missing and corrupt files
            raise BackendError(f"{path}: the TFLite interpreter cannot load it: {exc}") from exc
        inputs, outputs = self._interpreter.get_input_details(), self._interpreter.get_output_details()
        named = _signature_outputs(self._interpreter, outputs)
        if len(inputs) != 1 or not (len(outputs) == 1 or CUT in named):
            raise BackendError(f"{path}: expected one input and one output (or a head's {CUT!r} beside its exit), "
                               f"found {len(inputs)} and {len(outputs)}")
        self._input = inputs[0]
        self._outputs = named or {outputs[0]["name"]: outputs[0]}
        self._output = self._outputs[CUT] if len(outputs) > 1 else outputs[0]
        self.input_name, self.output_name = _signature_names(self._interpreter, self._input, self._output)
        # The primary output first (what run returns), then the others in the signature's order.
        self.output_names = (self.output_name, *(n for n in self._outputs if self._outputs[n] is not self._output))
        self._details = {self.output_name: self._output,
                         **{n: d for n, d in self._outputs.items() if d is not self._output}}  # by output name
        # -1 marks a dynamic dimension; check_input accepts any size for a string.
        self.input_shape: tuple[int | str, ...] = tuple(
            ("batch" if axis == 0 else f"dim{axis}") if d < 0 else int(d)
            for axis, d in enumerate(self._input["shape_signature"])
        )
        self.input_dtype = "float32"  # quantized inputs are quantized here, see the module docstring
        self._input_quantization = _quantization(self._input)
        self._output_quantization = {n: _quantization(d) for n, d in self._outputs.items()}
        self._output_quantization[self.output_name] = _quantization(self._output)
        self._allocated = tuple(int(d) for d in self._input["shape"])
        self._lock = threading.Lock()  # one interpreter, one invocation at a time

    @property
    def quantized(self) -> bool:
        """True if the input or the output tensor is integer-quantized."""
        return self._input_quantization is not None or self._output_quantization[self.output_name] is not None

    def run(self, x: np.ndarray) -> np.ndarray:
        (y,) = self.run_outputs(x, (self.output_name,))
        return y

    def run_outputs(self, x: np.ndarray, names: Sequence[str]) -> tuple[np.ndarray, ...]:
        """The outputs ``names`` in that order, from one invocation (the interpreter runs the whole graph)."""
        check_input(x, self.input_shape, self.input_dtype, self.name)
        details = self._details
        missing = [n for n in names if n not in details]
        if missing:
            raise BackendError(f"{self.name}: no output {missing[0]!r} (its outputs: {', '.join(self.output_names)})")
        feed = x if self._input_quantization is None else quantize(x, *self._input_quantization)
        with self._lock:
            try:
                if x.shape != self._allocated:
                    self._resize(x.shape)
                self._interpreter.set_tensor(self._input["index"], np.ascontiguousarray(feed))
                self._interpreter.invoke()
                ys = [self._interpreter.get_tensor(details[n]["index"]) for n in names]  # copies, safe after the lock
            except BackendError:
                raise
            except Exception as exc:
                raise BackendError(f"{self.name}: the TFLite interpreter failed: {exc}") from exc
        return tuple(y if (q := self._output_quantization[n]) is None else dequantize(y, q[0], q[1])  # dtype from y
                     for n, y in zip(names, ys))

    def _resize(self, shape: tuple[int, ...]) -> None:
        try:
            self._interpreter.resize_tensor_input(self._input["index"], list(shape), strict=True)
            self._interpreter.allocate_tensors()
        except Exception as exc:
            raise BackendError(f"{self.name}: cannot resize the input to {list(shape)}: {exc}") from exc
        self._allocated = tuple(shape)


def _signature_outputs(interpreter: Any, outputs: list[dict]) -> dict[str, dict]:
    """The output details by the one signature's output names (``cut``, ``exit_logits``), in the
    signature's order; empty where the file has no single signature to name them by."""
    signatures = getattr(interpreter, "_get_full_signature_list", lambda: {})()
    if len(signatures) != 1:
        return {}
    (signature,) = signatures.values()
    by_index = {d["index"]: d for d in outputs}
    named = {name: by_index[index] for name, index in signature.get("outputs", {}).items() if index in by_index}
    return named if len(named) == len(outputs) else {}


def _signature_names(interpreter: Any, inp: dict, out: dict) -> tuple[str, str]:
    signatures = interpreter.get_signature_list()
    if len(signatures) == 1:
        (signature,) = signatures.values()
        if len(signature["inputs"]) == 1 and len(signature["outputs"]) == 1:
            return signature["inputs"][0], signature["outputs"][0]
        if len(signature["inputs"]) == 1 and CUT in signature["outputs"]:  # a head with an early exit
            return signature["inputs"][0], CUT
    return inp["name"], out["name"]


def _quantization(detail: dict) -> tuple[float, int, np.dtype] | None:
    """(scale, zero point, dtype) of a per-tensor quantized I/O tensor; None for float."""
    dtype = np.dtype(detail["dtype"])
    if dtype.type not in _QUANTIZED:
        return None
    scale, zero_point = detail["quantization"]
    if not scale:
        raise BackendError(f"tensor {detail['name']!r} is {dtype.name} without quantization parameters")
    return float(scale), int(zero_point), dtype
