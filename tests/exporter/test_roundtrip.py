"""Every valid cut of four real graphs: the ONNX head then the ONNX tail reproduce the torch model.

This is the exporter's reference test (as minGPT compares its logits with the reference):
it checks the cut analysis, ``split_at`` and the ONNX export together, in onnxruntime,
at batch 1 and batch 3 from the same exported files so that the dynamic batch is proven.
The check here is written out (max abs error) rather than through ``exporter._validate``,
so that a bug in the validator cannot hide a bug in the export.

VGG16 runs narrow: torchvision's ``VGG`` built from its configuration "D" (13 convolutions and
5 pools) with 1/16 of its channels, and the classifier's three linear layers (with their ReLUs
and dropouts) 64 wide. The graph, and so every cut, is VGG16's (checked against the real one
below); only the weights are fewer, and at full width its 470 MB classifier was serialised and
loaded again for each of the 32 tails holding it (5 minutes of the suite for nothing the graph
does not already show).

MobileNetV2 and EfficientNet-B0 run shallow: their own classes, built from a shorter list of
their stages (every kind of block each has: the unexpanded first block, strided expansions, and
stages of two blocks, whose second adds a skip; EfficientNet's 3x3 and 5x5 kernels and its
squeeze-and-excitation). Every cut costs an export of the whole network, so the check grows
with the square of the depth: at full depth the two took 8 minutes of a 2-core machine. Below,
a test checks that each shallow network has every kind of layer, operation and cut of the full
one. ResNet-18 runs whole (it is as short).
"""

from __future__ import annotations

import functools
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
torchvision = pytest.importorskip("torchvision")

from exporter._graph import CutPoint, TracedModel, find_cut_points, split_at, trace  # noqa: E402
from exporter._models import IMAGENET_PREPROCESS, LoadedModel  # noqa: E402
from exporter._onnx_export import onnx_bytes  # noqa: E402
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


def _shallow_mobilenet_v2() -> torch.nn.Module:
    """MobileNetV2 with 5 of its 17 blocks: t=1, then strided stages of two (the second with a skip)."""
    from torchvision.models.mobilenetv2 import MobileNetV2

    # [expansion t, channels c, blocks n, first stride s], as torchvision's own setting lists them.
    return MobileNetV2(inverted_residual_setting=[[1, 16, 1, 1], [6, 24, 2, 2], [6, 96, 2, 2]])


def _shallow_efficientnet_b0() -> torch.nn.Module:
    """EfficientNet-B0 with 5 of its 16 MBConv blocks: its first, then a 3x3 and a 5x5 stage of two."""
    from functools import partial

    from torchvision.models.efficientnet import EfficientNet, MBConvConfig

    # (expansion, kernel, stride, in, out, blocks): B0's stages 1, 2 and 3.
    config = partial(MBConvConfig, width_mult=1.0, depth_mult=1.0)
    stages = [config(1, 3, 1, 32, 16, 1), config(6, 3, 2, 16, 24, 2), config(6, 5, 2, 24, 40, 2)]
    return EfficientNet(stages, dropout=0.2)


#: Models checked narrow or shallow, by the name of the torchvision model whose graph they share.
NARROW = {"vgg16": _narrow_vgg16}
SHALLOW = {"mobilenet_v2": _shallow_mobilenet_v2, "efficientnet_b0": _shallow_efficientnet_b0}
SMALL = NARROW | SHALLOW


@functools.cache
def _small_model(name: str) -> tuple[LoadedModel, TracedModel, tuple[CutPoint, ...]]:
    """``SMALL[name]`` with seeded random weights, traced at ImageNet's 3x224x224, with its cut points."""
    torch.manual_seed(SEED)
    loaded = LoadedModel(name, SMALL[name]().eval(), IMAGENET_PREPROCESS, (3, 224, 224), None)
    traced = trace(loaded.module, loaded.input_shape)
    return loaded, traced, tuple(find_cut_points(traced))


@pytest.mark.parametrize("name", sorted(NARROW))
def test_a_narrow_model_has_the_full_models_graph(name: str, random_model) -> None:
    """Same cuts, same operations at the same places, same shapes but for the channels."""
    full, full_traced, full_cuts = random_model(name)
    narrow, traced, cuts = _small_model(name)
    assert narrow.input_shape == full.input_shape
    assert [(c.id, c.position, c.op, c.block) for c in cuts] == [(c.id, c.position, c.op, c.block) for c in full_cuts]
    assert [(n.op, str(n.target)) for n in traced.module.graph.nodes] == [
        (n.op, str(n.target)) for n in full_traced.module.graph.nodes
    ]
    assert [c.shape[1:] for c in cuts if len(c.shape) == 3] == [c.shape[1:] for c in full_cuts if len(c.shape) == 3]


def _kinds(traced: TracedModel, cuts: tuple[CutPoint, ...]) -> tuple[set[str], set[str]]:
    """The kinds of node a graph has (a module's class, a function's or method's name) and of cut."""
    modules = dict(traced.module.named_modules())
    nodes = {type(modules[str(n.target)]).__name__ if n.op == "call_module" else f"{n.op} {getattr(n.target, '__name__', n.target)}"
             for n in traced.module.graph.nodes if n.op in ("call_module", "call_function", "call_method")}
    return nodes, {c.op for c in cuts}


@pytest.mark.parametrize("name", sorted(SHALLOW))
def test_a_shallow_model_has_every_kind_of_layer_and_cut_of_the_full_one(name: str, random_model) -> None:
    """Fewer blocks, but no kind of layer, operation or cut the full model has is missing, and
    residual sums (a block whose input and output widths match) are among the cuts left out."""
    _, full_traced, full_cuts = random_model(name)
    _, traced, cuts = _small_model(name)
    assert _kinds(traced, cuts) == _kinds(full_traced, full_cuts)
    # By the function's name: str() of a builtin names its address, whose hex digits may spell "add".
    adds = [n.name for n in traced.module.graph.nodes if n.op == "call_function" and getattr(n.target, "__name__", "") == "add"]
    assert len(adds) == 2 and len(cuts) < len(full_cuts) / 2


@pytest.mark.parametrize(
    "name",
    [
        "resnet18",
        pytest.param("mobilenet_v2", id="mobilenet_v2-shallow"),
        pytest.param("efficientnet_b0", id="efficientnet_b0-shallow"),
        pytest.param("vgg16", id="vgg16-narrow"),
    ],
)
def test_every_cut_reproduces_the_full_model(name: str, random_model) -> None:
    loaded, traced, cuts = _small_model(name) if name in SMALL else random_model(name)
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
