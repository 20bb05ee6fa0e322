"""LiteRTBackend: loading, shape checks, batch resizing and quantized I/O, with no torch.

The model is the bundle's MobileNetV2 head converted once per session (that needs the
workstation); in the board-only environment these tests skip. Quantization helpers are
pure numpy and always run where the interpreter is installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ai_edge_litert")

from device_runtime.engine._backend import load_backend  # noqa: E402
from device_runtime.engine._litert_backend import LiteRTBackend  # noqa: E402
from device_runtime.wire._quantization import dequantize, quantize  # noqa: E402
from splitedge.errors import BackendError  # noqa: E402


@pytest.fixture(scope="module")
def head_tflite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random MobileNetV2 head at an early cut, as float32 TFLite with a dynamic batch."""
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    pytest.importorskip("litert_torch")
    from exporter._graph import split_at, trace
    from exporter._tflite_export import export_tflite

    torch.manual_seed(0)
    head, _ = split_at(trace(torchvision.models.mobilenet_v2(), (3, 224, 224)), "features_4_conv_2")
    path = tmp_path_factory.mktemp("tflite") / "head.tflite"
    export_tflite(head, "head", torch.zeros(1, 3, 224, 224), path)
    return path


def test_backend_reports_the_bundle_contract(head_tflite: Path) -> None:
    backend = load_backend(head_tflite, fmt="tflite", threads=1)
    assert isinstance(backend, LiteRTBackend)
    assert (backend.name, backend.input_name, backend.output_name) == ("head.tflite", "input", "cut")
    assert backend.input_shape == ("batch", 3, 224, 224)
    assert backend.input_dtype == "float32"
    assert not backend.quantized


def test_resizes_only_when_the_batch_changes(head_tflite: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    backend = LiteRTBackend(head_tflite, threads=1)
    resized: list[tuple[int, ...]] = []
    original = backend._resize
    monkeypatch.setattr(backend, "_resize", lambda shape: (resized.append(shape), original(shape)))
    x3 = np.ones((3, 3, 224, 224), np.float32)
    y3 = backend.run(x3)
    backend.run(x3)
    y1 = backend.run(x3[:1])
    backend.run(x3[:1])
    assert y3.shape == (3, 32, 28, 28) and y1.shape == (1, 32, 28, 28)
    assert resized == [(3, 3, 224, 224), (1, 3, 224, 224)]  # once per change, never per frame
    np.testing.assert_allclose(y1[0], y3[0], rtol=0, atol=1e-6)


def test_wrong_shape_names_both_shapes(head_tflite: Path) -> None:
    backend = LiteRTBackend(head_tflite)
    with pytest.raises(BackendError, match=r"head\.tflite takes shape \[batch, 3, 224, 224\], got \[1, 3, 112, 112\]"):
        backend.run(np.zeros((1, 3, 112, 112), np.float32))
    with pytest.raises(BackendError, match="takes float32, got float64"):
        backend.run(np.zeros((1, 3, 224, 224)))


def test_corrupt_file_names_the_file(tmp_path: Path) -> None:
    corrupt = tmp_path / "broken.tflite"
    corrupt.write_bytes(b"TFL3" + bytes(range(256)) * 4)
    with pytest.raises(BackendError, match="broken.tflite"):
        LiteRTBackend(corrupt)
    with pytest.raises(BackendError, match="missing.tflite"):
        load_backend(tmp_path / "missing.tflite", fmt="tflite")


def test_unknown_format_lists_what_runs(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match="this build runs: onnx, tflite"):
        load_backend(tmp_path / "m.bin", fmt="coreml")


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_quantized_io_round_trips_within_half_a_step(dtype: type) -> None:
    """The backend's quantized I/O is the wire's arithmetic, at the tensor's dtype (int8 or uint8)."""
    scale, zero_point = 0.05, 0 if dtype is np.int8 else 128
    x = np.linspace(-6, 6, 241, dtype=np.float32)
    q = quantize(x, scale, zero_point, np.dtype(dtype))
    assert q.dtype == dtype
    info = np.iinfo(dtype)
    far = np.array([-1e3, 1e3], dtype=np.float32)  # outside the range: saturated at the dtype's ends, not wrapped
    assert quantize(far, scale, zero_point, np.dtype(dtype)).tolist() == [info.min, info.max]
    back = dequantize(q, scale, zero_point)
    assert back.dtype == np.float32
    inside = np.abs(x) <= 127 * scale - 1e-6  # outside the representable range values saturate
    assert np.abs(back - x)[inside].max() <= scale / 2 + 1e-6


def test_a_board_starting_its_interpreter_prints_nothing_of_litert(head_tflite: Path) -> None:
    """LiteRT's C++ writes 'INFO: Created TensorFlow Lite XNNPACK delegate for CPU.' to stderr as a
    process's first interpreter starts: a line at every start of a board's run, and in its journal.
    In a process of its own, as a board's run is."""
    code = ("import sys, numpy as np\nfrom device_runtime.engine._litert_backend import LiteRTBackend\n"
            "print('before', file=sys.stderr, flush=True)\n"
            f"backend = LiteRTBackend({str(head_tflite)!r}, threads=1)\n"
            "print(backend.run(np.zeros((1, 3, 224, 224), np.float32)).shape)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[3])
    assert done.returncode == 0, done.stderr
    assert done.stdout == "(1, 32, 28, 28)\n"
    assert done.stderr == "before\n"


def test_what_else_reaches_stderr_meanwhile_is_passed_on_in_order(capfd: pytest.CaptureFixture[str]) -> None:
    from device_runtime.engine._litert_backend import _without_delegate_notice

    with _without_delegate_notice():
        os.write(2, b"ERROR: one\nINFO: Created TensorFlow Lite XNNPACK delegate for CPU.\nERROR: two\n")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "ERROR: one\nERROR: two\nafter\n"
