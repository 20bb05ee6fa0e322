"""Every valid cut of four real graphs: the ONNX head then the ONNX tail reproduce the torch model.

This is the exporter's reference test (as minGPT compares its logits with the reference):
it checks the cut analysis, ``split_at`` and the ONNX export together, in onnxruntime,
at batch 1 and batch 3 from the same exported files so that the dynamic batch is proven.
The check here is written out (max abs error) rather than through ``exporter.validate``,
so that a bug in the validator cannot hide a bug in the export.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

from exporter.graph import split_at  # noqa: E402
from exporter.onnx_export import onnx_bytes  # noqa: E402

ATOL = 1e-4
BATCHES = (1, 3)


def _session(model: bytes) -> ort.InferenceSession:
    return ort.InferenceSession(model, providers=["CPUExecutionProvider"])


# This file takes about 7 minutes on 2 cores, VGG16 alone 5 (its 470 MB classifier
# is serialized and loaded again for each of its 32 tails that include it): `-m "not slow"`
# keeps the round trip of resnet18 and mobilenet_v2, about 1 minute.
@pytest.mark.parametrize(
    "name",
    [
        "resnet18",
        "mobilenet_v2",
        pytest.param("efficientnet_b0", marks=pytest.mark.slow),
        pytest.param("vgg16", marks=pytest.mark.slow),
    ],
)
def test_every_cut_reproduces_the_full_model(name: str, random_model) -> None:
    loaded, traced, cuts = random_model(name)
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((b, *loaded.input_shape), dtype=np.float32) for b in BATCHES]
    with torch.no_grad():  # the reference is computed once per model, not once per cut
        expected = [loaded.module(torch.from_numpy(x)).numpy() for x in inputs]

    failures = []
    started = time.perf_counter()
    for cut in cuts:
        head, tail = split_at(traced, cut.id)
        example = torch.from_numpy(inputs[0])
        with torch.no_grad():
            cut_example = head(example)
        assert tuple(cut_example.shape[1:]) == cut.shape, cut.id
        # In memory: no disk traffic for VGG16's 470 MB tails.
        head_session = _session(onnx_bytes(head, "head", example))
        tail_session = _session(onnx_bytes(tail, "tail", cut_example))
        for x, want in zip(inputs, expected):
            (middle,) = head_session.run(["cut"], {"input": x})
            (got,) = tail_session.run(["logits"], {"cut": middle})
            error = float(np.abs(got - want).max())
            if got.shape != want.shape or not error <= ATOL:
                failures.append(f"{cut.id} batch {x.shape[0]}: shape {got.shape}, max abs error {error:.3g}")
    print(f"{name}: {len(cuts)} cuts in {time.perf_counter() - started:.1f} s")
    assert not failures, "\n".join(failures)
