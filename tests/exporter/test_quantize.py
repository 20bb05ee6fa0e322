"""``--quantize int8``: int8 heads and uint8 cut tensors, calibrated on real images."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from device_runtime.bundle import LOCAL, Bundle  # noqa: E402
from device_runtime.engine import INT8_MARGIN  # noqa: E402
from device_runtime.engine._backend import OnnxBackend  # noqa: E402
from device_runtime.engine._runner import DeviceRunner  # noqa: E402
from device_runtime.link import HostClient  # noqa: E402
from device_runtime.wire._quantization import quantize  # noqa: E402
from exporter.cli import main  # noqa: E402
from exporter._datasets import FASHION_MNIST_DIR, load_images  # noqa: E402
from tests.conftest import start_host  # noqa: E402

pytestmark = pytest.mark.skipif(
    not (FASHION_MNIST_DIR / "t10k-images-idx3-ubyte.gz").is_file(), reason="Fashion-MNIST missing"
)
SPLIT = "_13"


@pytest.fixture(scope="module")
def int8_bundle(trained, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("int8")
    assert main(["build", "exporter.zoo:fmnist_vgg", "--weights", str(trained[1]), "--input-shape", "1,28,28",
                 "--splits", SPLIT, "--formats", "onnx,tflite", "--quantize", "int8", "--calib-data", "fashion-mnist:train",
                 "--test-data", "fashion-mnist", "--out", str(out)]) == 0
    return out


def test_manifest_has_int8_head_and_uint8_parameters(int8_bundle: Path) -> None:
    bundle = Bundle.load(int8_bundle)
    split = bundle.manifest.split(SPLIT)
    assert split.quantization is not None and split.quantization.dtype == "uint8"
    assert 0 <= split.quantization.zero_point <= 255 and split.quantization.scale > 0
    assert bundle.has(SPLIT, "head", precision="int8") and bundle.has(SPLIT, "head", precision="float32")
    # Every variant's accuracy, measured on the 10,000 test images and recorded with its size.
    heads = {(a.format, a.precision): a for a in split.artifacts if a.role == "head"}
    full = {(a.format, a.precision): a for a in bundle.manifest.full}
    assert set(heads) == set(full) == {(f, p) for f in ("onnx", "tflite") for p in ("float32", "int8")}
    float_accuracy = heads["onnx", "float32"].accuracy
    assert bundle.manifest.model.accuracy > 0.7
    assert split.accuracy == float_accuracy == pytest.approx(bundle.manifest.model.accuracy, abs=1e-9)
    assert bundle.manifest.model.accuracy_on == "top-1 on 10000 labelled images of fashion-mnist:test"
    # float32 TFLite matches ONNX within 1e-4, so at most a borderline image or two differ.
    assert heads["tflite", "float32"].accuracy == pytest.approx(float_accuracy, abs=2e-4)
    assert full["tflite", "float32"].accuracy == pytest.approx(full["onnx", "float32"].accuracy, abs=2e-4)
    for variants in (heads, full):
        for fmt in ("onnx", "tflite"):
            assert variants[fmt, "int8"].accuracy >= float_accuracy - 0.02, (fmt, variants[fmt, "int8"].accuracy)
            assert variants[fmt, "int8"].bytes < variants[fmt, "float32"].bytes


@pytest.mark.parametrize("backend", ["onnx", "tflite"])
def test_device_runs_int8_where_the_bundle_measured_it_close_to_float32(int8_bundle: Path, backend: str) -> None:
    bundle = Bundle.load(int8_bundle)
    auto = DeviceRunner(bundle, threads=1, backend=backend)
    for split_id, role in ((SPLIT, "head"), (LOCAL, "full")):
        int8, float32 = (bundle.find(split_id, role, backend, p) for p in ("int8", "float32"))
        chosen = "int8" if int8.accuracy >= float32.accuracy - INT8_MARGIN else "float32"
        print(f"{backend} {role}: int8 {int8.accuracy:.4f}, float32 {float32.accuracy:.4f}: {chosen}")
        assert auto.session(split_id, role).name == bundle.artifact(split_id, role, backend, chosen).name
    float_runner = DeviceRunner(bundle, threads=1, backend=backend, precision="float32")
    assert float_runner.session(SPLIT, "head").name == bundle.artifact(SPLIT, "head", backend).name


def test_int8_head_and_uint8_link_keep_the_answers(int8_bundle: Path) -> None:
    bundle = Bundle.load(int8_bundle)
    split = bundle.manifest.split(SPLIT)
    test = load_images("fashion-mnist", (1, 28, 28)).subset(500, seed=3)
    float_head = OnnxBackend(bundle.artifact(SPLIT, "head"))
    int8_head = OnnxBackend(bundle.artifact(SPLIT, "head", precision="int8"))
    tail = OnnxBackend(bundle.artifact(SPLIT, "tail"))
    reference = tail.run(float_head.run(test.x)).argmax(1)
    cut = int8_head.run(test.x)
    q = quantize(cut, split.quantization.scale, split.quantization.zero_point)
    assert q.nbytes * 4 == cut.nbytes  # the link carries a quarter of the bytes

    async def over_the_link():
        client = await HostClient.connect(host.host, host.port)
        try:  # 100 frames per request, as a board batching 100 would send them
            replies = [await client.infer(bundle.id, SPLIT, q[i : i + 100], scale=split.quantization.scale,
                                          zero_point=split.quantization.zero_point) for i in range(0, len(q), 100)]
            return np.concatenate([r.output for r in replies])
        finally:
            await client.close()

    for host in start_host([int8_bundle]):
        output = asyncio.run(over_the_link())
    agreement = (output.argmax(1) == reference).mean()
    assert agreement >= 0.97, agreement
    float_accuracy = (reference == test.y).mean()
    int8_accuracy = (output.argmax(1) == test.y).mean()
    assert int8_accuracy >= float_accuracy - 0.02, (int8_accuracy, float_accuracy)


def test_quantize_needs_calibration_data(tmp_path: Path, capsys) -> None:
    assert main(["build", "exporter.zoo:fmnist_vgg", "--input-shape", "1,28,28", "--splits", SPLIT,
                 "--quantize", "int8", "--out", str(tmp_path)]) == 2
    assert "--quantize int8 needs --calib-data" in capsys.readouterr().err
