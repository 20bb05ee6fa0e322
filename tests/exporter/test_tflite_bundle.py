"""``split-export build --formats onnx,tflite``: TFLite heads and full model a board runs with LiteRT.

On the board bundle the session builds once (``board_bundle``: MobileNetV2 cut at
``features_14_conv_2``, ONNX and TFLite, float32 and int8), float32 throughout here."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("litert_torch")
pytest.importorskip("ai_edge_litert")

from device_runtime.bundle import LOCAL, Bundle  # noqa: E402
from device_runtime.engine._runner import DeviceRunner  # noqa: E402
from tests.conftest import run_stream, start_host  # noqa: E402
from tests.exporter.conftest import BOARD_SPLIT as SPLIT  # noqa: E402


def classify(bundle: Bundle, photos: Path, split: str, backend: str, host=None) -> list[tuple[str, float]]:
    """Float32 artifacts and a float32 cut on the wire (the bundle also has int8 and a uint8 link)."""
    runner = DeviceRunner(bundle, threads=2, backend=backend, precision="float32", transmit="float32")
    results = run_stream(runner, str(photos), split, host)
    return [(r.label, r.probability) for r in results]


def test_manifest_lists_tflite_heads_and_full_model(board_bundle: Path) -> None:
    bundle = Bundle.load(board_bundle)  # every file hashed, tflite ones included
    assert bundle.has(LOCAL, "full", fmt="tflite") and bundle.has(SPLIT, "head", fmt="tflite")
    assert not bundle.has(SPLIT, "tail", fmt="tflite")  # tails run on the host, in ONNX


def test_tflite_board_gives_the_onnx_answers(board_bundle: Path, photos_dir: Path) -> None:
    bundle = Bundle.load(board_bundle)
    onnx_local = classify(bundle, photos_dir, LOCAL, "onnx")
    tflite_local = classify(bundle, photos_dir, LOCAL, "tflite")
    for host in start_host([board_bundle]):
        tflite_split = classify(bundle, photos_dir, SPLIT, "tflite", host)
    for results in (tflite_local, tflite_split):
        assert [label for label, _ in results] == [label for label, _ in onnx_local]
        assert [p for _, p in results] == pytest.approx([p for _, p in onnx_local], abs=1e-4)
