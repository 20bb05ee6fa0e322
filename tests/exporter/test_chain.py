"""``split-export build --chain``: a split cut at several points, its stages run by a chain of hosts.

A chain's head runs on the board up to its first cut; stage k, from cut k to the next cut (or to
the logits), runs on the k-th host. Run in a row, the ONNX files are the model: MobileNetV2 with
its real ImageNet weights, three stages, on the scikit-image photos as the board preprocesses
them; a small Fashion-MNIST network (trained one epoch) in four stages, with an int8 head
measured on held-out images. Bundles are built once per module.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from device_runtime.bundle import (  # noqa: E402
    CHAIN,
    CUT,
    FLOAT32,
    HEAD,
    INT8,
    LOCAL,
    LOGITS,
    MANIFEST_NAME,
    NEXT_CUT,
    ONNX,
    TAIL,
    Bundle,
    Split,
    TensorSpec,
)
from device_runtime._bundle_slice import slice_bundle  # noqa: E402
from device_runtime.engine import OnnxBackend, preprocess  # noqa: E402
from exporter._build import BuildSpec, build_bundle  # noqa: E402
from exporter.cli import main  # noqa: E402
from exporter._datasets import FASHION_MNIST_DIR  # noqa: E402
from tests.conftest import PHOTOS, TEST_SPLITS  # noqa: E402

CHAIN_ID = "+".join(TEST_SPLITS)  # features_4_conv_2+features_14_conv_2
SMALL = ["exporter.zoo:fmnist_vgg", "--input-shape", "1,28,28"]  # random weights where accuracy does not matter
SMALL_CUTS = ("_6", "_13", "_19")  # 16x14x14, 32x7x7, then 128 after the flatten and the first linear layer


@pytest.fixture(scope="module")
def mobilenet_chain(mobilenet_weights: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """MobileNetV2 (real weights) with a layer split and a three-stage chain, built by the command line:
    the bundle and what the build printed."""
    out = tmp_path_factory.mktemp("chain") / "bundle"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["build", "torchvision:mobilenet_v2", "--weights", str(mobilenet_weights),
                     "--splits", TEST_SPLITS[1], "--chain", ",".join(TEST_SPLITS), "--out", str(out)]) == 0
    return out, printed.getvalue()


def test_a_chain_is_one_split_with_its_stages(mobilenet_chain: tuple[Path, str]) -> None:
    out, printed = mobilenet_chain
    data = json.loads((out / MANIFEST_NAME).read_text())
    assert data["schema_version"] == 3  # a chain needs 2; its heads taking pixels (the fold) need 3
    bundle = Bundle.load(out)
    manifest = bundle.manifest
    assert [s.id for s in manifest.splits] == [TEST_SPLITS[1], CHAIN_ID]  # --splits and --chain both go in
    layer, chain = manifest.splits
    assert chain.kind == CHAIN and not layer.stages and "stages" not in data["splits"][0]
    first = next(s for s in data["splits"] if s["id"] == CHAIN_ID)
    # What the board sends is the first cut's tensor; the host's stages start from each cut in turn.
    assert chain.tensor == TensorSpec((32, 28, 28), "float32", 32 * 28 * 28 * 4)
    assert chain.position < layer.position and chain.natural and chain.compressive
    assert first["compression_ratio"] == pytest.approx(32 * 28 * 28 / (3 * 224 * 224))
    assert [(s.index, s.cut, s.tensor) for s in chain.stages] == [
        (1, TEST_SPLITS[0], chain.tensor),
        (2, TEST_SPLITS[1], layer.tensor),
    ]
    assert layer.tensor == TensorSpec((160, 7, 7), "float32", 160 * 7 * 7 * 4)
    assert [(a.role, a.format, a.precision, a.path) for a in chain.artifacts] == [
        (HEAD, ONNX, FLOAT32, f"head/{CHAIN_ID}.onnx")]
    assert [[(a.role, a.format, a.precision, a.path) for a in s.artifacts] for s in chain.stages] == [
        [(TAIL, ONNX, FLOAT32, f"stage/{CHAIN_ID}.{k}.onnx")] for k in (1, 2)]
    assert chain.stage_id(2) == f"{CHAIN_ID}#2"
    # The middle stage hands the next cut on under a name of its own; the last gives the logits.
    io_names = [(b.input_name, b.output_name) for b in map(OnnxBackend, map(bundle.stage_artifact, [CHAIN_ID] * 2, (1, 2)))]
    assert io_names == [(CUT, NEXT_CUT), (CUT, LOGITS)]
    assert f"chain {CHAIN_ID}: the board's head, then" in printed
    assert f"stage 1 from {TEST_SPLITS[0]}: takes 32x28x28 (100,352 B per sample)" in printed
    assert f"stage 2 from {TEST_SPLITS[1]}: takes 160x7x7 (31,360 B per sample)" in printed


def _run_chain(bundle: Bundle, split: Split, x: np.ndarray) -> np.ndarray:
    """The board's head, then each stage's ONNX file in turn, as the hosts run them."""
    y = OnnxBackend(bundle.artifact(split.id, HEAD)).run(x)
    for stage in split.stages:
        y = OnnxBackend(bundle.stage_artifact(split.id, stage.index)).run(y)
    return y


def test_head_and_stages_are_the_model_on_photos(mobilenet_chain: tuple[Path, str], photos_dir: Path) -> None:
    skimage_io = pytest.importorskip("skimage.io")
    bundle = Bundle.load(mobilenet_chain[0])
    manifest = bundle.manifest
    frames = [skimage_io.imread(photos_dir / f"{photo}.png")[..., :3] for photo in PHOTOS]
    x = np.concatenate([preprocess(np.ascontiguousarray(f), manifest.model.preprocess) for f in frames])
    full = OnnxBackend(bundle.artifact(LOCAL, "full"))
    chain = manifest.split(CHAIN_ID)
    for batch in (x[:1], x[1:2], x):  # batch 1 and batch 4 from the same files
        want, got = full.run(batch), _run_chain(bundle, chain, batch)
        assert got.shape == want.shape == (len(batch), 1000)
        assert float(np.abs(got - want).max()) <= 1e-4
        assert got.argmax(1).tolist() == want.argmax(1).tolist()
    labels = [manifest.model.labels[i] for i in full.run(x).argmax(1)]
    assert labels[0] == "espresso" and labels[1] in {"Egyptian cat", "tabby", "tiger cat"}  # real weights, real photos


def test_a_host_slice_keeps_the_stages_and_a_board_slice_their_shape(
    mobilenet_chain: tuple[Path, str], tmp_path: Path
) -> None:
    source = Bundle.load(mobilenet_chain[0]).manifest.split(CHAIN_ID)
    host = slice_bundle(mobilenet_chain[0], tmp_path / "host", "host").manifest.split(CHAIN_ID)
    assert host.artifacts == () and host.stages == source.stages
    hosted = Bundle.load(tmp_path / "host")
    assert [hosted.stage_artifact(CHAIN_ID, k).is_file() for k in (1, 2)] == [True, True]
    assert not (tmp_path / "host" / "head").exists()

    board = slice_bundle(mobilenet_chain[0], tmp_path / "board", "board").manifest.split(CHAIN_ID)
    assert board.artifacts == source.artifacts
    assert [(s.index, s.cut, s.tensor, s.artifacts) for s in board.stages] == [
        (s.index, s.cut, s.tensor, ()) for s in source.stages]
    assert Bundle.load(tmp_path / "board").artifact(CHAIN_ID, HEAD).is_file()
    assert not (tmp_path / "board" / "stage").exists()


@pytest.fixture(scope="module")
def four_stages(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A four-stage chain of the small network trained on Fashion-MNIST (random weights answer one
    class for every image, which would measure nothing), with an int8 head: calibrated on
    Fashion-MNIST's training images, measured on those held out of calibration."""
    if not (FASHION_MNIST_DIR / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip("Fashion-MNIST missing")
    weights = request.getfixturevalue("trained")[1]  # asked for only where the data is: it trains on it
    out = tmp_path_factory.mktemp("four") / "bundle"
    build_bundle(BuildSpec(SMALL[0], weights=weights, input_shape=(1, 28, 28), splits=(), chains=[SMALL_CUTS], quantize_from="fashion-mnist:train"), out, progress=False)
    return out


def test_four_stages_are_the_model(four_stages: Path) -> None:
    bundle = Bundle.load(four_stages)
    (chain,) = bundle.manifest.splits
    assert chain.id == "+".join(SMALL_CUTS) and chain.kind == CHAIN
    assert [(s.index, s.cut, s.tensor.shape) for s in chain.stages] == [
        (1, "_6", (16, 14, 14)), (2, "_13", (32, 7, 7)), (3, "_19", (128,))]
    rng = np.random.default_rng(1)
    full = OnnxBackend(bundle.artifact(LOCAL, "full"))
    for batch in (1, 3, 8):
        x = rng.standard_normal((batch, 1, 28, 28), dtype=np.float32)
        assert float(np.abs(_run_chain(bundle, chain, x) - full.run(x)).max()) <= 1e-4


def test_a_chain_has_int8_heads_and_measured_accuracy(four_stages: Path) -> None:
    manifest = Bundle.load(four_stages).manifest
    (chain,) = manifest.splits
    assert chain.quantization is not None and chain.quantization.dtype == "uint8"  # the board's link: the first cut
    heads = {(a.format, a.precision): a for a in chain.artifacts if a.role == HEAD}
    assert set(heads) == {(ONNX, FLOAT32), (ONNX, INT8)} and heads[ONNX, INT8].path == f"head/{chain.id}.int8.onnx"
    assert manifest.model.accuracy_on == "top-1 on 500 labelled images of fashion-mnist:train (held out)"
    full = {(a.format, a.precision): a.accuracy for a in manifest.full}
    assert manifest.model.accuracy > 0.7
    # The float32 head through every stage is the float32 model, so they score alike on the same images
    # (a borderline image may go either way); the int8 head sends uint8 to stage 1 and costs little.
    assert chain.accuracy == heads[ONNX, FLOAT32].accuracy == pytest.approx(full[ONNX, FLOAT32], abs=2 / 500)
    assert heads[ONNX, INT8].accuracy >= heads[ONNX, FLOAT32].accuracy - 0.02


def test_a_bundle_without_chains_is_still_schema_1(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    assert main(["build", *SMALL, "--splits", "_13", "--out", str(out)]) == 0
    data = json.loads((out / MANIFEST_NAME).read_text())
    assert data["schema_version"] == 1
    (split,) = data["splits"]
    assert split["kind"] == "layer" and "stages" not in split
    assert sorted(split) == ["accuracy", "artifacts", "compression_ratio", "compressive", "cui", "id", "kind",
                             "natural", "position", "quantization", "tensor"]
    assert [a["path"] for a in split["artifacts"]] == ["head/_13.onnx", "tail/_13.onnx"]
    assert Bundle.load(out).manifest.schema_version == 1


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--chain", "_13,_6"],
         "chain _13,_6: cuts out of graph order; a chain runs from the input on, so name them as _6,_13"),
        (["--chain", "_6,_13,_6"], "chain _6,_13,_6: names _6 twice; each cut of a chain comes once"),
        (["--splits", "_13", "--chain", "_6"],
         "chain _6: a chain needs two cuts or more (one cut is a layer split: give it to --splits)"),
        (["--chain", "_6,_99"], "chain _6,_99: '_99' is not a valid cut point; "),
        ([], "build needs --splits (auto or cut ids), --chain ID,ID[,ID...], or both"),
    ],
    ids=["order", "twice", "single", "unknown", "neither"],
)
def test_a_chain_refused_in_one_line(argv: list[str], message: str, tmp_path: Path, capsys) -> None:
    assert main(["build", *SMALL, *argv, "--out", str(tmp_path / "bundle")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"split-export: error: {message}") and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []  # no bundle, no staging left behind
