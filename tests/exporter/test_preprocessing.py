"""A model carries its preprocessing: the weights', the factory's own, the command line's, and one input shape."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from device_runtime.bundle import Preprocess
from exporter._models import IMAGENET_PREPROCESS, load_model
from exporter._preprocessing import PreprocessFlags, resolve
from splitedge.errors import ModelSpecError

ROOT = Path(__file__).resolve().parents[2]
SPLIT_EXPORT = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin" / "split-export"
WEIGHTS = Preprocess(resize=232, crop=224, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))


def test_later_sources_win_field_by_field_and_say_where_each_came_from() -> None:
    factory = {"mean": [127.0, 127.0, 127.0], "std": [128.0, 128.0, 128.0], "crop": 240, "resize": 260}
    flags = PreprocessFlags(resize=270)
    pre, shape, sources = resolve(WEIGHTS, True, factory, flags, None, "mynet:make")
    assert pre.mean == pytest.approx((127 / 255,) * 3) and pre.std == pytest.approx((128 / 255,) * 3)
    assert (pre.crop, pre.resize, shape) == (240, 270, (3, 240, 240))
    assert sources == {"resize": "the command line", "crop": "mynet:make's splitedge_preprocessing",
                       "mean": "mynet:make's splitedge_preprocessing", "std": "mynet:make's splitedge_preprocessing",
                       "interpolation": "the weights", "color": "the weights"}


def test_an_input_shape_against_a_known_crop_is_refused_for_a_bundle_and_followed_elsewhere() -> None:
    with pytest.raises(ModelSpecError, match=r"^--input-shape 3,240,240 contradicts the crop 224 from the weights: the "
                                             r"board would crop to 224; give --crop 240 \(and --resize\)"):
        resolve(WEIGHTS, True, None, None, (3, 240, 240), "torchvision:x", strict=True)
    pre, shape, _ = resolve(WEIGHTS, True, None, None, (3, 160, 160), "torchvision:x", strict=False)
    assert shape == (3, 160, 160) and pre.crop == 160 and pre.resize == round(160 * 232 / 224)
    # A guess (a factory that says nothing) follows the shape even for a bundle.
    pre, shape, sources = resolve(IMAGENET_PREPROCESS, False, None, None, (3, 96, 96), "mynet:make", strict=True)
    assert (pre.crop, pre.resize, sources["crop"]) == (96, round(96 * 256 / 224), "--input-shape")
    # Said both ways, consistently: accepted.
    pre, shape, _ = resolve(WEIGHTS, True, None, PreprocessFlags(crop=240, resize=274), (3, 240, 240), "x", strict=True)
    assert shape == (3, 240, 240)


@pytest.mark.parametrize("factory, message", [
    ({"crop": 0}, "crop 0: expected a positive number of pixels"),
    ({"mean": [0.5, 0.5]}, "mean has 2 values and std 3: give one per channel"),
    ({"std": [0.0, 1.0, 1.0]}, "std [0.0, 1.0, 1.0]: expected positive numbers"),
    ({"colour": "BGR"}, "unknown preprocessing key(s) colour"),
    ({"resize": 200, "crop": 224}, "resize 200 is smaller than the crop 224"),
])
def test_a_bad_declaration_is_one_line_naming_it(factory: dict, message: str) -> None:
    with pytest.raises(ModelSpecError) as info:
        resolve(WEIGHTS, True, factory, None, None, "mynet:make")
    assert message in str(info.value) and "\n" not in str(info.value)


def test_torchvision_weights_bring_their_preprocessing_and_categories(mobilenet_weights: Path) -> None:
    loaded = load_model("torchvision:mobilenet_v2", mobilenet_weights)  # the V1 release: resize 256
    assert (loaded.preprocess.resize, loaded.preprocess.crop, loaded.input_shape) == (256, 224, (3, 224, 224))
    assert loaded.categories is not None and loaded.categories[0] == "tench" and len(loaded.categories) == 1000



def test_a_vit_is_built_for_the_crop_of_the_weights_it_takes(monkeypatch, tmp_path: Path) -> None:
    """torchvision builds ViT-B/16 for 224 without weights; its SWAG weights are for 384 (577 position
    embeddings): a file of those is loaded into a model built for 384, its input 384 square."""
    shapes = []
    monkeypatch.setattr("exporter._models.load_state_dict",
                        lambda module, path: shapes.append(tuple(module.encoder.pos_embedding.shape)))
    loaded = load_model("torchvision:vit_b_16", tmp_path / "vit_b_16_swag-9ac1b537.pth")  # the file's name picks the entry
    assert shapes == [(1, 577, 768)]
    assert (loaded.module.image_size, loaded.preprocess.crop, loaded.input_shape) == (384, 384, (3, 384, 384))
    assert load_model("torchvision:vit_b_16").input_shape == (3, 224, 224)  # the default weights' crop: as built


FACTORY = '''
import torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.b = torch.nn.Conv2d(8, 4, 3, stride=2, padding=1)
        self.fc = torch.nn.Linear(4 * 8 * 8, 3)

    def forward(self, x):
        return self.fc(torch.relu(self.b(torch.relu(self.a(x)))).flatten(1))

def make():
    torch.manual_seed(0)
    return Net()

make.splitedge_preprocessing = {"resize": 36, "crop": 32, "mean": [127, 127, 127], "std": [128, 128, 128]}
make.splitedge_labels = ["cat", "coffee", "rocket"]
'''


def split_export(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SPLIT_EXPORT), *argv], cwd=cwd, capture_output=True, text=True, timeout=600)


def test_a_factory_declares_its_preprocessing_and_labels_and_the_bundle_records_them(tmp_path: Path) -> None:
    (tmp_path / "mynet.py").write_text(FACTORY)
    out = split_export("build", "mynet:make", "--splits", "a", "--out", "bundle", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    model = json.loads((tmp_path / "bundle/manifest.json").read_text())["model"]
    assert model["input_shape"] == [3, 32, 32] and model["labels"] == ["cat", "coffee", "rocket"]
    assert model["preprocess"]["crop"] == 32 and model["preprocess"]["resize"] == 36
    assert model["preprocess"]["mean"] == pytest.approx([127 / 255] * 3)
    # The command line wins; an input shape against the declared crop is refused before anything is written.
    out = split_export("build", "mynet:make", "--splits", "a", "--out", "again", "--input-shape", "3,40,40",
                       cwd=tmp_path)
    assert out.returncode == 2 and not (tmp_path / "again").exists()
    assert out.stderr.strip() == ("split-export: error: --input-shape 3,40,40 contradicts the crop 32 from mynet:make's "
                                  "splitedge_preprocessing: the board would crop to 32; give --crop 40 (and --resize), "
                                  "or leave out --input-shape")
