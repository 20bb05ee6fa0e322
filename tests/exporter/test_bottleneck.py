"""I-SPLIT bottleneck injection: exact shapes, and a short Fashion-MNIST training that keeps accuracy."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from device_runtime.bundle import Bundle  # noqa: E402
from device_runtime.engine._backend import OnnxBackend  # noqa: E402
from exporter._bottleneck import make_autoencoder  # noqa: E402
from exporter.cli import main  # noqa: E402
from exporter._datasets import FASHION_MNIST_DIR, load_images  # noqa: E402

#: The split model may lose at most this much test accuracy against the model it was cut from,
#: with the default recipe (exporter._bottleneck.BottleneckTraining) on 5000 images, at the
#: cuts after the first and second pooling stages (latents of 10%).
ACCURACY_MARGIN = 0.03


@pytest.mark.parametrize(
    "shape", [(32, 112, 112), (24, 56, 56), (160, 7, 7), (64, 3, 3), (1280, 1, 1), (16, 15, 13), (3, 1, 5), (512,)]
)
def test_autoencoder_restores_the_cut_shape_exactly(shape: tuple[int, ...]) -> None:
    ae = make_autoencoder(shape, latent_ratio=0.1)
    h = torch.randn(3, *shape)
    latent = ae.encoder(h)
    assert tuple(latent.shape[1:]) == ae.latent_shape
    assert tuple(ae(h).shape) == (3, *shape)
    ratio = math.prod(ae.latent_shape) / math.prod(shape)
    assert ratio <= 0.1 + 1 / math.prod(ae.latent_shape[1:] or (1,)) or math.prod(ae.latent_shape) == 1


def test_bad_latent_ratio() -> None:
    with pytest.raises(ValueError, match=r"latent ratio must be in \(0, 1\)"):
        make_autoencoder((8, 4, 4), latent_ratio=1.5)


@pytest.mark.skipif(not (FASHION_MNIST_DIR / "t10k-images-idx3-ubyte.gz").is_file(), reason="Fashion-MNIST missing")
def test_injected_bottleneck_keeps_accuracy(trained, tmp_path: Path, capsys) -> None:
    _, weights = trained
    out = tmp_path / "bundle"
    assert main([
        "build", "exporter.zoo:fmnist_vgg", "--weights", str(weights), "--input-shape", "1,28,28",
        "--splits", "_6,_13", "--bottleneck", "ae", "--train-data", "fashion-mnist", "--train-images", "5000",
        "--cut-bits", "8,2", "--out", str(out),
    ]) == 0
    printed = capsys.readouterr().out
    manifest = Bundle.load(out).manifest
    full_accuracy = manifest.model.accuracy
    assert full_accuracy is not None and full_accuracy > 0.7
    assert f"full model {full_accuracy:.4f}" in printed
    assert [s.id for s in manifest.splits] == ["_6_ae", "_13_ae"]
    for split, cut_elements in zip(manifest.splits, (16 * 14 * 14, 32 * 7 * 7)):
        assert split.kind == "bottleneck"
        assert split.tensor.bytes_per_sample == 4 * math.prod(split.tensor.shape)
        assert math.prod(split.tensor.shape) <= 0.11 * cut_elements  # the latent is ~10% of the cut
        assert split.accuracy >= full_accuracy - ACCURACY_MARGIN, (split.id, split.accuracy, full_accuracy)
        # --cut-bits codes the latent, what the board sends, calibrated on --train-data's images and
        # measured on the same labelled test images: eight bits a value keep the float latent's answers.
        blocks = math.ceil(math.prod(split.tensor.shape) / 8)  # eight values fill k bytes
        assert [(c.name, c.bytes_per_sample) for c in split.codings] == [("k8", blocks * 8), ("k2", blocks * 2)]
        assert all(c.agreement is None and 0 <= c.top1 <= 1 for c in split.codings)
        assert split.codings[0].top1 == pytest.approx(split.accuracy, abs=0.01), (split.id, split.codings)
    assert "cut codings: bytes per sample and top-1 on the same images" in printed
    # What the board sends is the latent: head output shape == the manifest's tensor shape.
    test = load_images("fashion-mnist", (1, 28, 28)).subset(200)
    bundle = Bundle.load(out)
    split = manifest.splits[1]
    latent = OnnxBackend(bundle.artifact(split.id, "head")).run(test.x)
    assert latent.shape == (200, *split.tensor.shape)
    logits = OnnxBackend(bundle.artifact(split.id, "tail")).run(latent)
    assert (logits.argmax(1) == test.y).mean() >= full_accuracy - ACCURACY_MARGIN - 0.05  # 200 images: noisier


def test_bottleneck_needs_training_data(tmp_path: Path, capsys) -> None:
    assert main(["build", "exporter.zoo:fmnist_vgg", "--input-shape", "1,28,28", "--splits", "_6",
                 "--bottleneck", "ae", "--out", str(tmp_path)]) == 2
    assert "--bottleneck ae needs --train-data" in capsys.readouterr().err
