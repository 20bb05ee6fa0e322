"""``split-export analyze``: the report, its schema, its plots, and its errors, on real data."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from exporter._analysis import AnalysisSpec, analyze  # noqa: E402
from exporter.cli import main  # noqa: E402
from exporter._datasets import FASHION_MNIST_DIR, DataError, load_images, read_synonyms  # noqa: E402
from exporter._models import IMAGENET_PREPROCESS, load_model  # noqa: E402
from exporter._report_schema import ReportError, read_report  # noqa: E402
from exporter.zoo import fmnist_vgg  # noqa: E402

HAVE_FMNIST = (FASHION_MNIST_DIR / "t10k-images-idx3-ubyte.gz").is_file()
needs_fmnist = pytest.mark.skipif(not HAVE_FMNIST, reason="Fashion-MNIST is not installed (make test installs it)")
PHOTO_CLASSES = {"coffee": "espresso", "chelsea": "Egyptian cat", "astronaut": "bobsled", "rocket": "drilling platform"}


@pytest.fixture(scope="module")
def imagenet_folder(photos_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The photos as a class-folder data set named after ImageNet classes."""
    root = tmp_path_factory.mktemp("imagenet-photos")
    for photo, label in PHOTO_CLASSES.items():
        (root / label).mkdir()
        shutil.copy(photos_dir / f"{photo}.png", root / label / f"{photo}.png")
    return root


@pytest.fixture(scope="module")
def fmnist_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An *untrained* but seeded fmnist_vgg state dict: analysis must not care whether weights are good."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("w") / "fmnist_vgg.pt"
    torch.save(fmnist_vgg().state_dict(), path)
    return path


def test_mobilenet_v2_end_to_end_on_photos(imagenet_folder, mobilenet_weights, tmp_path, capsys) -> None:
    out = tmp_path / "report"
    assert main(["analyze", "torchvision:mobilenet_v2", "--weights", str(mobilenet_weights),
                 "--data", str(imagenet_folder), "--classes", "espresso,bobsled", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "recommended cut (global CUI maximum):" in printed and "top-1 accuracy 1.000" in printed
    report = read_report(out / "points.json")  # validates the schema on read
    assert report["data"]["images"] == 4 and report["data"]["accuracy"] == 1.0
    assert report["data"]["class_subset"] == ["bobsled", "espresso"]
    assert set(report["data"]["images_per_class"]) == set(PHOTO_CLASSES.values())
    assert len(report["points"]) == 72 and report["choices"]["score"] == "logit"
    assert report["summary"]["compressive"] == [
        "features_2_conv_2", "features_4_conv_2", "features_7_conv_2", "features_14_conv_2", "adaptive_avg_pool2d",
    ]
    for point in report["points"]:
        assert point["bytes_per_sample"]["float32"] == 4 * point["bytes_per_sample"]["uint8"]
        assert point["head"]["macs"] + point["tail"]["macs"] == report["model"]["macs"]
    assert report["model"]["macs"] == pytest.approx(300e6, rel=0.03)  # MobileNetV2: ~300 M MACs
    assert report["model"]["parameters"] == 3_504_872
    for name in ("cui_curve.png", "cui_per_class.png", "head_cost.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # MobileNetV2's inverted residuals add: the CUI's pick is weak evidence, and said to be.
    summary = report["summary"]
    assert summary["recommended_evidence"].startswith("weak: on a residual network")
    assert f"  evidence: {summary['recommended_evidence']}" in printed
    recommended = summary["recommended"]
    assert summary["recommended_in_auto"] == (recommended in summary["compressive"])
    if not summary["recommended_in_auto"]:
        assert summary["recommended_auto_note"].startswith(f"build --splits auto does not export {recommended}: ")
        assert summary["recommended_auto_note"].endswith(f"--splits {recommended}")
    assert summary["blocks"]["block_compressive"] == 5 and "at block level" in printed


def test_vgg16_bottlenecks_from_the_layer_shapes(imagenet_folder, tmp_path) -> None:
    report = analyze(AnalysisSpec("torchvision:vgg16", str(imagenet_folder)), tmp_path, progress=False)
    x = 3 * 224 * 224
    # VGG16's feature maps by hand: (channels, side) after each block's convs and its pool.
    sizes = {"features_4": 64 * 112**2, "features_9": 128 * 56**2, "features_16": 256 * 28**2,
             "features_23": 512 * 14**2, "features_30": 512 * 7**2, "classifier_0": 4096}
    by_id = {p["id"]: p for p in report["points"]}
    for cut_id, size in sizes.items():
        assert by_id[cut_id]["bytes_per_sample"]["uint8"] == size
        assert by_id[cut_id]["natural"] == (size < x)
    # Eq. 3: natural and smaller than every earlier cut. 256x28x28 > x; 512x14x14 is the first below it.
    assert report["summary"]["compressive"] == ["features_23", "features_30", "classifier_0"]
    natural = [p["id"] for p in report["points"] if p["natural"]]
    assert natural[0] == "features_23" and all(by_id[i]["compression_ratio"] < 1 for i in natural)


@needs_fmnist
def test_class_subset_curve_is_the_mean_of_its_classes(trained, tmp_path) -> None:
    report = analyze(AnalysisSpec("exporter.zoo:fmnist_vgg", "fashion-mnist", weights=trained[1], classes="5,7,9",
                                  images=300, input_shape=(1, 28, 28)), tmp_path, progress=False)
    assert report["data"]["class_subset"] == ["Sandal", "Sneaker", "Ankle boot"]
    assert set(report["data"]["images_per_class"].values()) == {30}
    for point in report["points"]:
        per_class = point["cui"]["per_class"]
        expected = np.mean([per_class[c] for c in ("Sandal", "Sneaker", "Ankle boot")])
        assert point["cui"]["subset"] == pytest.approx(expected, rel=1e-9)
        assert point["cui"]["global"] == pytest.approx(np.mean(list(per_class.values())), rel=1e-9)
    assert report["data"]["accuracy"] > 0.7  # a trained model, so the classes' curves mean something
    # Footwear is not the average garment: the subset's curve departs from the global one.
    assert any(p["cui"]["subset"] != pytest.approx(p["cui"]["global"], rel=0.05) for p in report["points"])


@needs_fmnist
@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (dict(classes=","), "--classes is empty"),
        (dict(classes="Sandal,Unicorn"), "unknown class 'Unicorn'"),
        (dict(classes="12"), "unknown class '12'"),
    ],
)
def test_bad_class_subsets(fmnist_weights, tmp_path, arguments, message) -> None:
    with pytest.raises(DataError, match=message):
        analyze(AnalysisSpec("exporter.zoo:fmnist_vgg", "fashion-mnist", weights=fmnist_weights, images=20,
                             input_shape=(1, 28, 28), **arguments), tmp_path, progress=False)


@needs_fmnist
def test_images_that_do_not_fit_the_model(mobilenet_weights, tmp_path) -> None:
    with pytest.raises(DataError, match=r"images are 1x28x28 but the model takes 3x224x224 \(wrong channel count\)"):
        analyze(AnalysisSpec("torchvision:mobilenet_v2", "fashion-mnist", weights=mobilenet_weights), tmp_path,
                progress=False)


def test_npz_errors(tmp_path, fmnist_weights) -> None:
    spec = dict(weights=fmnist_weights, input_shape=(1, 28, 28))
    labels_out = tmp_path / "labels.npz"
    np.savez(labels_out, x=np.zeros((4, 1, 28, 28), np.float32), y=np.array([0, 1, 12, 3]))
    with pytest.raises(DataError, match=r"labels \[12\] are outside the model's 10 outputs"):
        analyze(AnalysisSpec("exporter.zoo:fmnist_vgg", str(labels_out), **spec), tmp_path, progress=False)
    wrong_size = tmp_path / "size.npz"
    np.savez(wrong_size, x=np.zeros((4, 1, 32, 32), np.float32), y=np.zeros(4, int))
    with pytest.raises(DataError, match=r"images are 1x32x32 but the model takes 1x28x28 \(wrong size\)"):
        analyze(AnalysisSpec("exporter.zoo:fmnist_vgg", str(wrong_size), **spec), tmp_path, progress=False)
    missing = tmp_path / "missing.npz"
    np.savez(missing, images=np.zeros(3))
    with pytest.raises(DataError, match="needs arrays 'x' and 'y'"):
        analyze(AnalysisSpec("exporter.zoo:fmnist_vgg", str(missing), **spec), tmp_path, progress=False)


def test_folder_errors(tmp_path, fmnist_weights) -> None:
    (tmp_path / "empty" / "tabby").mkdir(parents=True)
    with pytest.raises(DataError, match="class folders hold no images"):
        analyze(AnalysisSpec("torchvision:mobilenet_v2", str(tmp_path / "empty")), tmp_path / "r", progress=False)
    (tmp_path / "flat").mkdir()
    with pytest.raises(DataError, match="no class sub-folders"):
        analyze(AnalysisSpec("torchvision:mobilenet_v2", str(tmp_path / "flat")), tmp_path / "r", progress=False)
    with pytest.raises(DataError, match="not 'fashion-mnist', a folder"):
        analyze(AnalysisSpec("torchvision:mobilenet_v2", str(tmp_path / "nowhere")), tmp_path / "r", progress=False)


def test_class_folders_must_name_the_models_labels(photos_dir: Path, tmp_path: Path) -> None:
    """Folders named loosely match ("egyptian_cat"); a folder matching no label is an error naming it,
    never classes 0, 1, 2 of the model with an accuracy of 0.000."""
    for folder, photo in (("Espresso", "coffee"), ("egyptian_cat", "chelsea"), ("cat", "chelsea"),
                          ("rocket", "rocket")):
        (tmp_path / "data" / folder).mkdir(parents=True)
        shutil.copy(photos_dir / f"{photo}.png", tmp_path / "data" / folder)
    with pytest.raises(DataError) as info:
        analyze(AnalysisSpec("torchvision:mobilenet_v2", str(tmp_path / "data")), tmp_path / "r", progress=False)
    message = str(info.value)
    assert "class folder(s) cat/" in message and "rocket/" in message and "Espresso" not in message
    assert "match no label of the model (1000 classes, e.g. 'tench', 'goldfish', 'great white shark')" in message
    assert not (tmp_path / "r").exists()
    shutil.rmtree(tmp_path / "data" / "cat")
    shutil.rmtree(tmp_path / "data" / "rocket")
    images = load_images(str(tmp_path / "data"), (3, 224, 224), IMAGENET_PREPROCESS,
                         load_model("torchvision:mobilenet_v2").categories)
    assert sorted(images.classes[i] for i in set(images.y.tolist())) == ["Egyptian cat", "espresso"]
    with pytest.raises(DataError, match=r"^--classes espresso,tabby: no images of 'tabby' in .*: a CUI curve needs"):
        analyze(AnalysisSpec("torchvision:mobilenet_v2", str(tmp_path / "data"), classes="espresso,tabby"),
                tmp_path / "r", progress=False)


def test_report_schema_refuses_a_broken_report(tmp_path) -> None:
    path = tmp_path / "points.json"
    path.write_text(json.dumps({"schema": "splitedge.points/1", "points": []}))
    with pytest.raises(ReportError, match="does not follow splitedge.points/1: root: 'model' is a required property"):
        read_report(path)


def test_a_synonyms_file_names_the_label_of_a_folder(photos_dir: Path, tmp_path: Path) -> None:
    """``cat/`` matches no ImageNet label; ``cat = tabby`` in a synonyms file says which it holds."""
    for folder, photo in (("cat", "chelsea"), ("Espresso", "coffee")):
        (tmp_path / "data" / folder).mkdir(parents=True)
        shutil.copy(photos_dir / f"{photo}.png", tmp_path / "data" / folder)
    categories = load_model("torchvision:mobilenet_v2").categories
    synonyms = tmp_path / "synonyms.txt"
    synonyms.write_text("# folder = label\ncat = Tabby  # case as folders\n")
    images = load_images(str(tmp_path / "data"), (3, 224, 224), IMAGENET_PREPROCESS, categories,
                         synonyms=read_synonyms(synonyms, categories))
    assert sorted(images.classes[i] for i in images.y.tolist()) == ["espresso", "tabby"] and images.labelled
    synonyms.write_text("cat = tabby\nmug: espresso\n")
    with pytest.raises(DataError, match=rf"^{synonyms}:2: expected NAME = LABEL, got 'mug: espresso'$"):
        read_synonyms(synonyms, categories)
    synonyms.write_text("cat = housecat\n")
    with pytest.raises(DataError, match=rf"^{synonyms}:1: 'housecat' is not a label of the model \(1000 classes\)$"):
        read_synonyms(synonyms, categories)
    # Unlabelled (calibration) images from folders that name no label are pixels, and say so.
    assert not load_images(str(tmp_path / "data"), (3, 224, 224), IMAGENET_PREPROCESS, categories,
                           labelled=False).labelled
