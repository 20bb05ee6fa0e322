"""Inference backends behind one small interface, so heads, tails and full models run alike.

Sessions are created once per artifact and reused for every frame (re-creating an
interpreter per frame is the classic research-code mistake). Inputs are checked against the
artifact's declared shape first, so a wrong shape is a :class:`BackendError` naming both
shapes rather than an onnxruntime stack trace.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, Sequence

import numpy as np

from device_runtime.bundle import FORMATS, ONNX, TFLITE
from device_runtime.engine._cpus import session_options
from splitedge.errors import BackendError


class Backend(Protocol):
    """What the runtimes need of an inference engine."""

    name: str
    input_shape: tuple[int | str, ...]  # symbolic dims (the batch) are strings
    input_dtype: str
    output_names: tuple[str, ...]  # the first is what :meth:`run` returns (a head's ``cut``)

    def run(self, x: np.ndarray) -> np.ndarray: ...

    def run_outputs(self, x: np.ndarray, names: Sequence[str]) -> tuple[np.ndarray, ...]: ...


#: dtype -> its name: numpy computes ``dtype.name`` in Python, 2 µs a call, and a host checks every
#: request's tensor (issue 32). Bounded: the dtypes met are a handful.
_DTYPE_NAMES: dict[np.dtype, str] = {}


def check_input(x: np.ndarray, shape: Sequence[int | str], dtype: str, what: str) -> None:
    """Refuse an input that does not fit the artifact; symbolic dimensions accept any size."""
    name = _DTYPE_NAMES.get(x.dtype)
    if name is None:
        name = x.dtype.name
        if len(_DTYPE_NAMES) < 64:
            _DTYPE_NAMES[x.dtype] = name
    if name != dtype:
        raise BackendError(f"{what} takes {dtype}, got {name}")
    if x.ndim != len(shape) or any(isinstance(f, int) and f != d for f, d in zip(shape, x.shape)):
        shown = [f if isinstance(f, int) else "batch" for f in shape]
        raise BackendError(f"{what} takes shape [{', '.join(map(str, shown))}], got {list(x.shape)}")


_ORT_DTYPES = {"tensor(float)": "float32", "tensor(uint8)": "uint8", "tensor(int8)": "int8", "tensor(float16)": "float16"}


class OnnxBackend:
    """One onnxruntime session for one ONNX artifact with a single input, and its first output (a head
    with an early exit has a second, ``exit_logits``: :meth:`run_outputs` fetches it too)."""

    def __init__(self, path: str | Path, threads: int | None = None, providers: Sequence[str] | None = None,
                 spinning: bool = False) -> None:
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise BackendError("onnxruntime is not installed: pip install 'splitedge[device]'") from exc
        self.name = Path(path).name
        # Sized to this process's CPUs and kept on them; no spinning unless asked: a board's sessions
        # take turns (heads, the full model; calibration's round robin), and calibration times what
        # the run runs (engine/cpus.py).
        options = session_options(ort, threads, spinning)
        # Quiet by default: ORT's warnings about unused initializers are noise on a board's console.
        options.log_severity_level = 3
        try:
            self.session = ort.InferenceSession(
                str(path), sess_options=options, providers=list(providers or ["CPUExecutionProvider"])
            )
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
            raise BackendError(f"{path}: onnxruntime cannot load it: {exc}") from exc
        (inp,) = self.session.get_inputs()
        self.input_name = inp.name
        self.input_shape = tuple(inp.shape)
        self.input_dtype = _ORT_DTYPES.get(inp.type, inp.type)
        self.output_names = tuple(o.name for o in self.session.get_outputs())
        self.output_name = self.output_names[0]
        self._first = [self.output_name]  # what run fetches, made once: a board runs it every frame

    def run(self, x: np.ndarray) -> np.ndarray:
        """The first output (a head's cut), as every board runs a head."""
        check_input(x, self.input_shape, self.input_dtype, self.name)
        try:
            (y,) = self.session.run(self._first, {self.input_name: x})
        except Exception as exc:
            raise BackendError(f"{self.name}: onnxruntime failed: {exc}") from exc
        return y

    def run_outputs(self, x: np.ndarray, names: Sequence[str]) -> tuple[np.ndarray, ...]:
        """The outputs ``names`` in that order, from one run of the session."""
        check_input(x, self.input_shape, self.input_dtype, self.name)
        missing = [n for n in names if n not in self.output_names]
        if missing:
            raise BackendError(f"{self.name}: no output {missing[0]!r} (its outputs: {', '.join(self.output_names)})")
        try:
            return tuple(self.session.run(list(names), {self.input_name: x}))
        except Exception as exc:
            raise BackendError(f"{self.name}: onnxruntime failed: {exc}") from exc


def load_backend(path: str | Path, fmt: str = ONNX, threads: int | None = None) -> Backend:
    """Open an artifact with the backend its format needs."""
    if fmt == ONNX:
        return OnnxBackend(path, threads=threads)
    if fmt == TFLITE:
        from device_runtime.engine._litert_backend import LiteRTBackend  # imports the interpreter only when asked

        return LiteRTBackend(path, threads=threads)
    raise BackendError(f"{path}: no backend for format {fmt!r}; this build runs: {', '.join(FORMATS)}")
