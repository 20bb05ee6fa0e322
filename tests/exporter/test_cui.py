"""CUI curves (I-SPLIT Eq. 1-2) on a small CNN trained here on Fashion-MNIST."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from exporter._cui import CuiChoices, cui_per_image, local_maxima  # noqa: E402
from exporter._datasets import FASHION_MNIST_DIR, ImageSet, load_images  # noqa: E402
from exporter._graph import find_cut_points, trace  # noqa: E402
from exporter._train import accuracy  # noqa: E402

pytestmark = pytest.mark.skipif(
    not (FASHION_MNIST_DIR / "t10k-images-idx3-ubyte.gz").is_file(),
    reason="Fashion-MNIST is not installed (apt install dataset-fashion-mnist; make test does it)",
)
SHAPE = (1, 28, 28)  # Fashion-MNIST


@pytest.fixture(scope="module")
def test_set() -> ImageSet:
    return load_images("fashion-mnist", SHAPE).subset(500, seed=1)  # 50 per class


@pytest.fixture(scope="module")
def run(trained, test_set):
    model, _ = trained
    traced = trace(model, SHAPE)
    cuts = find_cut_points(traced)
    return traced, cuts, cui_per_image(traced, cuts, test_set.x, test_set.y, progress=False)


def test_the_model_learned(trained, test_set) -> None:
    assert accuracy(trained[0], test_set) > 0.7  # one epoch on 10k images; chance is 0.1


def test_cui_is_non_negative_and_informative(run) -> None:
    _, cuts, result = run
    assert result.cui.shape == (500, len(cuts))
    assert (result.cui >= 0).all()
    assert (result.cui.mean(axis=0) > 0).all()  # every cut point carries some importance


def test_one_pass_equals_grad_cam_layer_by_layer(trained, test_set, run) -> None:
    """Reference: Grad-CAM at each layer separately, with a forward hook on the original module."""
    model, _ = trained
    traced, cuts, result = run
    x = torch.from_numpy(test_set.x[:16])
    y = torch.from_numpy(test_set.y[:16])
    module_cuts = [(i, c) for i, c in enumerate(cuts) if c.op in {"Conv2d", "BatchNorm2d", "ReLU", "MaxPool2d", "Linear"}]
    assert len(module_cuts) >= 10
    for index, cut in module_cuts:
        node = next(n for n in traced.module.graph.nodes if n.name == cut.id)
        captured = {}
        hook = model.get_submodule(str(node.target)).register_forward_hook(
            lambda m, i, out: captured.setdefault("F", out.retain_grad() or out)
        )
        logits = model(x)
        hook.remove()
        logits.gather(1, y[:, None]).sum().backward()
        feature, grad = captured["F"], captured["F"].grad
        dims = tuple(range(2, feature.dim()))
        alpha = grad.mean(dim=dims, keepdim=True) if dims else grad
        cam = torch.relu((alpha * feature).sum(dim=1)).reshape(len(x), -1).sum(dim=1)
        model.zero_grad()
        np.testing.assert_allclose(result.cui[:16, index], cam.detach().numpy(), rtol=1e-4, atol=1e-5, err_msg=cut.id)


def test_balanced_per_class_curves_average_to_the_global_curve(run, test_set) -> None:
    _, _, result = run
    per_class = np.stack([result.cui[test_set.y == c].mean(axis=0) for c in range(10)])
    assert np.bincount(test_set.y).tolist() == [50] * 10
    np.testing.assert_allclose(per_class.mean(axis=0), result.cui.mean(axis=0), rtol=1e-12)
    # and the classes really differ: the per-class curves are not all the same curve
    assert per_class.std(axis=0).max() > 0.1 * per_class.mean()


def test_deterministic(run, test_set) -> None:
    traced, cuts, result = run
    again = cui_per_image(traced, cuts, test_set.x[:64], test_set.y[:64], progress=False)
    np.testing.assert_array_equal(again.cui, result.cui[:64])


def test_predicted_target_differs_only_where_the_model_is_wrong(run, test_set) -> None:
    traced, cuts, result = run
    predicted = cui_per_image(traced, cuts, test_set.x, test_set.y, CuiChoices(target="predicted"), progress=False)
    right = result.predictions == test_set.y
    np.testing.assert_allclose(predicted.cui[right], result.cui[right], rtol=1e-6)
    assert (predicted.targets == result.predictions).all()
    assert not np.allclose(predicted.cui[~right], result.cui[~right])


@pytest.mark.parametrize(
    ("curve", "maxima"),
    [([1, 3, 2, 5, 4], [1, 3]), ([5, 4, 3], [0]), ([1, 2, 3], [2]), ([1, 2, 2, 1], [1]), ([2, 2, 3, 3], [2])],
)
def test_local_maxima(curve, maxima) -> None:
    assert local_maxima(curve) == maxima
