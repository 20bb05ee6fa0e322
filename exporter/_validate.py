"""One validator for every exported artifact, whatever its format.

As in HF optimum's exporters, validation is a step of its own: run the artifact, compare
its input and output names, output shapes and values with what torch computed, collect
every mismatch, and only then raise one :class:`ValidationError` that lists them all.
The comparison only needs a :class:`Runner` (names in, arrays out), so an ONNX file, a
head followed by a tail, and a TFLite file are all checked by the same code. The TFLite
runner is the board's own :class:`~device_runtime.engine._litert_backend.LiteRTBackend`, so what is
validated is what the board will run, batch resizing included.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Protocol, Sequence

import numpy as np
import onnxruntime as ort
import torch

from device_runtime import TensorSpec
from splitedge.errors import BundleError, ValidationError

__all__ = ["RTOL", "FLOAT32_EPS_FLOOR", "Agreement", "Case", "Runner", "OnnxRunner", "TfliteRunner", "Chain", "Emitted", "Only",
           "Handing", "check_sizes", "torch_cases", "compare", "validate"]


class Runner(Protocol):
    """Anything that maps named input arrays to named output arrays."""

    input_names: tuple[str, ...]
    output_names: tuple[str, ...]

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...


@dataclass(frozen=True)
class Case:
    """One input and the reference outputs the artifact must reproduce."""

    label: str  # names the case in failure messages, e.g. "batch 3"
    inputs: dict[str, np.ndarray]
    expected: dict[str, np.ndarray]


class OnnxRunner:
    """An onnxruntime CPU session behind the :class:`Runner` interface."""

    def __init__(self, model: str | Path | bytes) -> None:
        try:
            self.session = ort.InferenceSession(
                model if isinstance(model, bytes) else str(model), providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
            where = "in-memory model" if isinstance(model, bytes) else str(model)
            raise BundleError(f"onnxruntime cannot load {where}: {exc}") from exc
        self.input_names = tuple(i.name for i in self.session.get_inputs())
        self.output_names = tuple(o.name for o in self.session.get_outputs())

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self.output_names, self.session.run(None, dict(feeds))))


class TfliteRunner:
    """A TFLite file in the board's LiteRT backend behind the :class:`Runner` interface."""

    def __init__(self, model: str | Path, threads: int | None = None) -> None:
        from device_runtime.engine import LiteRTBackend  # the interpreter is an optional dependency

        self.backend = LiteRTBackend(model, threads=threads)
        self.input_names = (self.backend.input_name,)
        self.output_names = self.backend.output_names  # a head with an early exit: cut, then exit_logits

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self.output_names, self.backend.run_outputs(feeds[self.input_names[0]], self.output_names)))


class Only:
    """A runner's outputs ``names`` alone: a head with an early exit is validated output by output
    (its cut against torch's head, its exit against torch's exit), each held to its own spread."""

    def __init__(self, runner: Runner, names: Sequence[str]) -> None:
        self.runner, self.input_names, self.output_names = runner, runner.input_names, tuple(names)

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        outputs = self.runner(feeds)
        return {name: outputs[name] for name in self.output_names}


class Chain:
    """Runners in a row: a head then its tail, or a chain's stages: what the board and the
    host (or hosts) compute together. Each runner's outputs feed the next one's inputs by
    position (a chain's middle stage outputs ``next_cut``, which the next stage takes as ``cut``)."""

    def __init__(self, first: Runner, *rest: Runner) -> None:
        self.runners = (first, *rest)
        self.input_names = first.input_names
        self.output_names = self.runners[-1].output_names

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        outputs = self.runners[0](feeds)
        for runner in self.runners[1:]:
            outputs = runner(dict(zip(runner.input_names, outputs.values())))
        return outputs


@dataclass(frozen=True)
class Emitted:
    """What a runner handed on for one input: the input's batch, and the output's shape and size."""

    batch: int
    shape: tuple[int, ...]
    nbytes: int
    itemsize: int


class Handing:
    """A runner that notes what it hands on at every call (its first output: what a head or a chain's
    middle stage sends over the link), so that the sizes a bundle records are held to what its
    artifacts really emit, not to what the graph said they would (:func:`check_sizes`)."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.input_names, self.output_names = runner.input_names, runner.output_names
        self.emitted: list[Emitted] = []

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        outputs = self.runner(feeds)
        sent = outputs[self.output_names[0]]
        self.emitted.append(Emitted(feeds[self.input_names[0]].shape[0], sent.shape, sent.nbytes, sent.itemsize))
        return outputs


def check_sizes(what: str, recorded: TensorSpec, source: str, emitted: Sequence[Emitted]) -> None:
    """One :class:`ValidationError` line where ``recorded`` is not what ``source`` emitted at some batch.

    A board and a host size their buffers, frames and latency plans by the recorded bytes per
    sample: a record from the graph's arithmetic that the artifact contradicts (a window partition
    emitting batch x windows rows) would cross the link as four times what every plan assumed.
    Measured: the output's bytes over its input's batch, counted in the recorded dtype (a uint8
    output of a float32 record is a quarter of it), and its shape, which must be the batch
    followed by the recorded shape.
    """
    itemsize = np.dtype(recorded.dtype).itemsize
    for sent in emitted:
        measured = sent.nbytes * itemsize / (sent.batch * sent.itemsize)
        expected_shape = (sent.batch, *recorded.shape)
        if measured != recorded.bytes_per_sample or tuple(sent.shape) != expected_shape:
            where = "" if tuple(sent.shape) == expected_shape else f", where the record says {list(expected_shape)}"
            raise ValidationError(
                f"{what}: the manifest records {recorded.bytes_per_sample:,} bytes per sample "
                f"({'x'.join(map(str, recorded.shape))}), but {source} emits {measured:,.10g} per sample at batch "
                f"{sent.batch} (shape {list(sent.shape)}{where}): the cut's size was worked out wrong; report it "
                "with the model")


def torch_cases(
    module: Callable[[torch.Tensor], torch.Tensor],
    names: tuple[str, str],
    inputs: Sequence[np.ndarray],
    outside: Callable[[np.ndarray], np.ndarray] | None = None,
) -> list[Case]:
    """Reference cases: ``module`` run by torch on each input, labelled by batch size.

    With ``outside``, the artifact takes each input as it is and torch takes ``outside(input)``: an
    artifact with the normalisation folded in is held to the torch module with the normalisation
    applied outside it, so the fold is validated as every other step of the export is.
    """
    input_name, output_name = names
    cases = []
    with torch.no_grad():
        for x in inputs:
            y = module(torch.from_numpy(x if outside is None else outside(x))).numpy()
            cases.append(Case(f"batch {x.shape[0]}", {input_name: x}, {output_name: y}))
    return cases


#: What a float32 artifact may differ from torch by, relative to the spread of torch's output
#: (its standard deviation over the validation inputs). Relative, not absolute: MobileNetV3-S with
#: random weights has logits of at most 2.3e-9, under which an absolute 1e-4 passes any tail at
#: all; against the spread a wrong tail is off by about 1 and float32's rounding by about 1e-6
#: (MobileNetV2: ONNX 4e-7, TFLite float32 1e-5 of its logits' spread).
RTOL = 1e-4

#: The least a float32 artifact may differ by, in float32 epsilons of the largest reference output:
#: beside RTOL, for outputs that hardly vary. An artifact that computes in another order rounds
#: each output to float32 on its own, a unit or two in the last place of the output's magnitude
#: (sigmoid(15 + tanh(z)), outputs near 1 varying by 6e-8: onnxruntime differs from torch by
#: 1.2e-7, one epsilon, where RTOL of the spread allows 6e-12). A variation below that rounding
#: cannot be told from it by any comparison; 16 epsilons (1.9e-6 of the magnitude) leaves room for
#: a final sum or an activation rounded differently, and stays far below a wrong tail's error (the
#: magnitude itself) and below RTOL of the spread wherever the spread is over 2 % of the magnitude.
#: Below float32's normal range (1.2e-38) its spacing no longer shrinks with the magnitude: it is
#: 2^-149 = eps x the smallest normal, so the floor is taken there at that magnitude (Hugging
#: Face's MobileViT with its own random init answers logits of 1e-42, computed in subnormals).
FLOAT32_EPS_FLOOR = 16


@dataclass(frozen=True)
class Agreement:
    """How closely an artifact reproduced torch, over every case: the figures a bundle records."""

    max_abs: float  # largest absolute difference of any output element
    max_rel: float  # max_abs over the spread of the reference outputs
    spread: float  # standard deviation of the reference outputs (0: they do not vary)


def compare(runner: Runner, cases: Sequence[Case], rtol: float) -> tuple[list[str], Agreement | None]:
    """Every way ``runner`` fails to reproduce ``cases`` (names, then per case shapes and values,
    differences over ``rtol`` times the reference's spread or, where more, :data:`FLOAT32_EPS_FLOOR`
    float32 epsilons of its largest value), and the agreement measured (None when nothing could be
    compared)."""
    failures: list[str] = []
    want_in, want_out = (tuple(cases[0].inputs), tuple(cases[0].expected)) if cases else ((), ())
    if runner.input_names != want_in:
        failures.append(f"input names {list(runner.input_names)}, expected {list(want_in)}")
    if runner.output_names != want_out:
        failures.append(f"output names {list(runner.output_names)}, expected {list(want_out)}")
    if failures:
        return failures, None  # running with the wrong names would only repeat the same failure
    reference = np.concatenate([w.astype(np.float64).ravel() for c in cases for w in c.expected.values()])
    spread = float(np.std(reference))
    scale = spread if spread > 0 else 1.0  # outputs that never vary: held to rtol absolutely
    float32 = np.finfo(np.float32)
    magnitude = max(float(np.max(np.abs(reference), initial=0.0)), float(float32.tiny))  # tiny: subnormals' spacing
    floor = FLOAT32_EPS_FLOOR * float(float32.eps) * magnitude
    tolerance = max(rtol * scale, floor)
    max_abs, compared = 0.0, False
    for case in cases:
        try:
            outputs = runner(case.inputs)
        except Exception as exc:  # any backend error is a finding, not a crash of the validator
            failures.append(f"{case.label}: the artifact failed to run: {exc}")
            continue
        for name, want in case.expected.items():
            problems, error = _differences(outputs[name], want, tolerance)
            failures.extend(f"{case.label}: output {name!r} {problem}" for problem in problems)
            if error is not None:
                max_abs, compared = max(max_abs, error), True
    return failures, Agreement(max_abs, max_abs / scale, spread) if compared else None


def validate(runner: Runner, cases: Sequence[Case], rtol: float, what: str) -> Agreement:
    """The agreement ``compare`` measured; one :class:`ValidationError` listing every failure if any."""
    failures, agreement = compare(runner, cases, rtol)
    if failures or agreement is None:
        raise ValidationError(f"{what} does not reproduce torch (within {rtol:g} of its outputs' spread):\n  "
                              + "\n  ".join(failures or ["nothing to compare"]))
    return agreement


def _differences(got: np.ndarray, want: np.ndarray, tolerance: float) -> tuple[list[str], float | None]:
    """What is wrong with ``got`` against ``want``, and its largest difference (None: not comparable)."""
    if got.shape != want.shape:
        return [f"has shape {list(got.shape)}, expected {list(want.shape)}"], None
    problems = []
    if got.dtype != want.dtype:
        problems.append(f"has dtype {got.dtype}, expected {want.dtype}")
    if not np.isfinite(got).all():
        return problems + ["contains NaN or infinity"], None
    error = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)), initial=0.0))
    if error > tolerance:
        problems.append(f"differs by up to {error:.3g} (tolerance {tolerance:.3g})")
    return problems, error
