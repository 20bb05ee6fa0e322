"""Every valid cut of four real graphs: the ONNX head then the ONNX tail reproduce the torch model.

This is the exporter's reference test (as minGPT compares its logits with the reference):
it checks the cut analysis, ``split_at`` and the ONNX export together, in onnxruntime,
at batch 1 and batch 3 from the same exported files so that the dynamic batch is proven.
The check here is written out (max abs error) rather than through ``exporter.validate``,
so that a bug in the validator cannot hide a bug in the export.

VGG16 runs narrow: torchvision's ``VGG`` built from its configuration "D" (13 convolutions and
5 pools) with 1/16 of its channels, and the classifier's three linear layers (with their ReLUs
and dropouts) 64 wide. The graph, and so every cut, is VGG16's (checked against the real one
below); only the weights are fewer, and at full width its 470 MB classifier was serialised and
loaded again for each of the 32 tails holding it (5 minutes of the suite for nothing the graph
does not already show). The inverted residuals of MobileNetV2 and EfficientNet-B0 get a skip
wherever a block's input and output widths match, so narrowing them (widths rounded to
multiples of 8) would change their graphs: they run at full width, as ResNet-18 does.
"""

from __future__ import annotations

import functools
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
torchvision = pytest.importorskip("torchvision")

from exporter.graph import CutPoint, TracedModel, find_cut_points, split_at, trace  # noqa: E402
from exporter.models import IMAGENET_PREPROCESS, LoadedModel  # noqa: E402
from exporter.onnx_export import onnx_bytes  # noqa: E402
from tests.exporter.conftest import SEED  # noqa: E402

ATOL = 1e-4
BATCHES = (1, 3)


#: The narrow VGG16's classifier width (VGG16's is 4096).
NARROW_CLASSIFIER = 64


def _session(model: bytes) -> ort.InferenceSession:
    return ort.InferenceSession(model, providers=["CPUExecutionProvider"])


def _narrow_vgg16() -> torch.nn.Module:
    """VGG16's graph at 1/16 of its channels (4 to 32) and a 64-wide classifier, random weights."""
    from torchvision.models.vgg import VGG, cfgs, make_layers

    config = [c if c == "M" else c // 16 for c in cfgs["D"]]
    model = VGG(make_layers(config), num_classes=1000)
    width, channels = NARROW_CLASSIFIER, config[-2]
    model.classifier = torch.nn.Sequential(  # VGG's own classifier, narrow (its widths are fixed in VGG)
        torch.nn.Linear(channels * 7 * 7, width), torch.nn.ReLU(True), torch.nn.Dropout(),
        torch.nn.Linear(width, width), torch.nn.ReLU(True), torch.nn.Dropout(),
        torch.nn.Linear(width, 1000),
    )
    return model


#: Models checked narrow, by the name of the torchvision model whose graph they have.
NARROW = {"vgg16": _narrow_vgg16}


@functools.cache
def _narrow_model(name: str) -> tuple[LoadedModel, TracedModel, tuple[CutPoint, ...]]:
    """``NARROW[name]`` with seeded random weights, traced at ImageNet's 3x224x224, with its cut points."""
    torch.manual_seed(SEED)
    loaded = LoadedModel(name, NARROW[name]().eval(), IMAGENET_PREPROCESS, (3, 224, 224), None)
    traced = trace(loaded.module, loaded.input_shape)
    return loaded, traced, tuple(find_cut_points(traced))


@pytest.mark.parametrize("name", sorted(NARROW))
def test_a_narrow_model_has_the_full_models_graph(name: str, random_model) -> None:
    """Same cuts, same operations at the same places, same shapes but for the channels."""
    full, full_traced, full_cuts = random_model(name)
    narrow, traced, cuts = _narrow_model(name)
    assert narrow.input_shape == full.input_shape
    assert [(c.id, c.position, c.op, c.block) for c in cuts] == [(c.id, c.position, c.op, c.block) for c in full_cuts]
    assert [(n.op, str(n.target)) for n in traced.module.graph.nodes] == [
        (n.op, str(n.target)) for n in full_traced.module.graph.nodes
    ]
    assert [c.shape[1:] for c in cuts if len(c.shape) == 3] == [c.shape[1:] for c in full_cuts if len(c.shape) == 3]


# About 2 minutes on 2 cores: `-m "not slow"` keeps the round trip of resnet18, mobilenet_v2
# and the narrow VGG16, about 1 minute.
@pytest.mark.parametrize(
    "name",
    [
        "resnet18",
        "mobilenet_v2",
        pytest.param("efficientnet_b0", marks=pytest.mark.slow),
        pytest.param("vgg16", id="vgg16-narrow"),
    ],
)
def test_every_cut_reproduces_the_full_model(name: str, random_model) -> None:
    loaded, traced, cuts = _narrow_model(name) if name in NARROW else random_model(name)
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
        # In memory: no disk traffic for the tails.
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
