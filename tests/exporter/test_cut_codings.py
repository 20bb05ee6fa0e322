"""``split-export build --cut-bits``: k-bit cut codings calibrated, measured and recorded (issue 47).

The model is the small RGB network of the preprocessing tests (random weights, seeded), cut at
``a`` and ``b`` and chained through both; the images are crops of the scikit-image photos, so
each build takes seconds. What is checked runs the bundle's own ONNX files with onnxruntime and
the wire's own coding, and recomputes what the build recorded.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from device_runtime.bundle import CUT_BITS, FLOAT32, HEAD, MANIFEST_NAME, ONNX, TAIL, Bundle, artifacts_of  # noqa: E402
from device_runtime.wire.coding import CutCoding, packed_bytes  # noqa: E402
from exporter import BuildSpec, build_bundle  # noqa: E402
from exporter._codings import CURVE_JSON, CURVE_PNG, REPORT_DIR, read_curve  # noqa: E402
from exporter._datasets import load_images  # noqa: E402
from exporter._fold import pixels  # noqa: E402
from exporter._models import load_model  # noqa: E402
from exporter._quantize import calibration_sets  # noqa: E402
from exporter._validate import OnnxRunner  # noqa: E402
from exporter.cli import main  # noqa: E402
from splitedge.errors import ExportError  # noqa: E402
from tests.exporter.conftest import FACTORY_NAME  # noqa: E402
from tests.exporter.test_int8_accuracy import PHOTO_OF, crops  # noqa: E402

BITS = (8, 4, 2)
SAMPLES = 40  # calibration images; as many again are held out to measure on


@pytest.fixture(scope="module")
def calib(photos_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """80 unlabelled crops (folders no label names): 40 calibrate, 40 held out measure agreement."""
    return crops(photos_dir, tmp_path_factory.mktemp("calib") / "calib", {"misc": "astronaut", "more": "coffee"}, 40)


@pytest.fixture(scope="module")
def coded(factory: str, calib: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A ``--cut-bits 8,4,2`` build through the command line, with its ``--json`` summary."""
    out = tmp_path_factory.mktemp("coded") / "bundle"
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        status = main(["build", factory, "--splits", "a,b", "--chain", "a,b", "--cut-bits", "8,4,2",
                       "--calib-data", str(calib), "--calib-samples", str(SAMPLES), "--out", str(out), "--json"])
    assert status == 0, stderr.getvalue()
    return out, json.loads(stdout.getvalue())


def held_out_pixels(factory: str, calib: Path) -> np.ndarray:
    """The images the build held out of calibration, as its artifacts take them (pixels)."""
    loaded = load_model(factory, for_board=True)
    images = load_images(str(calib), loaded.input_shape, loaded.preprocess, loaded.categories, labelled=False)
    held_out = calibration_sets(images, SAMPLES, True).held_out
    assert held_out is not None and len(held_out) == SAMPLES
    return pixels(held_out.x, loaded.preprocess)


def run(path: Path, x: np.ndarray) -> np.ndarray:
    runner = OnnxRunner(path)
    return next(iter(runner({runner.input_names[0]: x}).values()))


def hosts(root: Path, split, cut: np.ndarray) -> np.ndarray:
    """The logits of a split's tail, or of a chain's stages one after the other, from ``cut``."""
    for artifact in (a for a in artifacts_of(split) if a.role == TAIL):
        cut = run(root / artifact.path, cut)
    return cut


def float_head(split):
    return next(a for a in split.artifacts if a.role == HEAD and a.format == ONNX and a.precision == FLOAT32)


def test_every_split_lists_its_codings_most_bits_first_fewer_bits_never_more_bytes(coded) -> None:
    root, _ = coded
    manifest = Bundle.load(root).manifest
    assert [s.id for s in manifest.splits] == ["a", "b", "a+b"]
    for split in manifest.splits:
        assert [c.name for c in split.codings] == ["k8", "k4", "k2"]
        values = math.prod(split.tensor.shape)
        sizes = [c.bytes_per_sample for c in split.codings]
        assert sizes == [packed_bytes(values, c.bits) for c in split.codings] == sorted(sizes, reverse=True)
        assert sizes[0] * 4 == split.tensor.bytes_per_sample  # k8: a byte a value, float32 four
        for c in split.codings:  # held-out images without labels of the model's: agreement, never top-1
            assert c.top1 is None and c.agreement is not None and 0 <= c.agreement <= 1
            assert len(c.scale) == len(c.zero) == split.tensor.shape[0]
    # A chain's codings are its first cut's, as a layer split's at that cut: same head, same images.
    assert manifest.split("a+b").codings == manifest.split("a").codings


def test_each_coding_gives_back_the_heads_real_output_within_half_a_step(coded, factory: str, calib: Path) -> None:
    root, _ = coded
    x = held_out_pixels(factory, calib)  # never calibrated on
    for split in Bundle.load(root).manifest.splits:
        cut = run(root / float_head(split).path, x)
        for spec in split.codings:
            coding = CutCoding.of(spec)
            view = (1, -1) + (1,) * (cut.ndim - 2)
            scale, zero = coding.scale.reshape(view), coding.zero.astype(np.float32).reshape(view)
            low, high = -zero * scale, ((1 << coding.bits) - 1 - zero) * scale  # the calibrated range per channel
            inside = (cut >= low) & (cut <= high)
            back = coding.decode(coding.encode(cut), cut.shape)
            error = np.abs(back - cut)
            assert (error <= np.broadcast_to(scale, cut.shape) * (0.5 + 1e-4))[inside].all(), (split.id, spec.name)
            # Outside the range a value saturates at its end, no further: it is never wrapped round.
            assert (back >= low - 1e-6).all() and (back <= high + 1e-6).all(), (split.id, spec.name)
            # Clipped ranges (2 bits keep as little as 40 % of a channel's) still hold most values: not vacuous.
            assert inside.mean() > 0.5, (split.id, spec.name, inside.mean())


def test_the_recorded_agreement_is_what_the_exported_files_and_the_coding_give(coded, factory: str,
                                                                              calib: Path) -> None:
    root, summary = coded
    x = held_out_pixels(factory, calib)
    manifest = Bundle.load(root).manifest
    expected = run(root / "full/model.onnx", x).argmax(1)  # the float32 model's answers are the labels
    curves = {s["id"]: {p["coding"]: p for p in s["curve"]} for s in summary["splits"]}
    for split in manifest.splits:
        cut = run(root / float_head(split).path, x)
        for spec in split.codings:
            coding = CutCoding.of(spec)
            answers = hosts(root, split, coding.decode(coding.encode(cut), cut.shape)).argmax(1)
            assert spec.agreement == pytest.approx((answers == expected).mean(), abs=1e-12), (split.id, spec.name)
            assert curves[split.id][spec.name]["accuracy"] == spec.agreement
        # The curve's float32 point is the float32 head's own recorded figure, on the same images.
        assert curves[split.id]["float32"]["accuracy"] == float_head(split).accuracy
        assert curves[split.id]["float32"]["bytes_per_sample"] == split.tensor.bytes_per_sample
        assert curves[split.id]["uint8"]["bytes_per_sample"] == math.prod(split.tensor.shape)


def test_the_curve_is_in_the_summary_and_the_bundles_report(coded) -> None:
    root, summary = coded
    curve = read_curve(root)
    assert curve is not None and curve.metric == "agreement" == summary["curve_metric"]
    assert curve.measured_on == Bundle.load(root).manifest.model.accuracy_on
    assert [c.split for c in curve.splits] == [s["id"] for s in summary["splits"]]
    for split_curve, split in zip(curve.splits, summary["splits"]):
        assert [p.coding for p in split_curve.points] == ["float32", "uint8", "k8", "k4", "k2"]
        assert [p["coding"] for p in split["curve"]] == ["float32", "uint8", "k8", "k4", "k2"]
    assert json.loads((root / REPORT_DIR / CURVE_JSON).read_text())["schema"] == "splitedge.codings/1"
    assert (root / REPORT_DIR / CURVE_PNG).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cut_bits_beside_int8_adds_the_codings_and_changes_nothing_else(factory: str, photos_dir: Path,
                                                                         tmp_path: Path) -> None:
    """With labelled --test-data, top-1; and the bundle otherwise byte for byte the one a build
    without --cut-bits writes, which has no codings, no ``codings`` key and no report."""
    calib = crops(photos_dir, tmp_path / "calib", PHOTO_OF, per_folder=12)
    test = crops(photos_dir, tmp_path / "test", PHOTO_OF, per_folder=6, seed=1)
    spec = BuildSpec(factory, splits=["b"], quantize_from=str(calib), calibration_samples=32, test_data=str(test))
    plain = build_bundle(spec, tmp_path / "plain", progress=False)
    coded = build_bundle(replace(spec, cut_bits=(4, 8)), tmp_path / "coded", progress=False)
    assert [c.name for c in coded.splits[0].codings] == ["k8", "k4"]
    assert all(c.top1 is not None and c.agreement is None for c in coded.splits[0].codings)
    assert read_curve(tmp_path / "coded").metric == "top1"
    assert plain.splits[0].codings == () and read_curve(tmp_path / "plain") is None
    assert "codings" not in json.loads((tmp_path / "plain" / MANIFEST_NAME).read_text())["splits"][0]
    stripped = replace(coded, splits=tuple(replace(s, codings=()) for s in coded.splits), bundle_id="",
                       manifest_sha256="")
    assert stripped == replace(plain, bundle_id="", manifest_sha256="")
    assert not (tmp_path / "plain" / REPORT_DIR).exists()


@pytest.mark.parametrize("value", ["5", "8,5", "", "4,x", "16"])
def test_a_bad_cut_bits_is_refused_in_one_line_naming_the_widths(value: str, capsys, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["build", FACTORY_NAME, "--splits", "a", "--cut-bits", value, "--out", str(tmp_path / "b")])
    assert exited.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (f"split-export build: error: argument --cut-bits: {value!r}: bits a value, comma separated, "
                    f"some of {', '.join(map(str, CUT_BITS))}")
    assert not (tmp_path / "b").exists()


def test_cut_bits_without_calibration_images_says_which_flag_gives_them(capsys, tmp_path: Path) -> None:
    assert main(["build", FACTORY_NAME, "--splits", "a", "--cut-bits", "4", "--out", str(tmp_path / "b")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "split-export: error: --cut-bits needs --calib-data (or --train-data) to calibrate the codings on"]
    with pytest.raises(ExportError, match=r"^cut bits 5: a cut coding has 8, 6, 4, 3, 2 bits a value$"):
        build_bundle(BuildSpec(FACTORY_NAME, splits=["a"], cut_bits=(5,), calib_data="x"), tmp_path / "c")


def test_codings_taken_from_the_training_data_are_calibrated_on_its_training_split(monkeypatch, tmp_path) -> None:
    """A bare ``fashion-mnist`` read alone is its test split, which accuracy is measured on: given
    as ``--train-data`` with no ``--calib-data``, the codings and int8 calibrate on its training split."""
    from exporter import cli

    class Built(BaseException):
        """The spec reached the build: nothing is built."""

    seen = []

    def build(spec, *args, **kwargs):
        seen.append(spec)
        raise Built

    monkeypatch.setattr("exporter._build.build_bundle", build)
    with pytest.raises(Built):
        cli.main(["build", "torchvision:mobilenet_v2", "--splits", "features_14_conv_2", "--bottleneck", "ae",
                  "--train-data", "fashion-mnist", "--cut-bits", "4", "--quantize", "int8", "--out", str(tmp_path / "b")])
    assert seen and (seen[0].calib_data, seen[0].quantize_from) == ("fashion-mnist:train", "fashion-mnist:train")
