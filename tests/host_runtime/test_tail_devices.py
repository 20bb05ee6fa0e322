"""Where tails run: ``--device auto`` takes onnxruntime's CUDA provider when there is one and
the CPU otherwise, and says which in ``hello``; ``--device cuda`` without CUDA is refused."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from device_runtime.bundle import Bundle
from host_runtime import cli as host_cli
from host_runtime._tails import TailRegistry
from splitedge.errors import BackendError
from tests.host_runtime.helpers import run_with_client

HAS_CUDA = "CUDAExecutionProvider" in ort.get_available_providers()


def test_hello_reports_the_device_auto_chose(host) -> None:
    info = run_with_client(host, _server_info)
    assert info["device"] == ("cuda" if HAS_CUDA else "cpu")


async def _server_info(client) -> dict:
    return client.server_info


def test_cpu_is_used_when_asked(mobilenet_bundle) -> None:
    registry = TailRegistry.from_paths([mobilenet_bundle], threads=1, device="cpu")
    assert registry.device == "cpu"
    assert {tuple(t.session.get_providers()) for t in registry.tails.values()} == {("CPUExecutionProvider",)}


@pytest.mark.skipif(HAS_CUDA, reason="this onnxruntime has CUDA")
def test_cuda_without_cuda_is_refused_at_start(mobilenet_bundle, capsys) -> None:
    with pytest.raises(BackendError, match="this onnxruntime has no CUDAExecutionProvider"):
        TailRegistry.from_paths([mobilenet_bundle], device="cuda")
    assert host_cli.main(["serve", str(mobilenet_bundle), "--device", "cuda", "--no-zeroconf", "--port", "0"]) == 2
    assert "install onnxruntime-gpu or use --device cpu" in capsys.readouterr().err


@pytest.mark.needs_gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs onnxruntime with the CUDA provider and a GPU")
def test_cuda_tails_match_the_cpu(mobilenet_bundle) -> None:
    """TF32 off by default (issue 19: with it, 0.013 off on an H100; without, 1e-5): every tail the
    bundle has, against the same tail on the CPU."""
    bundle = Bundle.load(mobilenet_bundle)
    registry = TailRegistry([bundle], device="cuda")
    cpu = TailRegistry([bundle], threads=1, device="cpu")
    assert registry.device == "cuda" and registry.tails.keys() == cpu.tails.keys()
    for key, tail in registry.tails.items():
        shape = (4, *(int(d) for d in tail.input_shape[1:]))
        x = np.random.default_rng(0).standard_normal(shape).astype(tail.input_dtype)
        np.testing.assert_allclose(tail.run(x), cpu.tails[key].run(x), atol=1e-4, rtol=0, err_msg=str(key))
