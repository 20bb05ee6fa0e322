"""The seed-003 paper's CNN (``bench/seed003_cnn.py``): Table 1 layer by layer, and a two-cut chain of it.

The benchmark of the paper's experiment (``bench/chain_trial.py``) is only worth its figures if
the network is the paper's: 14 layers of the types, kernels, output shapes and parameter counts
Table 1 gives, cut where Section 4.2 cuts it, and a chain of it answering as the model does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from bench.seed003_cnn import CUT_AFTER, INPUT_SHAPE, TABLE_1, keras_params, make  # noqa: E402
from device_runtime.bundle import FULL, HEAD, LOCAL, Bundle  # noqa: E402
from device_runtime.engine import OnnxBackend  # noqa: E402
from exporter._build import BuildSpec, build_bundle  # noqa: E402
from exporter._fold import pixels  # noqa: E402
from exporter._graph import find_cut_points, trace  # noqa: E402

#: Keras's layer types as torch builds them (a Conv2D or the first Dense with its ReLU).
KERAS_TYPES = {"Conv2D": nn.Conv2d, "MaxPooling2D": nn.MaxPool2d, "BatchNormalization": nn.modules.batchnorm._BatchNorm,
               "Flatten": nn.Flatten, "Dense": nn.Linear}
#: The paper's device|edge cut after layer 3 (a pooling), edge|cloud after layer 10 (the last pooling).
CHAIN = (CUT_AFTER[3], CUT_AFTER[10])


def _core(layer: nn.Module) -> nn.Module:
    """The Keras layer inside a ReLU wrapper, or the layer itself."""
    return getattr(layer, "layer", layer)


def test_the_layers_are_table_1s() -> None:
    model = make().eval()
    (grey, *layers) = model.children()
    assert len(layers) == len(TABLE_1) == 14
    assert sum(keras_params(layer) for layer in model.children()) == sum(p for _, _, p in TABLE_1) == 673_930
    assert keras_params(grey) == 0  # the RGB → grey conversion adds nothing to the paper's model
    x = torch.rand(2, *INPUT_SHAPE)
    with torch.no_grad():
        x = grey(x)
        assert x.shape == (2, 1, 28, 28)
        for row, (layer, (kind, shape, params)) in enumerate(zip(layers, TABLE_1), 1):
            x = layer(x)
            where = f"layer {row} ({kind})"
            assert isinstance(_core(layer), KERAS_TYPES[kind]), where
            assert tuple(x.shape[1:]) == shape, where
            assert keras_params(layer) == params, where
            core = _core(layer)
            if isinstance(core, nn.Conv2d):  # Keras's Conv2D(kernel_size=3): valid, stride 1
                assert (core.kernel_size, core.stride, core.padding) == ((3, 3), (1, 1), (0, 0)), where
            if isinstance(core, nn.MaxPool2d):  # MaxPooling2D(): 2x2, stride 2
                assert (core.kernel_size, core.stride) == (2, 2), where


def test_the_papers_split_points_are_cut_points_with_table_1s_shapes() -> None:
    cuts = {c.id: c for c in find_cut_points(trace(make().eval(), INPUT_SHAPE))}
    for row in (1, 3, 8, 9, 10, 11):  # Section 4.2's candidates: device|edge after 1 or 3, edge|cloud after 8-11
        cut = cuts[CUT_AFTER[row]]
        assert cut.shape == TABLE_1[row - 1][1], f"after layer {row}"
        assert cut.bytes_per_sample == 4 * int(np.prod(cut.shape))


def test_a_two_cut_chain_is_the_model(tmp_path: Path) -> None:
    """Board head to layer 3, edge stage to layer 10, cloud stage to the logits: the model's answers,
    on Fashion-MNIST images as a board feeds them (three equal channels) and on colour noise."""
    model = make().eval()  # random weights: only the equality matters
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    manifest = build_bundle(BuildSpec("bench.seed003_cnn:make", weights=tmp_path / "weights.pt", splits=[CUT_AFTER[1]], chains=[CHAIN]), tmp_path / "bundle", progress=False)
    chain_id = "+".join(CHAIN)
    bundle = Bundle.load(tmp_path / "bundle")
    chain = manifest.split(chain_id)
    assert [(s.index, s.cut, s.tensor.shape) for s in chain.stages] == [(1, CHAIN[0], (64, 12, 12)),
                                                                         (2, CHAIN[1], (256, 1, 1))]
    assert manifest.model.input_shape == INPUT_SHAPE and len(manifest.model.labels) == 10
    rng = np.random.default_rng(0)
    grey = rng.random((5, 1, 28, 28), dtype=np.float32)
    x = np.concatenate([np.repeat(grey, 3, axis=1), rng.random((3, *INPUT_SHAPE), dtype=np.float32)])
    # The board's artifacts take the crop's pixels (the normalisation folded in): x as torch's module takes it.
    fed = pixels(x, manifest.model.preprocess) if manifest.model.preprocess.folded else x
    y = OnnxBackend(bundle.artifact(chain_id, HEAD)).run(fed)
    for stage in chain.stages:
        y = OnnxBackend(bundle.stage_artifact(chain_id, stage.index)).run(y)
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(y, want, atol=1e-4, rtol=0)
    np.testing.assert_allclose(OnnxBackend(bundle.artifact(LOCAL, FULL)).run(fed), want, atol=1e-4, rtol=0)
