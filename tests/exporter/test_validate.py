"""The shared validator collects every failure before raising, whatever runs the artifact, and
measures: its tolerance is relative to the spread of the reference outputs."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from exporter._validate import RTOL, Case, Chain, compare, validate  # noqa: E402
from splitedge.errors import ValidationError  # noqa: E402


class FakeRunner:
    """A runner that is not onnxruntime: the validator must only need names and a call."""

    def __init__(self, fn, input_names=("input",), output_names=("logits",)) -> None:
        self.fn = fn
        self.input_names = input_names
        self.output_names = output_names

    def __call__(self, feeds):
        return {self.output_names[0]: self.fn(feeds[self.input_names[0]])}


def _cases(scale: float = 1.0) -> list[Case]:
    xs = [np.arange(4 * b, dtype=np.float32).reshape(b, 4) * scale for b in (1, 3)]
    return [Case(f"batch {x.shape[0]}", {"input": x}, {"logits": 2 * x}) for x in xs]


def test_a_faithful_runner_passes_and_its_agreement_is_measured() -> None:
    assert compare(FakeRunner(lambda x: 2 * x), _cases(), rtol=1e-6)[0] == []
    agreement = validate(FakeRunner(lambda x: 2 * x + 1e-3), _cases(), rtol=1e-3, what="nearly a doubler")
    spread = float(np.std(np.concatenate([c.expected["logits"].ravel() for c in _cases()])))
    assert agreement.max_abs == pytest.approx(1e-3, rel=1e-3)
    assert agreement.spread == pytest.approx(spread) and agreement.max_rel == pytest.approx(1e-3 / spread, rel=1e-3)


def test_tiny_outputs_are_held_to_their_own_scale() -> None:
    """Outputs of at most 2e-8 (MobileNetV3-S's logits with random weights are 2.3e-9): an absolute
    1e-4 would pass a runner that answers zeros; against their spread it fails, and the right one passes."""
    tiny = _cases(scale=1e-9)
    assert compare(FakeRunner(lambda x: 2 * x), tiny, RTOL)[0] == []
    failures, agreement = compare(FakeRunner(lambda x: np.zeros_like(x)), tiny, RTOL)
    assert failures and all("differs by up to" in f for f in failures) and agreement.max_rel > 1


def test_every_failure_is_listed() -> None:
    def broken(x: np.ndarray) -> np.ndarray:
        if x.shape[0] == 3:
            return np.full((3, 5), np.nan, np.float32)  # wrong shape at batch 3
        return 2 * x + 0.5

    with pytest.raises(ValidationError) as info:
        validate(FakeRunner(broken), _cases(), rtol=1e-4, what="broken model")
    message = str(info.value)
    assert "broken model does not reproduce torch (within 0.0001 of its outputs' spread)" in message
    assert "batch 1: output 'logits' differs by up to 0.5 (tolerance " in message
    assert "batch 3: output 'logits' has shape [3, 5], expected [3, 4]" in message


def test_names_and_crashes_are_reported() -> None:
    assert compare(FakeRunner(lambda x: x, output_names=("out",)), _cases(), 1e-4)[0] == [
        "output names ['out'], expected ['logits']"
    ]

    def crash(x: np.ndarray) -> np.ndarray:
        raise RuntimeError("kernel missing")

    assert compare(FakeRunner(crash), _cases(), 1e-4)[0] == [
        "batch 1: the artifact failed to run: kernel missing",
        "batch 3: the artifact failed to run: kernel missing",
    ]


def test_nan_is_a_failure_even_within_tolerance() -> None:
    failures, _ = compare(FakeRunner(lambda x: np.where(x > 0, np.nan, x)), _cases(), 1e9)
    assert failures == [f"batch {b}: output 'logits' contains NaN or infinity" for b in (1, 3)]


def test_chain_feeds_the_cut_to_the_tail() -> None:
    head = FakeRunner(lambda x: x + 1, output_names=("cut",))
    tail = FakeRunner(lambda c: 2 * (c - 1), input_names=("cut",))
    assert compare(Chain(head, tail), _cases(), rtol=1e-6)[0] == []
