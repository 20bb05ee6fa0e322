"""``split-export build --semantic K``: a shared trunk on the board, K narrow fragments on hosts.

Two small Fashion-MNIST networks trained from nothing (a VGG stack cut at its first compressive
bottleneck, and a residual network cut before its last two blocks, so the fragments hold residual
sums and a strided projection), each split into 2 and into 5 fragments. The merged logits are
computed here from the fragment ONNX files and the manifest's classes, as a board does it, and
compared with the torch semantic model the build trained (caught on its way to the exporter).
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from device_runtime.bundle import (  # noqa: E402
    CUT,
    FLOAT32,
    HEAD,
    LOGITS,
    ONNX,
    SEMANTIC,
    TAIL,
    Bundle,
    semantic_id,
)
from device_runtime._bundle_slice import slice_bundle  # noqa: E402
from exporter import _build as build_module  # noqa: E402
from exporter._build import BuildSpec, build_bundle  # noqa: E402
from exporter.cli import AE_EPOCHS, SEMANTIC_IMAGES, SEMANTIC_WIDTH, main  # noqa: E402
from exporter._datasets import FASHION_MNIST_DIR, load_images  # noqa: E402
from exporter._graph import split_at, trace  # noqa: E402
from exporter._semantic import (  # noqa: E402
    FragmentTraining,
    SemanticOptions,
    group_classes,
    kept_confusion,
    narrow_tail,
)
from exporter._train import train_classifier  # noqa: E402
from exporter.zoo import fmnist_resnet, fmnist_vgg  # noqa: E402
from splitedge.errors import ExportError  # noqa: E402

pytestmark = pytest.mark.skipif(not (FASHION_MNIST_DIR / "t10k-images-idx3-ubyte.gz").is_file(),
                                reason="Fashion-MNIST missing")

SHAPE = (1, 28, 28)
ATOL = 1e-4
#: The semantic split may lose at most this much test accuracy against the full model (top-1 on the
#: 10,000 test images). Measured here (TRAINING on TRAIN_IMAGES, width 0.5; full models of one epoch):
#: full / semantic vgg 0.83 / 0.84-0.85 (K=2 and 5; the session's vgg is not seeded, so it varies by
#: a few tenths), resnet 0.7164 / 0.7820 (K=2), 0.7839 (K=5): the fragments' two distilled epochs
#: more than make up for their width on these short-trained models. Against full models trained
#: 3 epochs on all 60,000 images (the default recipe: 10,000 images, 2 epochs), vgg 0.9061 became
#: 0.9049 (K=2) and 0.9107 (K=5), resnet 0.8977 became 0.8846 (K=2) and 0.8854 (K=5): a loss of
#: 1.3 points at most, the price SplitPlace reports for semantic splits. The margin is that loss with
#: room for the unseeded vgg, and still catches a recipe that narrows too far or trains too little.
ACCURACY_MARGIN = 0.03
TRAIN_IMAGES = 4000
TRAINING = FragmentTraining(epochs=2)
#: (model, cut, K): VGG at its default cut (_17, 64x3x3: the first compressive bottleneck) and the
#: residual network before its blocks 6 and 7 (a strided block with a 1x1 projection, then an identity one).
CASES = [("vgg", None, 2), ("vgg", None, 5), ("resnet", "_5_relu", 2), ("resnet", "_5_relu", 5)]


def _resnet_weights(root: Path) -> Path:
    """fmnist_resnet trained one epoch on 10,000 Fashion-MNIST images: the Makefile's
    (``SPLITEDGE_TEST_FMNIST_RESNET``, ``python -m exporter.zoo fmnist_resnet --images 10000 --epochs 1``),
    or trained here and kept in ``root``."""
    cache = Path(os.environ.get("SPLITEDGE_TEST_FMNIST_RESNET") or root / "fmnist_resnet.pt")
    if not cache.is_file():
        model = fmnist_resnet()
        train_classifier(model, load_images("fashion-mnist:train", SHAPE).subset(10_000), epochs=1, progress=False)
        torch.save(model.state_dict(), cache)
    return cache


class _Built(dict):
    """Each case built on its first use: a test's time is its own case's build, not all four's."""

    def __init__(self, build) -> None:
        super().__init__()
        self._build = build

    def __missing__(self, case):
        self[case] = self._build(case)
        return self[case]


@pytest.fixture(scope="module")
def semantic_bundles(trained, tmp_path_factory: pytest.TempPathFactory) -> _Built:
    """{case: (bundle dir, the torch semantic model the build exported, printed)}, each built when
    first asked for. vgg K=5 goes through the command line, beside a layer split at the same cut."""
    weights = {"vgg": lambda: trained[1], "resnet": lambda: _resnet_weights(tmp_path_factory.getbasetemp())}

    def build(case):
        name, cut, k = case
        out = tmp_path_factory.mktemp(f"semantic_{name}_{k}") / "bundle"
        caught = []
        original = build_module.make_semantic

        def spy(*args, **kwargs):
            caught.append(original(*args, **kwargs))
            return caught[-1]

        printed = io.StringIO()
        with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(printed):
            patch.setattr(build_module, "make_semantic", spy)
            if case == ("vgg", None, 5):
                assert main(["build", "exporter.zoo:fmnist_vgg", "--weights", str(weights[name]()), "--input-shape",
                             "1,28,28", "--splits", "_17", "--semantic", "5", "--train-data", "fashion-mnist",
                             "--train-images", str(TRAIN_IMAGES), "--epochs", str(TRAINING.epochs),
                             "--cut-bits", "4", "--out", str(out)]) == 0
            else:
                build_bundle(BuildSpec(f"exporter.zoo:fmnist_{name}", weights=weights[name](), splits=(), input_shape=SHAPE,
                                       semantic=SemanticOptions(k, "fashion-mnist", cut=cut, train_images=TRAIN_IMAGES,
                                                                training=TRAINING)), out, progress=False)
        return out, caught[0].model, printed.getvalue()

    return _Built(build)


def _run(path: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-K{c[2]}")
def test_merged_fragments_are_the_semantic_model(semantic_bundles, case) -> None:
    out, model, _ = semantic_bundles[case]
    bundle = Bundle.load(out)
    (split,) = [s for s in bundle.manifest.splits if s.kind == SEMANTIC]
    assert split.id == semantic_id(case[1] or "_17", case[2])
    assert [a.role for a in split.artifacts] == [HEAD] and not split.stages
    images = load_images("fashion-mnist:test", SHAPE).x
    for x in (images[:1], images[1:4], images[4:68]):
        cut = _run(bundle.artifact(split.id, HEAD, ONNX, FLOAT32), x)
        assert cut.shape[1:] == split.tensor.shape
        parts = []
        for fragment in split.fragments:
            path = bundle.stage_artifact(split.id, fragment.index)
            assert path.name == f"{split.id}.{fragment.index}.onnx" and path.parent.name == "fragment"
            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            assert [i.name for i in session.get_inputs()] == [CUT] and [o.name for o in session.get_outputs()] == [LOGITS]
            parts.append(session.run(None, {CUT: cut})[0])
            assert parts[-1].shape == (len(x), len(fragment.classes))
        merged = np.zeros((len(x), 10), dtype=np.float32)
        for fragment, logits in zip(split.fragments, parts):
            merged[:, list(fragment.classes)] = logits  # the board's scatter into label order
        concatenated = np.concatenate(parts, 1)
        order = np.concatenate([f.classes for f in split.fragments])
        np.testing.assert_array_equal(merged[:, order], concatenated)
        with torch.no_grad():
            expected = model(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(merged, expected, atol=ATOL, rtol=0)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-K{c[2]}")
def test_groups_are_disjoint_balanced_and_cover_the_labels(semantic_bundles, case) -> None:
    out, _, _ = semantic_bundles[case]
    (split,) = [s for s in Bundle.load(out, roles=()).manifest.splits if s.kind == SEMANTIC]
    groups = [f.classes for f in split.fragments]
    assert len(groups) == case[2] and [f.index for f in split.fragments] == list(range(1, case[2] + 1))
    assert sorted(c for g in groups for c in g) == list(range(10))
    assert max(map(len, groups)) - min(map(len, groups)) <= 1
    assert split.grouping.startswith(f"confusion of the full model on {TRAIN_IMAGES:,} training images")
    tail_params = sum(p.numel() for p in split_at(trace(_module(case[0]), SHAPE), case[1] or "_17")[1].parameters())
    assert all(0 < f.params < 0.6 * tail_params for f in split.fragments)  # width 0.5: about a quarter of the tail


def _module(name: str) -> nn.Module:
    return {"vgg": fmnist_vgg, "resnet": fmnist_resnet}[name]()


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-K{c[2]}")
def test_accuracy_is_near_the_full_models(semantic_bundles, case) -> None:
    """Top-1 on the same 10,000 test images: the layer split's is the full model's (its head and
    tail are the model); the semantic split's is within ACCURACY_MARGIN of it."""
    out, _, _ = semantic_bundles[case]
    manifest = Bundle.load(out, roles=()).manifest
    (split,) = [s for s in manifest.splits if s.kind == SEMANTIC]
    acc = split.accuracies
    assert set(acc) == {"full", "layer", "semantic"}
    assert acc["full"] == manifest.model.accuracy and acc["full"] > 0.65
    assert acc["layer"] == pytest.approx(acc["full"], abs=1e-3)  # head and tail are the model
    assert acc["semantic"] == split.accuracy
    assert acc["semantic"] >= acc["full"] - ACCURACY_MARGIN, acc


def test_the_build_prints_the_semantic_split_beside_a_layer_split(semantic_bundles) -> None:
    out, _, printed = semantic_bundles[("vgg", None, 5)]
    manifest = Bundle.load(out).manifest
    assert [s.id for s in manifest.splits] == ["_17", "_17~5"]
    layer, semantic = manifest.splits
    assert semantic.tensor == layer.tensor and semantic.position == layer.position
    assert (out / layer.artifacts[0].path).read_bytes() == (out / semantic.artifacts[0].path).read_bytes()  # one trunk
    acc = semantic.accuracies
    assert (f"semantic split _17~5: 5 fragments, groups {' | '.join(','.join(map(str, f.classes)) for f in semantic.fragments)}"
            in printed)
    assert f"accuracy full {acc['full']:.4f} / layer {acc['layer']:.4f} / semantic {acc['semantic']:.4f}" in printed
    # --cut-bits 4: the trunk's cut is coded once for both (one head, the same calibration images), and
    # each split's figure is measured through its own hosts: the tail, or the fragments merged.
    (layer_k4,), (semantic_k4,) = layer.codings, semantic.codings
    assert (semantic_k4.scale, semantic_k4.zero) == (layer_k4.scale, layer_k4.zero) and semantic_k4.name == "k4"
    assert semantic_k4.top1 is not None and semantic_k4.top1 >= acc["semantic"] - 0.02, (semantic_k4, acc)
    assert layer_k4.top1 is not None and layer_k4.top1 >= acc["layer"] - 0.02, (layer_k4, acc)


def test_board_and_host_slices_keep_their_parts(semantic_bundles, tmp_path: Path) -> None:
    out, _, _ = semantic_bundles[("resnet", "_5_relu", 2)]
    split_id = "_5_relu~2"
    board = slice_bundle(out, tmp_path / "board", "board")
    assert not (tmp_path / "board" / "fragment").exists()
    loaded = Bundle.load(tmp_path / "board", roles=(HEAD, "full"))
    assert loaded.id == Bundle.load(out, roles=()).id == board.manifest.wire_id
    assert loaded.artifact(split_id, HEAD).is_file()
    host = slice_bundle(out, tmp_path / "host", "host")
    served = Bundle.load(tmp_path / "host", roles=(TAIL,))
    assert served.id == host.manifest.wire_id
    assert [served.stage_artifact(split_id, k).name for k in (1, 2)] == [f"{split_id}.1.onnx", f"{split_id}.2.onnx"]
    assert not (tmp_path / "host" / "head").exists()


def test_grouping_puts_the_most_confused_pair_together() -> None:
    rng = np.random.default_rng(1)
    confusion = rng.integers(0, 4, (10, 10)) + np.diag(np.full(10, 900))
    confusion[3, 8] = confusion[8, 3] = 60  # shirts and bags? the pair a model mixes up most
    confusion[0, 6] = 40
    for k in (2, 3, 4, 5):
        groups = group_classes(confusion, k)
        assert sorted(c for g in groups for c in g) == list(range(10))
        assert max(map(len, groups)) - min(map(len, groups)) <= 1
        assert any({3, 8} <= set(g) for g in groups), (k, groups)
        assert any({0, 6} <= set(g) for g in groups), (k, groups)
        assert groups == group_classes(confusion.copy(), k)  # deterministic
    assert group_classes(confusion, 10) == tuple((c,) for c in range(10))
    assert group_classes(np.eye(10, dtype=np.int64), 4) == ((0, 1, 2), (3, 4, 5), (6, 7), (8, 9))  # no confusion at all
    # Two clean blocks of confusion are found whole, whatever the label order.
    blocks = np.eye(6, dtype=np.int64) * 100
    for a, b in [(0, 2), (2, 4), (0, 4), (1, 3), (3, 5), (1, 5)]:
        blocks[a, b] = blocks[b, a] = 10
    assert group_classes(blocks, 2) == ((0, 2, 4), (1, 3, 5))
    assert kept_confusion(blocks, ((0, 2, 4), (1, 3, 5))) == 1.0


def test_narrowing_scales_depthwise_convs_and_projects_the_cut_into_residual_sums() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Conv2d(1, 8, 3, padding=1)
            self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
            self.bn = nn.BatchNorm2d(8)
            self.pw = nn.Conv2d(8, 8, 1)
            self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))

        def forward(self, x):
            h = torch.relu(self.stem(x))  # the cut
            return self.head(self.pw(torch.relu(self.bn(self.dw(h)))) + h)

    traced = trace(Net(), SHAPE)
    _, tail = split_at(traced, "relu")
    example = torch.randn(2, 8, 28, 28)
    narrow = narrow_tail(tail, example, 0.5, 3)
    assert narrow(example).shape == (2, 3)
    layers = dict(narrow.named_modules())
    assert layers["dw"].groups == 8 and layers["dw"].in_channels == 8  # on the cut's full width: kept
    assert layers["pw"].out_channels == 4 and layers["bn"].num_features == 8
    assert layers["head.2"].out_features == 3
    # Further from the cut, a depthwise conv on narrowed channels stays depthwise.
    deeper = nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), nn.Conv2d(8, 16, 1), nn.Conv2d(16, 16, 3, groups=16),
                           nn.Flatten(), nn.LazyLinear(10))
    deeper(torch.zeros(1, *SHAPE))
    _, tail = split_at(trace(deeper, SHAPE), "_1")
    narrow = narrow_tail(tail, torch.randn(2, 8, 26, 26), 0.5, 4)
    assert (narrow.get_submodule("3").groups, narrow.get_submodule("3").out_channels) == (8, 8)


def test_a_tail_it_cannot_narrow_is_refused_naming_the_layer() -> None:
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 26 * 26, 32), nn.LayerNorm(32),
                        nn.Linear(32, 10))
    _, tail = split_at(trace(net, SHAPE), "_1")
    with pytest.raises(ExportError, match=r"^cannot narrow the tail: layer 4 \(LayerNorm\) has weights") as info:
        narrow_tail(tail, torch.zeros(2, 4, 26, 26), 0.5, 5)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--semantic", "1", "--train-data", "fashion-mnist"], "--semantic 1: a semantic split has 2 fragments or more"),
        (["--semantic", "11", "--train-data", "fashion-mnist"],
         "--semantic 11: a semantic split has 2 to 10 fragments (one group of classes each; the model has 10 labels)"),
        (["--semantic", "5"], "--semantic needs --train-data to train the fragments on, e.g. --train-data fashion-mnist"),
        (["--semantic", "5", "--train-data", "fashion-mnist", "--cut", "_99"], "'_99' is not a valid cut point; "),
        (["--splits", "auto", "--cut", "_17"], "--cut names where a semantic split cuts: give --semantic K with it"),
        (["--semantic", "5", "--train-data", "fashion-mnist", "--width", "1.5"], "--width 1.5: a fragment's widths"),
    ],
)
def test_bad_semantic_flags_are_one_line_errors(tmp_path: Path, capsys, flags: list[str], message: str) -> None:
    code = main(["build", "exporter.zoo:fmnist_vgg", "--input-shape", "1,28,28", *flags, "--out", str(tmp_path / "b")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"split-export: error: {message}") and err.count("\n") == 1, err
    assert not (tmp_path / "b").exists()


def test_the_clis_defaults_are_the_trainings_own() -> None:
    assert FragmentTraining().epochs == AE_EPOCHS  # --epochs serves both trainings
    options = SemanticOptions(2, "fashion-mnist")
    assert (options.width, options.train_images) == (SEMANTIC_WIDTH, SEMANTIC_IMAGES)
