"""Any model a user brings (issue 30): a transformer, several outputs, a branch on shapes, a factory
that fails, outputs too small for an absolute tolerance. Each as a user writes it, in a file where
they stand, through ``split-export`` itself; the bundles are checked in onnxruntime.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from device_runtime import Bundle, FULL  # noqa: E402
from device_runtime.bundle import IO_NAMES  # noqa: E402
from exporter.cli import main  # noqa: E402
from exporter._graph import find_cut_points, split_at, trace  # noqa: E402
from exporter._models import load_model  # noqa: E402
from exporter._onnx_export import onnx_bytes  # noqa: E402
from exporter._validate import RTOL, Chain, OnnxRunner, torch_cases, validate  # noqa: E402
from splitedge.errors import ValidationError  # noqa: E402

USER_NETS = '''
import torch
from torch import nn


class Tokens(nn.Module):
    """A small vision transformer as users write one: patches, nn.TransformerEncoder, a head."""

    def __init__(self, width=32, layers=3):
        super().__init__()
        self.patches = nn.Conv2d(3, width, 8, stride=8)
        layer = nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=64, batch_first=True, dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        tokens = self.patches(x).flatten(2).transpose(1, 2)
        return self.head(self.encoder(tokens).mean(1))


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3)
        self.b = nn.Conv2d(8, 16, 3, stride=2)
        self.fc = nn.Linear(16, 10)
        self.aux = nn.Linear(8, 3)

    def forward(self, x):
        x = self.a(x)
        return {"logits": self.fc(self.b(x).mean((2, 3))), "aux": self.aux(x.mean((2, 3)))}


class ShapeBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3)
        self.big = nn.Conv2d(8, 8, 3, stride=2)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        x = self.a(x)
        if x.shape[-1] > 100:
            x = self.big(x)
        return self.fc(x.mean((2, 3)))


class ValueBranch(ShapeBranch):
    def forward(self, x):
        x = self.a(x)
        if x.mean() > 0:
            x = self.big(x)
        return self.fc(x.mean((2, 3)))


def tokens():
    return Tokens()


def two_heads():
    return TwoHeads()


def shape_branch():
    return ShapeBranch()


def value_branch():
    return ValueBranch()


def broken():
    raise RuntimeError("checkpoint config missing")


def zero_head():
    model = ShapeBranch()  # a head initialised to zero, as vit_b_16's: it answers 0 to everything
    nn.init.zeros_(model.fc.weight)
    nn.init.zeros_(model.fc.bias)
    return model


class ChannelsLast(nn.Module):
    """ConvNeXt's way: a linear layer over the channels of an (N, H, W, C) tensor."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, stride=2)
        self.mix = nn.Linear(8, 8)
        self.fc = nn.Linear(8, 10)

    def forward(self, x):
        x = torch.relu(self.a(x))
        x = self.mix(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.fc(x.mean((2, 3)))


def channels_last():
    return ChannelsLast()
'''


@pytest.fixture
def user_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the user stands, with their models in ``usernets.py``."""
    where = tmp_path_factory.getbasetemp() / "user"
    where.mkdir(exist_ok=True)
    (where / "usernets.py").write_text(USER_NETS)
    monkeypatch.chdir(where)
    return where


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err and "Traceback" not in "\n".join(err), err
    return err[-1]


def _line(text: str) -> int:
    """The line of ``usernets.py`` holding ``text``."""
    return next(i for i, line in enumerate(USER_NETS.splitlines(), 1) if text in line)


def _heads_and_tails_are_the_full_model(bundle_dir: Path) -> None:
    """Every split's head then tail, in onnxruntime, answers as the bundle's full model, within RTOL
    of its outputs' spread, on pixels the build never saw."""
    bundle = Bundle.load(bundle_dir)
    x = np.random.default_rng(1).uniform(0, 255, (2, *bundle.manifest.model.input_shape)).astype(np.float32)
    want = OnnxRunner(bundle.artifact("local", "full"))({"input": x})["logits"]
    for split in bundle.manifest.splits:
        got = Chain(OnnxRunner(bundle.artifact(split.id, "head")), OnnxRunner(bundle.artifact(split.id, "tail")))(
            {"input": x})["logits"]
        assert np.abs(got - want).max() <= RTOL * want.std(), split.id


# -- transformers -------------------------------------------------------------------------------------


def test_a_users_transformer_encoder_builds_with_a_cut_after_each_encoder_layer(user_dir: Path, capsys) -> None:
    """nn.TransformerEncoder in eval mode takes torch's fused path (``_transformer_encoder_layer_fwd``),
    which no ONNX opset has: the build exports the unfused path, the same computation."""
    torch.manual_seed(0)
    model = load_model("usernets:tokens", input_shape=(3, 32, 32)).module
    traced = trace(model, (3, 32, 32))
    cuts = find_cut_points(traced)
    layer_outputs = [c.id for c in cuts if c.block.startswith("encoder.layers.") and c.block_output]
    assert layer_outputs == ["encoder_layers_0", "encoder_layers_1", "encoder_layers_2"]
    assert [c.shape for c in cuts if c.id in layer_outputs] == [(16, 32)] * 3  # the tokens cross the link
    out = user_dir / "tokens-bundle"
    assert main(["build", "usernets:tokens", "--input-shape", "3,32,32", "--splits", ",".join(layer_outputs),
                 "--out", str(out)]) == 0
    assert "validated against torch" in capsys.readouterr().out
    bundle = Bundle.load(out)
    assert [s.id for s in bundle.manifest.splits] == layer_outputs
    assert all(a.max_rel_error is not None and a.max_rel_error < RTOL for s in bundle.manifest.splits
               for a in s.artifacts if a.precision == "float32")
    _heads_and_tails_are_the_full_model(out)


def test_block_view_counts_each_encoder_layer_of_vit() -> None:
    """torchvision's vit_b_16: its 12 encoder layers are 12 blocks (the block view said 6 blocks in all)."""
    from exporter._blocks import block_units

    vit = pytest.importorskip("torchvision").models.vit_b_16(weights=None)
    units = block_units(vit)
    assert [u for u in units if u.startswith("encoder.layers.")] == [f"encoder.layers.encoder_layer_{i}" for i in range(12)]


# -- several outputs ----------------------------------------------------------------------------------


def test_a_model_with_two_outputs_is_said_and_the_chosen_one_is_exported(user_dir: Path, capsys) -> None:
    assert main(["points", "usernets:two_heads", "--input-shape", "3,32,32"]) == 0
    assert ("note: the board answers with output logits of 2 outputs: logits [10], aux [3] (--output to choose)"
            in capsys.readouterr().err)
    out = user_dir / "aux-bundle"
    assert main(["build", "usernets:two_heads", "--input-shape", "3,32,32", "--splits", "a", "--output", "aux",
                 "--out", str(out)]) == 0
    assert "answers with output aux of 2 outputs" in capsys.readouterr().out
    manifest = Bundle.load(out).manifest
    assert manifest.model.output.startswith("aux of 2 outputs") and manifest.model.output_shape == (3,)
    _heads_and_tails_are_the_full_model(out)
    assert main(["build", "usernets:two_heads", "--input-shape", "3,32,32", "--splits", "a", "--output", "7",
                 "--out", str(user_dir / "no")]) == 2
    assert _error_line(capsys) == ("split-export: error: --output 7: usernets:two_heads returns 2 outputs: "
                                   "logits [10], aux [3]; give one of their keys")


# -- branches on shapes -------------------------------------------------------------------------------


@pytest.mark.parametrize("side, cuts", [(32, ["a", "mean"]), (224, ["a", "big", "mean"])])
def test_a_branch_on_the_input_shape_is_decided_by_the_bundles_shape(user_dir: Path, side: int, cuts: list[str]) -> None:
    """fx alone refused the whole model (``symbolically traced variables cannot be used as inputs to
    control flow``); the input shape is fixed, so the branch is too: the graph holds the side taken."""
    model = load_model("usernets:shape_branch", input_shape=(3, side, side)).module
    assert [c.id for c in find_cut_points(trace(model, (3, side, side)))] == cuts


def test_a_branch_on_values_names_the_users_line(user_dir: Path, capsys) -> None:
    assert main(["points", "usernets:value_branch", "--input-shape", "3,32,32"]) == 2
    line = _error_line(capsys)
    assert line.startswith("split-export: error: cannot trace ValueBranch: its forward branches on tensor values at ")
    assert f"{user_dir / 'usernets.py'}:{_line('if x.mean() > 0:')} (if x.mean() > 0:)" in line
    assert "torch.where" in line


# -- the user's code failing --------------------------------------------------------------------------


def test_a_factory_that_raises_is_one_line_naming_it_and_its_line(user_dir: Path, capsys) -> None:
    assert main(["points", "usernets:broken"]) == 2
    assert _error_line(capsys) == (
        "split-export: error: the factory usernets:broken raised RuntimeError: checkpoint config missing at "
        f"{user_dir / 'usernets.py'}:{_line('checkpoint config missing')}; fix the factory (or what it reads), then run the command again")


def test_a_forward_that_fails_on_the_input_shape_is_one_line(user_dir: Path, capsys) -> None:
    assert main(["points", "usernets:two_heads", "--input-shape", "3,2,2"]) == 2
    line = _error_line(capsys)
    assert line.startswith("split-export: error: usernets:two_heads does not run on an input of shape [1, 3, 2, 2]: "
                           "RuntimeError: ")
    assert "give the shape it takes with --input-shape C,H,W" in line


# -- a validation that measures -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mobilenet_v3_small", "tokens"])
def test_a_tail_one_percent_off_fails_the_validation_however_small_the_outputs(name: str, user_dir: Path) -> None:
    """MobileNetV3-S with random weights has logits of at most about 2e-9 (an absolute 1e-4 passes any
    tail at all); a tail whose last layer is 1 % off fails against the outputs' spread, and the right
    one passes."""
    torch.manual_seed(0)
    spec, shape = ("torchvision:" + name, (3, 224, 224)) if name != "tokens" else ("usernets:tokens", (3, 32, 32))
    module = load_model(spec, input_shape=shape).module
    traced = trace(module, shape)
    cut = next(c for c in find_cut_points(traced) if c.block_output and c.position > 3)
    head, tail = split_at(traced, cut.id)
    inputs = [np.random.default_rng(b).standard_normal((b, *shape), dtype=np.float32) for b in (1, 3)]
    reference = torch_cases(module, IO_NAMES[FULL], inputs)
    if name == "mobilenet_v3_small":
        assert np.abs(reference[1].expected["logits"]).max() < 1e-6  # tiny: what an absolute tolerance misses
    example = torch.from_numpy(inputs[0])
    with torch.no_grad():
        cut_example = head(example)
    head_runner = OnnxRunner(onnx_bytes(head, "head", example))
    validate(Chain(head_runner, OnnxRunner(onnx_bytes(tail, "tail", cut_example))), reference, RTOL, "right tail")
    last = [m for m in tail.modules() if isinstance(m, torch.nn.Linear)][-1]
    with torch.no_grad():
        last.weight.mul_(1.01)
    with pytest.raises(ValidationError, match="does not reproduce torch"):
        validate(Chain(head_runner, OnnxRunner(onnx_bytes(tail, "tail", cut_example))), reference, RTOL, "wrong tail")


def test_outputs_that_never_vary_are_said_not_validated(user_dir: Path, capsys) -> None:
    """vit_b_16 with random weights answers exactly 0 to everything (its head starts at zero): any tail
    at all reproduces that, so the bundle records no relative figure and the summary says why."""
    out = user_dir / "zero-bundle"
    assert main(["build", "usernets:zero_head", "--input-shape", "3,32,32", "--splits", "a", "--out", str(out)]) == 0
    assert "torch's outputs never vary with these weights: a wrong artifact would pass too" in capsys.readouterr().out
    manifest = Bundle.load(out).manifest
    (split,) = manifest.splits
    tail = next(a for a in split.artifacts if a.role == "tail")
    head = next(a for a in split.artifacts if a.role == "head" and a.format == "onnx")
    assert tail.max_abs_error == 0 and tail.max_rel_error is None and manifest.full[0].max_rel_error is None
    assert head.max_rel_error is not None  # the cut tensor varies: the head is validated


# -- TFLite where LiteRT cannot -------------------------------------------------------------------------


def test_a_part_litert_cannot_convert_is_left_out_naming_the_op_and_the_rest_is_written(user_dir: Path, capsys) -> None:
    """ConvNeXt's channels-last linear layers: LiteRT cannot lower them for a free batch. The full
    model's and that split's TFLite are left out, one line each naming the op and the layer; the
    other split's TFLite head and every ONNX file are written, and the manifest says which is which."""
    pytest.importorskip("litert_torch")
    out = user_dir / "channels-last-bundle"
    assert main(["build", "usernets:channels_last", "--input-shape", "3,16,16", "--splits", "relu,permute_1",
                 "--formats", "onnx,tflite", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    notes = sorted(re.findall(r"note: [^\r\n]*", captured.err))
    assert [note.split(":")[1].split()[0] for note in notes] == ["full/model.tflite", "head/permute_1.tflite"]
    for note in notes:
        assert ("LiteRT cannot lower aten.view from `return F.linear(input, self.weight, self.bias)`, in layer mix: "
                "TypeError: ") in note
    assert "relu's head in onnx float32, tflite float32" in captured.out
    assert "permute_1's head in onnx float32\n" in captured.out
    bundle = Bundle.load(out)
    assert bundle.has("relu", "head", fmt="tflite") and not bundle.has("permute_1", "head", fmt="tflite")
    assert not bundle.has("local", FULL, fmt="tflite") and not (out / "full" / "model.tflite").exists()
    _heads_and_tails_are_the_full_model(out)


def test_a_tflite_file_the_interpreter_cannot_load_is_left_out_and_logged_whole(tmp_path: Path, capsys, caplog) -> None:
    """What the interpreter refuses (XNNPack failing to prepare a converted file) is left out as a
    conversion that failed is, its whole error logged for --debug, not the end of the build."""
    from exporter._build import _optional_tflite
    from splitedge.errors import BackendError

    (tmp_path / "head").mkdir()
    (tmp_path / "head" / "x.tflite").write_bytes(b"converted")

    def load() -> None:
        raise BackendError("head/x.tflite: the TFLite interpreter cannot load it: XNNPack failed to prepare")

    with caplog.at_level("DEBUG", logger="splitedge.export"):
        assert _optional_tflite(tmp_path, "head/x.tflite", load) == ()
    assert not (tmp_path / "head" / "x.tflite").exists()
    assert capsys.readouterr().err == ("note: head/x.tflite left out of the bundle: head/x.tflite: the TFLite "
                                       "interpreter cannot load it: XNNPack failed to prepare\n")
    (record,) = caplog.records
    assert record.exc_info is not None and "XNNPack failed to prepare" in str(record.exc_info[1])
