"""The sizes a bundle records for what crosses each link are held to what its artifacts emit
(issue 44): a window-partition model recorded 50,176 bytes per sample for cuts whose heads emit
200,704 (their first dimension batch x windows), and every plan on the board sized its frames by
the record. A record the artifacts contradict fails the build in one line naming the split."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

import exporter._build  # noqa: E402
from device_runtime import Bundle, TensorSpec  # noqa: E402
from exporter._build import VALIDATION_BATCHES, BuildSpec, build_bundle  # noqa: E402
from exporter._graph import find_cut_points  # noqa: E402
from exporter._validate import Emitted, OnnxRunner, check_sizes  # noqa: E402
from splitedge.errors import ValidationError  # noqa: E402

MODEL = BuildSpec("exporter.zoo:fmnist_vgg", input_shape=(1, 28, 28), splits=["_4"])  # _4: 16x28x28, 50,176 B


def _recorded_as_windows(monkeypatch: pytest.MonkeyPatch, cut_id: str) -> None:
    """The graph's arithmetic gone wrong at ``cut_id`` as it went for window partitions: the record
    is a quarter of what the head emits, its shape one of four windows."""

    def wrong(traced):
        return [dataclasses.replace(c, shape=(4, *c.shape[1:]), bytes_per_sample=c.bytes_per_sample // 4)
                if c.id == cut_id else c for c in find_cut_points(traced)]
    monkeypatch.setattr(exporter._build, "find_cut_points", wrong)


def test_a_split_recorded_smaller_than_its_head_emits_fails_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _recorded_as_windows(monkeypatch, "_4")
    with pytest.raises(ValidationError) as info:
        build_bundle(MODEL, tmp_path / "bundle", progress=False)
    message = str(info.value)
    assert message.startswith("split _4: the manifest records 12,544 bytes per sample (4x28x28), but head "
                              "head/_4.onnx emits 50,176 per sample at batch 1 (shape [1, 16, 28, 28], where the "
                              "record says [1, 4, 28, 28])"), message
    assert "\n" not in message
    assert not (tmp_path / "bundle").exists()  # nothing written from a build that failed


def test_a_chain_stage_recorded_wrong_is_named_with_the_stage_that_feeds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _recorded_as_windows(monkeypatch, "_8")  # 32x14x14: stage 2's input, what stage 1 sends on
    with pytest.raises(ValidationError) as info:
        build_bundle(dataclasses.replace(MODEL, splits=(), chains=[["_4", "_8"]]), tmp_path / "bundle", progress=False)
    assert str(info.value).startswith("split _4+_8, stage 2's input: the manifest records 6,272 bytes per sample "
                                      "(4x14x14), but stage stage/_4+_8.1.onnx emits 25,088 per sample at batch 1")


def test_a_normal_build_records_what_its_heads_and_stages_emit(tmp_path: Path) -> None:
    manifest = build_bundle(dataclasses.replace(MODEL, chains=[["_4", "_8"]]), tmp_path / "bundle", progress=False)
    bundle = Bundle.load(tmp_path / "bundle")
    for batch in VALIDATION_BATCHES:
        x = np.random.default_rng(batch).uniform(0, 1, (batch, 1, 28, 28)).astype(np.float32)
        for split in manifest.splits:
            sent = OnnxRunner(bundle.artifact(split.id, "head"))({"input": x})["cut"]
            assert sent.shape == (batch, *split.tensor.shape)
            assert sent.nbytes == batch * split.tensor.bytes_per_sample
    (chain,) = [s for s in manifest.splits if s.stages]
    assert [s.tensor.bytes_per_sample for s in chain.stages] == [50_176, 25_088]


def test_bytes_are_counted_in_the_recorded_dtype() -> None:
    """A head emitting uint8 sends a quarter of a float32 record's bytes: that is the same tensor."""
    record = TensorSpec(shape=(16, 28, 28), dtype="float32", bytes_per_sample=50_176)
    check_sizes("split _4", record, "head head/_4.int8.onnx", [Emitted(3, (3, 16, 28, 28), 3 * 12_544, 1)])
    with pytest.raises(ValidationError, match="emits 12,544 per sample at batch 3"):
        check_sizes("split _4", record, "head head/_4.onnx", [Emitted(3, (3, 4, 28, 28), 3 * 12_544, 4)])
    with pytest.raises(ValidationError, match=r"emits 50,176 per sample at batch 1 \(shape \[4, 4, 28, 28\]"):
        check_sizes("split _4", record, "head head/_4.onnx", [Emitted(1, (4, 4, 28, 28), 50_176, 4)])
