"""``split-export build --formats onnx,tflite``: TFLite heads and full model a board runs with LiteRT."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("litert_torch")
pytest.importorskip("ai_edge_litert")

from device_runtime.bundle import LOCAL, Bundle  # noqa: E402
from device_runtime.engine.runner import DeviceRunner  # noqa: E402
from exporter.build import BuildSpec, build_bundle  # noqa: E402
from tests.conftest import run_stream, start_host  # noqa: E402

SPLIT = "features_14_conv_2"


@pytest.fixture(scope="module")
def tflite_bundle(mobilenet_weights: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tflite-bundle")
    build_bundle(BuildSpec("torchvision:mobilenet_v2", weights=mobilenet_weights, splits=[SPLIT], formats=("onnx", "tflite")), out, progress=False)
    return out


def classify(bundle: Bundle, photos: Path, split: str, backend: str, host=None) -> list[tuple[str, float]]:
    results = run_stream(DeviceRunner(bundle, threads=2, backend=backend), str(photos), split, host)
    return [(r.label, r.probability) for r in results]


def test_manifest_lists_tflite_heads_and_full_model(tflite_bundle: Path) -> None:
    bundle = Bundle.load(tflite_bundle)  # every file hashed, tflite ones included
    assert bundle.has(LOCAL, "full", fmt="tflite") and bundle.has(SPLIT, "head", fmt="tflite")
    assert not bundle.has(SPLIT, "tail", fmt="tflite")  # tails run on the host, in ONNX


def test_tflite_board_gives_the_onnx_answers(tflite_bundle: Path, photos_dir: Path) -> None:
    bundle = Bundle.load(tflite_bundle)
    onnx_local = classify(bundle, photos_dir, LOCAL, "onnx")
    tflite_local = classify(bundle, photos_dir, LOCAL, "tflite")
    for host in start_host([tflite_bundle]):
        tflite_split = classify(bundle, photos_dir, SPLIT, "tflite", host)
    for results in (tflite_local, tflite_split):
        assert [label for label, _ in results] == [label for label, _ in onnx_local]
        assert [p for _, p in results] == pytest.approx([p for _, p in onnx_local], abs=1e-4)
