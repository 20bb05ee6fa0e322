"""A GPU host, checked on the CPU (issue 19): CUDA's provider options give the CPU's answers unless
``--tf32``; batches padded to buckets give every request its own rows, equal to an unpadded run;
each bucket is warmed once per tail at start; a bound run (I/O binding) equals ``session.run``.
What needs a GPU is skipped, with its reason, where onnxruntime has no CUDA provider."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

import numpy as np
import onnxruntime as ort
import pytest

from device_runtime.bundle import Bundle
from host_runtime import cli as host_cli
from host_runtime.batcher import BatchConfig
from host_runtime.tails import (
    CPU,
    CUDA,
    TailRegistry,
    TailSession,
    bucket_for,
    bucket_sizes,
    cuda_options,
    providers_for,
    run_batch,
)
from splitedge.errors import BackendError
from tests.conftest import TEST_SPLITS, start_host
from tests.host_runtime.helpers import cut, infer, run_with_client, unbatched

HAS_CUDA = CUDA in ort.get_available_providers()
NEEDS_CUDA = "needs onnxruntime with the CUDA provider and a GPU"
SPLIT = TEST_SPLITS[1]  # the lightest tail


@pytest.fixture(scope="module")
def bundle(mobilenet_bundle) -> Bundle:
    return Bundle.load(mobilenet_bundle)


# -- exact answers on CUDA ---------------------------------------------------------------------------


def test_cuda_computes_without_tf32_unless_asked() -> None:
    assert cuda_options() == {"use_tf32": "0", "cudnn_conv_algo_search": "HEURISTIC"}
    assert cuda_options(tf32=True)["use_tf32"] == "1"
    # Buckets warmed at start: cuDNN's exhaustive search runs there, once per size, not mid-stream.
    assert cuda_options(fixed_shapes=True)["cudnn_conv_algo_search"] == "EXHAUSTIVE"


def test_the_cuda_provider_gets_its_options(monkeypatch) -> None:
    monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA, CPU])
    assert providers_for("cuda") == [(CUDA, {"use_tf32": "0", "cudnn_conv_algo_search": "HEURISTIC"}), CPU]
    assert providers_for("auto", tf32=True, fixed_shapes=True) == [
        (CUDA, {"use_tf32": "1", "cudnn_conv_algo_search": "EXHAUSTIVE"}), CPU]
    assert providers_for("cpu", tf32=True) == [CPU]


@pytest.mark.skipif(HAS_CUDA, reason="this onnxruntime has CUDA")
def test_cuda_flags_without_cuda_fail_in_one_line(mobilenet_bundle, capsys) -> None:
    argv = ["serve", str(mobilenet_bundle), "--device", "cuda", "--tf32", "--no-zeroconf", "--port", "0", "--procs", "1"]
    assert host_cli.main(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("split-host: error: --device cuda: this onnxruntime has no CUDAExecutionProvider")


@pytest.mark.needs_gpu
@pytest.mark.skipif(not HAS_CUDA, reason=NEEDS_CUDA)
def test_cuda_with_tf32_stays_near_the_cpu(mobilenet_bundle) -> None:
    """What --tf32 costs: measured 0.013 on an H100's logits; 1e-2 is its documented tolerance."""
    bundle = Bundle.load(mobilenet_bundle)
    registry = TailRegistry([bundle], device="cuda", tf32=True)
    for split_id in TEST_SPLITS:
        x = cut(bundle, split_id, 4)
        (expected,) = unbatched(bundle, split_id, [x])
        np.testing.assert_allclose(registry.lookup(bundle.id, split_id).run(x), expected, atol=1e-1, rtol=0)


@pytest.mark.needs_gpu
@pytest.mark.skipif(not HAS_CUDA, reason=NEEDS_CUDA)
def test_cuda_buckets_and_binding_match_the_cpu(mobilenet_bundle) -> None:
    """Padded batches on CUDA, bound and warmed as the host runs them, within 1e-4 of the CPU."""
    bundle = Bundle.load(mobilenet_bundle)
    buckets = bucket_sizes("auto", 8, cuda=True)
    registry = TailRegistry([bundle], device="cuda", fixed_shapes=True)
    tail = registry.lookup(bundle.id, SPLIT)
    assert isinstance(tail, TailSession) and tail.io_binding
    for samples in range(1, 9):
        x = cut(bundle, SPLIT, samples, seed=samples)
        (expected,) = unbatched(bundle, SPLIT, [x])
        output, _, _ = run_batch(tail, [x], bucket_for(samples, buckets))
        np.testing.assert_allclose(output, expected, atol=1e-4, rtol=0)


# -- buckets ------------------------------------------------------------------------------------------


def test_buckets_are_powers_of_two_up_to_max_batch_on_cuda_only() -> None:
    assert bucket_sizes("auto", 8, cuda=True) == (1, 2, 4, 8)
    assert bucket_sizes("auto", 12, cuda=True) == (1, 2, 4, 8, 12)  # --max-batch is always a bucket
    assert bucket_sizes("auto", 32, cuda=False) == ()  # the CPU pays for every padded row
    assert bucket_sizes("off", 32, cuda=True) == ()
    assert bucket_sizes("auto", 1, cuda=True) == ()  # batching off: nothing to pad
    assert bucket_sizes("1,8", 32, cuda=False) == (1, 8, 32)  # asked for: on the CPU too
    assert [bucket_for(n, (1, 2, 4, 8)) for n in range(1, 10)] == [1, 2, 4, 4, 8, 8, 8, 8, 9]
    with pytest.raises(BackendError, match="sizes must be from 1 to --max-batch"):
        bucket_sizes("4,16", 8, cuda=True)


def test_bad_buckets_are_a_usage_error(mobilenet_bundle, capsys) -> None:
    for flags in (["--buckets", "1,x"], ["--buckets", "1,16"]):
        with pytest.raises(SystemExit) as exit_:
            host_cli.main(["serve", str(mobilenet_bundle), "--no-zeroconf", *flags])
        assert exit_.value.code == 2
    assert "--buckets 1,16: sizes must be from 1 to --max-batch (8)" in capsys.readouterr().err


def test_padded_batches_equal_unpadded_for_every_size(mobilenet_bundle) -> None:
    """Every batch size 1..max run padded to its bucket: each request's rows are its own answer,
    within 1e-6 of the same requests run unpadded."""
    bundle = Bundle.load(mobilenet_bundle)
    tail = TailRegistry([bundle], threads=1, device="cpu").lookup(bundle.id, SPLIT)
    buckets = bucket_sizes("auto", 8, cuda=True)
    for samples in range(1, 9):
        tensors = [cut(bundle, SPLIT, 1, seed=100 * samples + i) for i in range(samples)]
        padded, _, _ = run_batch(tail, tensors, bucket_for(samples, buckets))
        unpadded, _, _ = run_batch(tail, tensors)
        assert padded.shape == unpadded.shape == (samples, 1000)
        np.testing.assert_allclose(padded, unpadded, atol=1e-6, rtol=0)


class Counting:
    """A tail that counts the batch sizes it runs (thread-safe: the workers and the warm-up share it)."""

    def __init__(self, tail) -> None:
        self.tail, self.runs, self._lock = tail, Counter(), threading.Lock()

    def run(self, x: np.ndarray) -> np.ndarray:
        with self._lock:
            self.runs[int(x.shape[0])] += 1
        return self.tail.run(x)

    def __getattr__(self, name: str):
        return getattr(self.tail, name)


def counting_host(mobilenet_bundle, **batching):
    """A host whose tails count their runs, started (and warmed) only once they count."""
    from host_runtime.server import HostServer, ServerConfig

    registry = TailRegistry.from_paths([mobilenet_bundle], threads=1, device="cpu")
    registry.tails = {key: Counting(tail) for key, tail in registry.tails.items()}
    return HostServer(registry, ServerConfig(host="127.0.0.1", port=0, workers=2, batching=BatchConfig(**batching)))


def test_each_bucket_is_warmed_once_per_tail_at_start(mobilenet_bundle) -> None:
    server = counting_host(mobilenet_bundle, max_batch=8, buckets=(1, 2, 4, 8))

    async def go() -> None:
        await server.start()
        await server.close()

    asyncio.run(go())
    assert len(server.registry.tails) == 5  # two cuts, the chain's two stages, offload
    for tail in server.registry.tails.values():
        assert tail.runs == {1: 1, 2: 1, 4: 1, 8: 1}


def test_no_warm_up_without_buckets(mobilenet_bundle) -> None:
    server = counting_host(mobilenet_bundle, max_batch=8)

    async def go() -> None:
        await server.start()
        await server.close()

    asyncio.run(go())
    assert all(not tail.runs for tail in server.registry.tails.values())


def test_a_batch_of_three_runs_as_four(mobilenet_bundle, bundle) -> None:
    for host in start_host([mobilenet_bundle], batching=BatchConfig(max_batch=8, buckets=(1, 2, 4, 8))):
        tail = host.server.registry.tails[(bundle.id, SPLIT)]
        host.server.registry.tails[(bundle.id, SPLIT)] = counting = Counting(tail)
        x = cut(bundle, SPLIT, 3)

        async def session(client):
            return await infer(client, bundle.id, SPLIT, x)

        reply = run_with_client(host, session)
        stats = host.server.stats.as_dict()
    assert counting.runs == {4: 1}
    assert reply["batch"] == 3 and reply["tensor"].shape == (3, 1000)  # the padded row is not sent
    (expected,) = unbatched(bundle, SPLIT, [x])
    np.testing.assert_allclose(reply["tensor"], expected, atol=1e-5, rtol=0)
    assert stats["padded_samples"] == 1 and stats["batch_size"]["sum"] == 3


class RowOf:
    """A tail whose answer says which input row it came from: each row's first value, so a request
    filled with its own number gets that number back, and a padded (zero) row gives 0."""

    name, input_dtype = "row-of", "float32"

    def __init__(self, sample_shape: tuple[int, ...]) -> None:
        self.input_shape = ("batch", *sample_shape)
        self.batches: list[int] = []

    def run(self, x: np.ndarray) -> np.ndarray:
        self.batches.append(int(x.shape[0]))
        return x.reshape(x.shape[0], -1)[:, :1].copy()


def test_no_answer_comes_from_a_padded_row(mobilenet_bundle, bundle) -> None:
    shape = bundle.manifest.split(SPLIT).tensor.shape
    row_of = RowOf(tuple(shape))
    for host in start_host([mobilenet_bundle], batching=BatchConfig(max_batch=8, buckets=(1, 2, 4, 8))):
        host.server.registry.tails[(bundle.id, SPLIT)] = row_of

        async def session(client):
            tensors = [np.full((1 + i % 2, *shape), i + 1, dtype=np.float32) for i in range(11)]
            replies = await asyncio.gather(*(infer(client, bundle.id, SPLIT, t) for t in tensors))
            return tensors, replies

        tensors, replies = run_with_client(host, session)
    for tensor, reply in zip(tensors, replies):
        assert reply["tensor"].shape == (tensor.shape[0], 1)
        assert (reply["tensor"] == tensor[0, 0, 0, 0]).all()  # its own rows, never a zero row
    assert set(row_of.batches) <= {1, 2, 4, 8}  # every batch ran at a bucket size


# -- I/O binding --------------------------------------------------------------------------------------


def test_a_bound_run_equals_session_run(mobilenet_bundle) -> None:
    bundle = Bundle.load(mobilenet_bundle)
    plain = TailRegistry([bundle], threads=1, device="cpu").lookup(bundle.id, SPLIT)
    bound = TailRegistry([bundle], threads=1, device="cpu", io_binding=True).lookup(bundle.id, SPLIT)
    assert isinstance(bound, TailSession) and bound.io_binding and not plain.io_binding
    for samples in (1, 3, 8, 3):  # the binding is reused across shapes
        x = cut(bundle, SPLIT, samples, seed=samples)
        np.testing.assert_array_equal(bound.run(x), plain.run(x))
    with pytest.raises(BackendError, match="takes shape"):
        bound.run(np.zeros((1, 3, 3, 3), dtype=np.float32))


def test_cpu_tails_keep_plain_runs(mobilenet_bundle) -> None:
    registry = TailRegistry.from_paths([mobilenet_bundle], threads=1, device="cpu")
    assert not any(tail.io_binding for tail in registry.tails.values())
