"""The normalisation folded into heads and full models, validated against torch with the
normalisation applied outside it, and the fast preprocessing's agreement the build records."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from device_runtime import Bundle, HEAD, Preprocess  # noqa: E402
from device_runtime.bundle import IO_NAMES  # noqa: E402
from device_runtime.engine import FAST_AGREEMENT  # noqa: E402
from exporter._build import Variants  # noqa: E402
from exporter._fold import normalise, pixels  # noqa: E402
from exporter._onnx_export import onnx_bytes  # noqa: E402
from exporter._validate import RTOL, OnnxRunner, compare, validate  # noqa: E402
from splitedge.errors import ValidationError  # noqa: E402

SPEC = Preprocess(resize=36, crop=32, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))


def _head() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3, stride=2)).eval()


def test_a_folded_head_reproduces_torch_with_the_normalisation_applied_outside() -> None:
    head, variants = _head(), Variants(folded=SPEC)
    inputs = [np.random.default_rng(b).uniform(0, 255, (b, 3, 32, 32)).astype(np.float32) for b in (1, 3)]
    cases = variants.cases(head, IO_NAMES[HEAD], inputs)
    folded = OnnxRunner(onnx_bytes(variants.board_module(head), HEAD, torch.from_numpy(inputs[0])))
    validate(folded, cases, RTOL, "folded head")
    with torch.no_grad():  # the reference is torch's head on normalised pixels, computed apart from the artifact
        expected = head(torch.from_numpy(normalise(inputs[1], SPEC))).numpy()
    np.testing.assert_allclose(cases[1].expected[IO_NAMES[HEAD][1]], expected)
    # The same head exported without the fold takes normalised input: fed pixels, it fails the validation.
    unfolded = OnnxRunner(onnx_bytes(head, HEAD, torch.from_numpy(inputs[0])))
    assert compare(unfolded, cases, RTOL)[0]
    with pytest.raises(ValidationError, match="does not reproduce torch"):
        validate(unfolded, cases, RTOL, "unfolded head")


def test_pixels_undo_normalise() -> None:
    x = np.random.default_rng(0).uniform(0, 255, (2, 3, 4, 4)).astype(np.float32)
    np.testing.assert_allclose(pixels(normalise(x, SPEC), SPEC), x, atol=1e-3)


def test_the_build_folds_and_records_the_fast_paths_agreement(mobilenet_bundle: Path) -> None:
    preprocess = Bundle.load(mobilenet_bundle, roles=()).manifest.model.preprocess
    if not preprocess.folded:
        pytest.skip("a bundle built before folding (the Makefile's build/test-bundle)")
    assert preprocess.fast_agreement is not None and preprocess.fast_agreement >= FAST_AGREEMENT
    assert "scikit-image" in preprocess.fast_agreement_on
