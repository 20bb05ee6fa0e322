"""Models from timm, Hugging Face and torchvision's dense heads, and the forwards a split model cannot
have (issue 44): each brings its own preprocessing or says what was assumed, nothing is downloaded,
and what cannot be split is refused in one line naming the cause and the fix. Loading only: tracing
these is the graph's business."""

from __future__ import annotations

import itertools
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from exporter._build import _labels  # noqa: E402
from exporter._models import load_model  # noqa: E402
from splitedge.errors import ModelSpecError  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SPLIT_EXPORT = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin" / "split-export"
_names = itertools.count()

NETS = '''
import torch
from torch import nn


class Plain(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.fc = nn.Linear(4, 5)

    def forward(self, x):
        return self.fc(self.a(x).mean((2, 3)))


class TwoInputs(Plain):
    def forward(self, x, mask):
        return self.fc((self.a(x) * mask).mean((2, 3)))


class OptionalInputs(Plain):
    def forward(self, x, mask=None, *, scale=2.0):
        y = self.a(x) if mask is None else self.a(x) * mask
        return self.fc(y.mean((2, 3))) * scale


class Counting(Plain):
    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1  # a counter kept in the model
        return super().forward(x) + 0 * self.calls


class SetUpOnce(Plain):
    """A buffer filled on the first call only (a lazy cache): state that settles is no state."""

    def __init__(self):
        super().__init__()
        self.register_buffer("ready", torch.zeros(()))

    def forward(self, x):
        if not bool(self.ready):
            self.ready.fill_(1)
        return super().forward(x)


def plain():
    return Plain()


def two_inputs():
    return TwoInputs()


def optional_inputs():
    return OptionalInputs()


def counting():
    return Counting()


def set_up_once():
    return SetUpOnce()
'''


def _user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str) -> str:
    """``source`` as a module of a fresh name where the user stands; its name for a spec."""
    name = f"usermodels_{next(_names)}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    return name


@pytest.fixture
def nets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    return _user_module(tmp_path, monkeypatch, NETS)


def _ours(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What splitedge logged (importing transformers logs torch's own deprecations)."""
    return [r.getMessage() for r in caplog.records if r.name.startswith("splitedge")]


def _one_line(info: pytest.ExceptionInfo[ModelSpecError]) -> str:
    message = str(info.value)
    assert "\n" not in message and "torch/nn" not in message, message
    return message


# -- timm ---------------------------------------------------------------------------------------------


def test_a_timm_spec_builds_random_weights_with_its_pretrained_cfg_preprocessing() -> None:
    pytest.importorskip("timm")
    loaded = load_model("timm:mobilevit_xxs")  # input_size 256, crop_pct 0.9, bicubic, mean 0, std 1
    pre = loaded.preprocess
    assert (pre.crop, pre.resize, pre.interpolation, loaded.input_shape) == (256, 284, "bicubic", (3, 256, 256))
    assert (pre.mean, pre.std) == ((0.0,) * 3, (1.0,) * 3)
    assert {loaded.sources[k] for k in ("resize", "crop", "mean", "std", "interpolation")} == {"timm pretrained_cfg"}


def test_an_unknown_timm_name_is_one_line_with_close_matches() -> None:
    pytest.importorskip("timm")
    with pytest.raises(ModelSpecError) as info:
        load_model("timm:mobilevit_xxxs")
    assert _one_line(info).startswith("timm has no model 'mobilevit_xxxs'; close: mobilevit_xxs")


def test_a_timm_spec_without_timm_says_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "timm", None)  # import timm raises ImportError
    with pytest.raises(ModelSpecError) as info:
        load_model("timm:resnet18")
    assert _one_line(info) == "timm:resnet18 needs timm, which is not installed: pip install timm"


def test_a_factory_returning_a_timm_model_gets_its_pretrained_cfg(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("timm")
    name = _user_module(tmp_path, monkeypatch, "import timm\n\ndef make():\n"
                                               "    return timm.create_model('resnet18.a1_in1k', num_classes=3)\n")
    loaded = load_model(f"{name}:make")
    assert (loaded.preprocess.crop, loaded.preprocess.resize, loaded.preprocess.interpolation) == (224, 235, "bicubic")
    assert loaded.sources["resize"] == "timm pretrained_cfg"


# -- Hugging Face -------------------------------------------------------------------------------------

HF_NETS = '''
import transformers

FOLDER = {folder!r}


def deit(**more):
    config = transformers.DeiTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                     image_size=64, patch_size=16, num_labels=5, **more)
    config._name_or_path = FOLDER  # as from_pretrained(FOLDER) sets it
    return transformers.DeiTForImageClassification(config)


def deit_hidden_states():
    return deit(output_hidden_states=True)


def mobilevit():
    config = transformers.MobileViTConfig(image_size=64, hidden_sizes=[16, 24, 32],
                                          neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 32], num_attention_heads=2,
                                          num_labels=7)
    config._name_or_path = FOLDER
    return transformers.MobileViTForImageClassification(config)
'''


@pytest.fixture
def hf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    pytest.importorskip("transformers")
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    return _user_module(tmp_path, monkeypatch, HF_NETS.format(folder=str(folder))), folder


def test_a_hugging_face_model_takes_its_input_from_its_config_and_says_the_rest_is_assumed(hf, caplog) -> None:
    name, _ = hf
    with caplog.at_level(logging.WARNING, logger="splitedge.export"):
        loaded = load_model(f"{name}:deit")
    assert loaded.input_shape == (3, 64, 64) and loaded.preprocess.crop == 64
    assert loaded.preprocess.resize == round(64 * 256 / 224)  # ImageNet's ratio to the crop, not 256
    assert loaded.output == "logits of 1 outputs: logits [5]"  # a ModelOutput, logits first
    (said,) = _ours(caplog)
    assert said.startswith(f"{name}:deit: nothing declares its resize / mean / std: assumed ImageNet's (resize 73, ")


def test_a_hugging_face_processor_config_beside_the_model_is_read(hf, caplog) -> None:
    name, folder = hf
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "DeiTImageProcessor", "do_resize": True, "size": {"height": 72, "width": 72},
        "resample": 3, "do_center_crop": True, "crop_size": {"height": 64, "width": 64}, "do_rescale": True,
        "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.25, 0.25, 0.25]}))
    with caplog.at_level(logging.WARNING, logger="splitedge.export"):
        loaded = load_model(f"{name}:deit")
    pre = loaded.preprocess
    assert (pre.resize, pre.crop, pre.interpolation, pre.color) == (72, 64, "bicubic", "RGB")
    assert pre.mean == pytest.approx((0.5,) * 3) and pre.std == pytest.approx((0.25,) * 3)
    assert loaded.sources["mean"] == str(folder / "preprocessor_config.json") and not _ours(caplog)


def test_a_mobilevit_processor_without_normalisation_feeds_bgr_from_0_to_1(hf) -> None:
    name, folder = hf
    (folder / "preprocessor_config.json").write_text(json.dumps({  # as apple/mobilevit-small's
        "crop_size": 64, "do_center_crop": True, "do_flip_channel_order": True, "do_resize": True,
        "feature_extractor_type": "MobileViTFeatureExtractor", "resample": 2, "size": 72}))
    loaded = load_model(f"{name}:mobilevit")
    pre = loaded.preprocess
    assert (pre.resize, pre.crop, pre.interpolation, pre.color, loaded.input_shape) == (72, 64, "bilinear", "BGR",
                                                                                       (3, 64, 64))
    assert pre.mean == pytest.approx((0.0,) * 3) and pre.std == pytest.approx((1.0,) * 3)


def test_an_output_holding_tuples_answers_with_the_tensor_chosen(hf) -> None:
    """hidden_states is a tuple of tensors: only the output chosen must be a tensor."""
    name, _ = hf
    for output in ("logits", None):
        loaded = load_model(f"{name}:deit_hidden_states", input_shape=(3, 64, 64), output=output)
        assert loaded.output == "logits of 2 outputs: logits [5], hidden_states (tuple of 2)"
        assert loaded.module(torch.zeros(1, 3, 64, 64)).shape == (1, 5)
    with pytest.raises(ModelSpecError) as info:
        load_model(f"{name}:deit_hidden_states", input_shape=(3, 64, 64), output="hidden_states")
    assert _one_line(info) == (f"--output hidden_states: {name}:deit_hidden_states's output hidden_states "
                               "(tuple of 2) is not a tensor; give one of logits")


# -- nothing declared ---------------------------------------------------------------------------------


def test_a_factory_declaring_nothing_is_said_to_be_imagenet_in_one_line(nets: str, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="splitedge.export"):
        load_model(f"{nets}:plain")
    assert _ours(caplog) == [(
        f"{nets}:plain: nothing declares its resize / crop / mean / std: assumed ImageNet's (resize 256, crop 224, "
        "mean 0.485,0.456,0.406, std 0.229,0.224,0.225); set them with --resize/--crop/--mean/--std (or a "
        "factory's splitedge_preprocessing)")]


def test_the_assumed_preprocessing_reaches_the_user_of_the_command_line(nets: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([str(SPLIT_EXPORT), "points", f"{nets}:plain", "--input-shape", "3,32,32"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    (line,) = [line for line in out.stderr.splitlines() if "assumed" in line]
    assert line.startswith(f"{nets}:plain: nothing declares its mean / std: assumed ImageNet's")


# -- torchvision's dense heads ------------------------------------------------------------------------


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any download (or read from torch's download cache) fails, as on a machine without network."""
    import torchvision.models._api

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a download was attempted")
    monkeypatch.setattr(torchvision.models._api.WeightsEnum, "get_state_dict", refuse)
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", refuse)
    monkeypatch.setattr("urllib.request.urlopen", refuse)


def test_a_segmentation_model_loads_offline_and_labels_its_channels(offline, tmp_path: Path) -> None:
    loaded = load_model("torchvision:lraspp_mobilenet_v3_large")  # its builder fetches backbone weights by default
    with torch.no_grad():
        output_shape = tuple(loaded.module(torch.zeros(1, *loaded.input_shape)).shape[1:])
    assert output_shape == (21, 224, 224) and loaded.output.startswith("out of")
    labels = _labels(loaded, output_shape, None)
    assert len(labels) == 21 and labels == loaded.categories  # the weights' VOC classes: one per channel
    (tmp_path / "labels.txt").write_text("".join(f"part {i}\n" for i in range(21)))
    assert _labels(loaded, output_shape, tmp_path / "labels.txt")[-1] == "part 20"


def test_deeplabv3_builds_without_its_backbone_weights(offline) -> None:
    assert load_model("torchvision:deeplabv3_mobilenet_v3_large").input_shape == (3, 224, 224)


def test_a_detection_model_is_refused_in_one_line_saying_why_and_what_would_do() -> None:
    with pytest.raises(ModelSpecError) as info:
        load_model("torchvision:fasterrcnn_mobilenet_v3_large_320_fpn")
    message = _one_line(info)
    assert message.startswith("torchvision:fasterrcnn_mobilenet_v3_large_320_fpn: a detection model answers with "
                              "lists of boxes whose count depends on the image")
    assert "a factory returning the raw tensors of its backbone and heads" in message


# -- forwards a split model cannot have, and those it can ---------------------------------------------


def test_a_forward_of_two_required_inputs_is_refused_naming_them(nets: str) -> None:
    with pytest.raises(ModelSpecError) as info:
        load_model(f"{nets}:two_inputs", input_shape=(3, 32, 32))
    assert _one_line(info) == (f"{nets}:two_inputs: TwoInputs.forward takes 2 required inputs (x, mask); a split "
                               "model takes one tensor: wrap it in a module whose forward(x) builds mask and calls "
                               "TwoInputs")


def test_optional_inputs_keep_their_defaults(nets: str) -> None:
    loaded = load_model(f"{nets}:optional_inputs", input_shape=(3, 32, 32))
    x = torch.rand(1, 3, 32, 32)
    assert torch.equal(loaded.module(x), loaded.module(x, None, scale=2.0))


def test_state_changed_by_every_call_is_refused_naming_the_buffer(nets: str) -> None:
    with pytest.raises(ModelSpecError) as info:
        load_model(f"{nets}:counting", input_shape=(3, 32, 32))
    assert _one_line(info) == (f"{nets}:counting: Counting.forward changes buffer calls at every call; a split model "
                               "must answer an input the same way each time (its exported parts keep no state): move "
                               "the update out of forward (into a method the training loop calls)")
    assert load_model(f"{nets}:set_up_once", input_shape=(3, 32, 32)).module.ready == 1  # settled after one call
