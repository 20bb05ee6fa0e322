"""The shared validator collects every failure before raising, whatever runs the artifact."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from exporter.validate import Case, Chain, compare, validate  # noqa: E402
from splitedge.errors import ValidationError  # noqa: E402


class FakeRunner:
    """A runner that is not onnxruntime: the validator must only need names and a call."""

    def __init__(self, fn, input_names=("input",), output_names=("logits",)) -> None:
        self.fn = fn
        self.input_names = input_names
        self.output_names = output_names

    def __call__(self, feeds):
        return {self.output_names[0]: self.fn(feeds[self.input_names[0]])}


def _cases() -> list[Case]:
    xs = [np.ones((b, 4), np.float32) for b in (1, 3)]
    return [Case(f"batch {x.shape[0]}", {"input": x}, {"logits": 2 * x}) for x in xs]


def test_a_faithful_runner_passes() -> None:
    assert compare(FakeRunner(lambda x: 2 * x), _cases(), atol=1e-6) == []
    validate(FakeRunner(lambda x: 2 * x), _cases(), atol=1e-6, what="doubler")


def test_every_failure_is_listed() -> None:
    def broken(x: np.ndarray) -> np.ndarray:
        if x.shape[0] == 3:
            return np.full((3, 5), np.nan, np.float32)  # wrong shape at batch 3
        return 2 * x + 0.5

    with pytest.raises(ValidationError) as info:
        validate(FakeRunner(broken), _cases(), atol=1e-4, what="broken model")
    message = str(info.value)
    assert "broken model does not reproduce torch (atol 0.0001)" in message
    assert "batch 1: output 'logits' differs by up to 0.5" in message
    assert "batch 3: output 'logits' has shape [3, 5], expected [3, 4]" in message


def test_names_and_crashes_are_reported() -> None:
    assert compare(FakeRunner(lambda x: x, output_names=("out",)), _cases(), 1e-4) == [
        "output names ['out'], expected ['logits']"
    ]

    def crash(x: np.ndarray) -> np.ndarray:
        raise RuntimeError("kernel missing")

    assert compare(FakeRunner(crash), _cases(), 1e-4) == [
        "batch 1: the artifact failed to run: kernel missing",
        "batch 3: the artifact failed to run: kernel missing",
    ]


def test_nan_is_a_failure_even_within_tolerance() -> None:
    failures = compare(FakeRunner(lambda x: np.where(x > 0, np.nan, x)), _cases(), 1e9)
    assert failures == [f"batch {b}: output 'logits' contains NaN or infinity" for b in (1, 3)]


def test_chain_feeds_the_cut_to_the_tail() -> None:
    head = FakeRunner(lambda x: x + 1, output_names=("cut",))
    tail = FakeRunner(lambda c: 2 * (c - 1), input_names=("cut",))
    assert compare(Chain(head, tail), _cases(), atol=1e-6) == []
