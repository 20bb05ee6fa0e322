"""Outputs that hardly vary (issue 44): held to RTOL of their spread alone, a correct float32
artifact of outputs near 1 that vary by 1e-7 was refused for a rounding of one unit in the last
place. Beside RTOL, validation allows :data:`~exporter._validate.FLOAT32_EPS_FLOOR` float32
epsilons of the outputs' magnitude, and a wrong tail still fails, off by the magnitude or, where
the spread is above float32's rounding, by the spread."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from exporter._build import VALIDATION_BATCHES, BuildSpec, build_bundle  # noqa: E402
from exporter._validate import FLOAT32_EPS_FLOOR, RTOL, Case, compare, torch_cases  # noqa: E402

SHAPE = (3, 32, 32)
EPS = float(np.finfo(np.float32).eps)


class NearConstant(nn.Module):
    """sigmoid(depth + tanh(.)): outputs just under 1, varying by about e^-depth (depth 15: by 8e-8,
    about one float32 unit in the last place; depth 8: by 5e-5, well above it)."""

    def __init__(self, depth: float) -> None:
        super().__init__()
        self.depth = depth
        self.a = nn.Conv2d(3, 16, 3, stride=2)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.depth + torch.tanh(self.fc(torch.relu(self.a(x)).mean((2, 3)))))


def near_constant() -> nn.Module:
    """The build's factory (``tests.exporter.test_near_constant:near_constant``)."""
    torch.manual_seed(0)
    return NearConstant(15.0)


class TorchRunner:
    """``module`` behind the validator's runner interface, computing in ``dtype`` and answering in
    float32: in float64, a correct artifact that rounds otherwise than torch's float32 does."""

    input_names, output_names = ("input",), ("logits",)

    def __init__(self, module: nn.Module, dtype: torch.dtype = torch.float32) -> None:
        self.module, self.dtype = copy.deepcopy(module).to(dtype), dtype

    def __call__(self, feeds):
        with torch.no_grad():
            return {"logits": self.module(torch.from_numpy(feeds["input"]).to(self.dtype)).float().numpy()}


def _model_and_cases(depth: float, seed: int = 0):
    torch.manual_seed(seed)
    model = NearConstant(depth).eval()
    inputs = [np.random.default_rng(b).standard_normal((b, *SHAPE), dtype=np.float32) for b in VALIDATION_BATCHES]
    return model, torch_cases(model, ("input", "logits"), inputs)


@pytest.mark.parametrize("depth", [15.0, 8.0])
def test_a_correct_artifact_rounding_otherwise_passes_where_rtol_alone_refused_it(depth: float) -> None:
    model, cases = _model_and_cases(depth)
    failures, agreement = compare(TorchRunner(model, torch.float64), cases, RTOL)
    assert failures == []
    magnitude = max(float(np.abs(c.expected["logits"]).max()) for c in cases)
    assert RTOL * agreement.spread < agreement.max_abs <= FLOAT32_EPS_FLOOR * EPS * magnitude


def test_a_near_constant_model_builds(tmp_path: Path) -> None:
    manifest = build_bundle(BuildSpec("tests.exporter.test_near_constant:near_constant", input_shape=SHAPE),
                            tmp_path / "bundle", progress=False)
    artifacts = [*manifest.full, *(a for s in manifest.splits for a in s.artifacts)]
    assert manifest.splits and all(a.max_abs_error <= FLOAT32_EPS_FLOOR * EPS for a in artifacts)


def test_a_tail_off_by_the_magnitude_fails() -> None:
    """A tail that lost the offset: outputs near 0.5 where torch's are near 1."""
    model, cases = _model_and_cases(15.0)
    wrong = copy.deepcopy(model)
    wrong.depth = 0.0
    failures, agreement = compare(TorchRunner(wrong), cases, RTOL)
    assert len(failures) == len(VALIDATION_BATCHES) and all("differs by up to" in f for f in failures)
    assert agreement.max_abs > 0.2


def test_a_tail_off_by_the_spread_fails_where_the_spread_is_above_rounding() -> None:
    """Depth 8: outputs vary by 5e-5, some 25 times the floor; a tail with other weights is off by
    about that much, and fails."""
    model, cases = _model_and_cases(8.0)
    wrong, _ = _model_and_cases(8.0, seed=1)
    failures, agreement = compare(TorchRunner(wrong), cases, RTOL)
    assert failures and all("differs by up to" in f for f in failures)
    assert agreement.max_abs > agreement.spread / 2


def test_subnormal_outputs_are_held_to_float32s_spacing_there() -> None:
    """Logits of 1e-42 (Hugging Face's MobileViT with its own random init): float32 spaces them by
    2^-149 whatever their size, so a few of those units is rounding; zeros are still wrong."""
    tiny = np.float32(2.0**-149)
    logits = [np.random.default_rng(b).integers(100, 700, (b, 10)).astype(np.float32) * tiny for b in VALIDATION_BATCHES]
    cases = [Case(f"batch {b}", {"input": x}, {"logits": x}) for b, x in zip(VALIDATION_BATCHES, logits)]
    assert compare(_Echo(lambda x: x + 10 * tiny), cases, RTOL)[0] == []
    failures, _ = compare(_Echo(np.zeros_like), cases, RTOL)
    assert len(failures) == len(VALIDATION_BATCHES) and all("differs by up to" in f for f in failures)


class _Echo:
    """A runner answering ``fn`` of its input, which the cases make torch's own output."""

    input_names, output_names = ("input",), ("logits",)

    def __init__(self, fn) -> None:
        self.fn = fn

    def __call__(self, feeds):
        return {"logits": self.fn(feeds["input"])}
