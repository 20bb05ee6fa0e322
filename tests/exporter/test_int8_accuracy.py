"""Every int8 build says what int8 costs, and a set too small to say it is refused up front.

Without ``--test-data``, some calibration images are held out of the calibration and every
variant is measured on them: top-1 against their labels where the folders name the model's
labels, else top-1 agreement with the float32 model. The model is a small RGB network
written in the test (random weights, seeded); the images are crops of the scikit-image photos.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from device_runtime.bundle import FLOAT32, FULL, HEAD, INT8, MANIFEST_NAME, ONNX, Bundle  # noqa: E402
from exporter import BuildSpec, build_bundle  # noqa: E402
from exporter._quantize import MIN_CALIBRATION_SAMPLES, MIN_HELD_OUT  # noqa: E402
from splitedge.errors import ExportError  # noqa: E402
from tests.exporter.test_preprocessing import FACTORY  # noqa: E402

PHOTO_OF = {"cat": "chelsea", "coffee": "coffee", "rocket": "rocket"}


@pytest.fixture
def factory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "mynet.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "mynet:make"


def crops(photos_dir: Path, out: Path, folders: dict[str, str], per_folder: int, seed: int = 0) -> Path:
    """``per_folder`` random crops (a quarter to all of each side) of each folder's photo, as PNG."""
    io = pytest.importorskip("skimage.io")
    rng = np.random.default_rng(seed)
    for folder, photo in folders.items():
        image = io.imread(photos_dir / f"{photo}.png")[..., :3]
        h, w = image.shape[:2]
        (out / folder).mkdir(parents=True)
        for i in range(per_folder):
            ch, cw = rng.integers(h // 4, h + 1), rng.integers(w // 4, w + 1)
            y, x = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
            io.imsave(out / folder / f"{i}.png", np.ascontiguousarray(image[y : y + ch, x : x + cw]), check_contrast=False)
    return out


def accuracies(manifest) -> dict[tuple[str, str, str], float | None]:
    found = {(FULL, a.format, a.precision): a.accuracy for a in manifest.full}
    for split in manifest.splits:
        found |= {(split.id, a.format, a.precision): a.accuracy for a in split.artifacts if a.role == HEAD}
    return found


def test_folders_named_after_labels_measure_top1_on_held_out_images(factory, photos_dir: Path, tmp_path: Path) -> None:
    data = crops(photos_dir, tmp_path / "calib", PHOTO_OF, per_folder=30)  # 90 images: 58 calibrate, 32 held out
    manifest = build_bundle(BuildSpec(factory, splits=["a"], quantize_from=str(data)), tmp_path / "bundle", progress=False)
    assert manifest.model.accuracy_on == f"top-1 on {MIN_HELD_OUT} labelled images of {data} (held out)"
    measured = accuracies(manifest)
    assert set(measured) == {(FULL, ONNX, FLOAT32), (FULL, ONNX, INT8), ("a", ONNX, FLOAT32), ("a", ONNX, INT8)}
    assert all(value is not None and 0 <= value <= 1 for value in measured.values()), measured
    # The float head followed by its tail is the full model (1e-4), so they score alike on the same images.
    assert measured["a", ONNX, FLOAT32] == pytest.approx(measured[FULL, ONNX, FLOAT32], abs=1 / MIN_HELD_OUT)
    assert manifest.model.accuracy == measured[FULL, ONNX, FLOAT32]
    assert Bundle.load(tmp_path / "bundle").manifest == manifest


def test_unlabelled_calibration_images_measure_agreement_with_float32(factory, photos_dir: Path, tmp_path: Path) -> None:
    data = crops(photos_dir, tmp_path / "calib", {"misc": "astronaut", "more": "coffee"}, per_folder=40)
    manifest = build_bundle(BuildSpec(factory, splits=["a"], quantize_from=str(data), calibration_samples=40), tmp_path / "bundle", progress=False)
    assert manifest.model.accuracy_on.startswith("top-1 agreement with the float32 ONNX model on 40 unlabelled images")
    assert manifest.model.accuracy is None  # the float model agreeing with itself says nothing
    measured = accuracies(manifest)
    assert measured[FULL, ONNX, FLOAT32] == 1.0  # the labels are its own answers
    assert 0 <= measured[FULL, ONNX, INT8] <= 1 and 0 <= measured["a", ONNX, INT8] <= 1


def test_a_calibration_set_too_small_says_what_it_needs_and_leaves_the_old_bundle(
    factory, photos_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from exporter.cli import main

    out = tmp_path / "bundle"
    assert main(["build", factory, "--splits", "a", "--out", str(out)]) == 0
    before = (out / MANIFEST_NAME).read_text()
    data = crops(photos_dir, tmp_path / "calib", PHOTO_OF, per_folder=15)  # 45 < 32 + 32
    capsys.readouterr()
    assert main(["build", factory, "--splits", "a", "--out", str(out), "--quantize", "int8",
                 "--calib-data", str(data)]) == 2
    need = MIN_CALIBRATION_SAMPLES + MIN_HELD_OUT
    assert capsys.readouterr().err.strip() == (
        f"split-export: error: --calib-data {data} has 45 images; int8 needs at least {need}: "
        f"{MIN_CALIBRATION_SAMPLES} to calibrate on and {MIN_HELD_OUT} held out to measure int8's accuracy (or give "
        "--test-data to measure on, and all of them calibrate); add images to it, or point --calib-data at a larger set")
    assert (out / MANIFEST_NAME).read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle", "calib", "mynet.py"]  # no staging left
    assert main(["build", factory, "--splits", "a", "--out", str(out), "--quantize", "int8",
                 "--calib-data", str(data), "--calib-samples", "8"]) == 2
    assert "--calib-samples 8: int8 calibration needs at least 32" in capsys.readouterr().err


def test_a_build_that_fails_midway_leaves_the_last_good_bundle(
    factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import exporter._build

    out = tmp_path / "bundle"
    good = build_bundle(BuildSpec(factory, splits=["a"]), out, progress=False)
    real = exporter._build.validate

    def failing_on_the_tail(runner, cases, atol, what):
        if "followed by tail" in what:
            raise ExportError(f"{what}: differs from the model")
        return real(runner, cases, atol, what)

    monkeypatch.setattr(exporter._build, "validate", failing_on_the_tail)
    with pytest.raises(ExportError, match="followed by tail"):
        build_bundle(BuildSpec(factory, splits=["a", "b"]), out, progress=False)
    assert Bundle.load(out).manifest == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle", "mynet.py"]
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert [s["id"] for s in manifest["splits"]] == ["a"]
