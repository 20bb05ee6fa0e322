"""``split-export`` called as a library function: bundles that load, errors that explain."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from device_runtime.bundle import Bundle  # noqa: E402
from exporter.cli import main  # noqa: E402


def test_build_writes_a_bundle_that_loads(tmp_path: Path, capsys) -> None:
    out = tmp_path / "bundle"
    labels = tmp_path / "labels.txt"
    labels.write_text("".join(f"thing {i}\n" for i in range(1000)))
    assert main(["build", "torchvision:resnet18", "--splits", "layer4_0_add,maxpool", "--out", str(out), "--labels", str(labels)]) == 0
    assert "wrote bundle resnet18-" in capsys.readouterr().out

    bundle = Bundle.load(out)
    manifest = bundle.manifest
    assert [s.id for s in manifest.splits] == ["maxpool", "layer4_0_add"]  # graph order
    assert manifest.bundle_id == f"resnet18-{manifest.manifest_sha256[:12]}"  # the identity covers the content
    assert manifest.model.input_shape == (3, 224, 224) and manifest.model.output_shape == (1000,)
    assert manifest.model.labels[:2] == ("thing 0", "thing 1")
    assert manifest.model.preprocess.crop == 224
    maxpool = manifest.split("maxpool")
    assert maxpool.tensor.shape == (64, 56, 56) and maxpool.tensor.bytes_per_sample == 64 * 56 * 56 * 4
    assert maxpool.compression_ratio == pytest.approx(4 / 3) and not maxpool.natural and maxpool.kind == "layer"
    assert {a.path for a in bundle.all_artifacts()} == {
        "full/model.onnx", "head/maxpool.onnx", "tail/maxpool.onnx", "head/layer4_0_add.onnx", "tail/layer4_0_add.onnx",
    }  # fmt: skip


def test_build_json_is_one_object_on_stdout(tmp_path: Path, capsys) -> None:
    """A small model: the summary as JSON alone on stdout, what the build says on stderr."""
    out = tmp_path / "bundle"
    assert main(["build", "exporter.zoo:fmnist_vgg", "--input-shape", "1,28,28", "--splits", "auto", "--out", str(out),
                 "--json"]) == 0
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    manifest = Bundle.load(out).manifest
    assert summary["bundle_id"] == manifest.bundle_id and summary["out"] == str(out)
    assert [s["id"] for s in summary["splits"]] == [s.id for s in manifest.splits] and summary["splits"]
    first = summary["splits"][0]
    assert first["bytes_per_sample"] == manifest.splits[0].tensor.bytes_per_sample
    assert {a["role"] for a in first["artifacts"]} == {"head", "tail"}
    assert all(a["max_abs_error"] is not None for a in first["artifacts"])  # validated against torch
    assert [a["path"] for a in summary["full"]] == [a.path for a in manifest.full]
    assert f"wrote bundle {manifest.bundle_id}" in captured.err


def test_points_prints_every_cut(capsys) -> None:
    assert main(["points", "torchvision:resnet18", "--json"]) == 0
    points = json.loads(capsys.readouterr().out)
    assert len(points) == 22 and points[3]["id"] == "maxpool" and points[3]["shape"] == [64, 56, 56]
    assert main(["points", "torchvision:mobilenet_v2"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["id", "pos", "op", "shape", "bytes/sample", "c_l", "marks"]
    assert table[1 + 72 - 1].split()[0] == "classifier_0"
    assert "features_14_conv_2  " in next(r for r in table if "NC" in r.split()[-1] and "features_14" in r)


def _error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert captured.err.startswith("split-export: error: ")
    return captured.err


def test_unknown_model(capsys) -> None:
    err = _error(capsys, ["points", "torchvision:resnet19"])
    assert "torchvision has no classification model 'resnet19'; known: alexnet" in err


@pytest.mark.parametrize(
    "spec,message",
    [
        ("resnet18", "bad model spec 'resnet18': expected torchvision:NAME or package.module:factory"),
        ("no_such_pkg.models:make", "bad model spec 'no_such_pkg.models:make': cannot import 'no_such_pkg.models'"),
        ("exporter._models:nothing_here", "exporter._models has no callable 'nothing_here'"),
        ("exporter._models:IMAGENET_PREPROCESS", "exporter._models has no callable 'IMAGENET_PREPROCESS'"),
    ],
)
def test_bad_specs(capsys, spec: str, message: str) -> None:
    assert message in _error(capsys, ["points", spec])


def test_unknown_cut_id(capsys, tmp_path: Path) -> None:
    err = _error(capsys, ["build", "torchvision:resnet18", "--splits", "maxpool,layer1_0_relu_2", "--out", str(tmp_path)])
    assert "'layer1_0_relu_2' is not a valid cut point; did you mean layer1_0_relu_1" in err
    assert not (tmp_path / "manifest.json").exists()


def test_corrupt_and_mismatched_weights(capsys, tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt.pth"
    corrupt.write_bytes(b"\x80\x04 not a checkpoint")
    assert f"cannot read weights file {corrupt}" in _error(capsys, ["points", "torchvision:resnet18", "--weights", str(corrupt)])

    missing = tmp_path / "missing.pth"
    assert f"weights file {missing} does not exist" in _error(capsys, ["points", "torchvision:resnet18", "--weights", str(missing)])

    other = tmp_path / "resnet18_renamed.pth"
    state = torchvision_state("resnet18")
    state["head.weight"] = state.pop("fc.weight")
    torch.save(state, other)
    err = _error(capsys, ["points", "torchvision:resnet18", "--weights", str(other)])
    assert "does not fit ResNet: missing keys fc.weight; unexpected keys head.weight" in err

    wrong_shape = tmp_path / "wrong_shape.pth"
    state = torchvision_state("resnet18")
    state["fc.weight"] = torch.zeros(10, 512)
    torch.save(state, wrong_shape)
    assert "size mismatch for fc.weight" in _error(capsys, ["points", "torchvision:resnet18", "--weights", str(wrong_shape)])

    pickled_code = tmp_path / "code.pth"
    torch.save({"fc.weight": torch.zeros(1), "hook": print}, pickled_code)
    assert "not a (safe) torch state dict" in _error(capsys, ["points", "torchvision:resnet18", "--weights", str(pickled_code)])


def torchvision_state(name: str) -> dict:
    import torchvision

    return torchvision.models.get_model(name).state_dict()


def test_help_has_examples(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    assert "split-export build torchvision:mobilenet_v2" in capsys.readouterr().out


def test_the_epochs_default_is_the_trainings_own() -> None:
    """split-export's parser names --epochs' default without importing torch (slice runs without it)."""
    from exporter._bottleneck import BottleneckTraining
    from exporter.cli import AE_EPOCHS

    assert AE_EPOCHS == BottleneckTraining.ae_epochs


def test_slice_errors_are_one_line(capsys, tmp_path: Path) -> None:
    assert main(["slice", str(tmp_path / "nothing"), "--for", "board", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("split-export: error: ") and "no manifest" in err and err.count("\n") == 1
