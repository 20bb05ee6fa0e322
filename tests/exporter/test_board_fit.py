"""``split-export build --board``: a bundle is refused when a head and the full model do not fit."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

pytest.importorskip("torch")

from device_runtime.bundle import Bundle  # noqa: E402
from exporter._build import check_board  # noqa: E402
from exporter.cli import board_formats, main  # noqa: E402
from splitedge.errors import BoardFitError  # noqa: E402

VGG16_CLASSIFIER_HEAD = 528 * 2**20  # bytes of a VGG16 head that keeps its fully connected layers


def test_mobilenet_v2_fits_every_board(mobilenet_bundle: Path) -> None:
    manifest = Bundle.load(mobilenet_bundle, roles=()).manifest
    for board in ("rpi-zero2w", "rpi3b+", "rpi4-2gb", "rpi5-8gb"):
        check_board(board, manifest)


def test_a_vgg16_sized_head_is_refused_on_the_zero_2w(mobilenet_bundle: Path) -> None:
    manifest = Bundle.load(mobilenet_bundle, roles=()).manifest
    split = manifest.splits[0]
    big_head = tuple(dataclasses.replace(a, bytes=VGG16_CLASSIFIER_HEAD) if a.role == "head" else a for a in split.artifacts)
    big = dataclasses.replace(manifest, splits=(dataclasses.replace(split, artifacts=big_head),))
    with pytest.raises(BoardFitError, match=r"does not fit a Raspberry Pi Zero 2 W: needs ~\d+ MB, \d+ MB available"):
        check_board("rpi-zero2w", big)
    check_board("rpi5-8gb", big)  # 8 GB has room for it


def test_cli_refuses_and_writes_no_manifest(tmp_path: Path, capsys, monkeypatch) -> None:
    import exporter._build as build

    # The size estimate is the real one; only the board is shrunk (to its system's share and 1 MB),
    # so that a small network's export (ONNX and TFLite) shows it, not a VGG16's.
    zero = build.BOARDS["rpi-zero2w"]
    tiny = dataclasses.replace(zero, memory_mb=zero.reserved_mb + 1)
    monkeypatch.setattr(build, "BOARDS", {**build.BOARDS, "rpi-zero2w": tiny})
    checked = []

    def check(board: str, manifest) -> None:
        checked.append(manifest)
        check_board(board, manifest)

    monkeypatch.setattr(build, "check_board", check)
    out = tmp_path / "bundle"
    assert main(["build", "exporter.zoo:fmnist_vgg", "--input-shape", "1,28,28", "--splits", "_17",
                 "--board", "rpi-zero2w", "--out", str(out)]) == 2
    assert "does not fit a Raspberry Pi Zero 2 W" in capsys.readouterr().err
    assert not out.exists() and list(tmp_path.iterdir()) == []  # nothing half written, no staging left
    (manifest,) = checked
    assert {a.format for a in manifest.full} == {"onnx", "tflite"}  # the Zero 2 W's backend, picked by --board


def test_board_picks_its_backend_beside_onnx() -> None:
    assert board_formats("rpi-zero2w") == board_formats("rpi3b+") == ("onnx", "tflite")
    assert board_formats("rpi5-8gb") == board_formats(None) == ("onnx",)
