"""A GPU host, checked on the CPU (issue 19): CUDA's provider options give the CPU's answers unless
``--tf32``; batches padded to buckets give every request its own rows, equal to an unpadded run;
each bucket is warmed once per tail at start; a bound run (I/O binding) equals ``session.run``.
One shape per session (issue 32): on CUDA each bucket size has a session of its own in every tail,
and a batch padded to bucket B runs on session B (forced on the CPU here with ``per_bucket``).
What needs a GPU is skipped, with its reason, where onnxruntime has no CUDA provider; the GPU
tests take whatever tails the test bundle has."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

import numpy as np
import onnxruntime as ort
import pytest

from device_runtime.bundle import Bundle
from host_runtime import cli as host_cli
from host_runtime._batcher import BatchConfig
from host_runtime._tails import (
    CPU,
    CUDA,
    TF32_ERROR,
    TailRegistry,
    TailSession,
    bucket_for,
    bucket_sizes,
    can_pad,
    cuda_memory,
    cuda_options,
    providers_for,
    run_batch,
    warm_up,
)
from splitedge.errors import BackendError
from tests.conftest import TEST_SPLITS, start_host
from tests.host_runtime.helpers import cut, infer, run_with_client, unbatched

HAS_CUDA = CUDA in ort.get_available_providers()
NEEDS_CUDA = "needs onnxruntime with the CUDA provider and a GPU"
SPLIT = TEST_SPLITS[1]  # the lightest tail
BUCKETS = (1, 2, 4, 8)


@pytest.fixture(scope="module")
def bundle(mobilenet_bundle) -> Bundle:
    return Bundle.load(mobilenet_bundle)


def sample_batch(tail, batch: int, seed: int = 0) -> np.ndarray:
    """Seeded noise that fits ``tail``'s input, whatever tail it is: normal noise for a cut (as
    :func:`cut`), random pixels (0..255) for the full model's image."""
    shape = (batch, *(int(d) for d in tail.input_shape[1:]))
    rng = np.random.default_rng(seed)
    if tail.input_dtype == "uint8" or len(shape) == 4 and shape[1] == 3:
        return rng.integers(0, 256, shape).astype(tail.input_dtype)
    return rng.standard_normal(shape, dtype=np.float32)


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
def test_cuda_with_tf32_stays_near_the_cpu(bundle) -> None:
    """What --tf32 costs, as measured (TF32_ERROR: the largest difference over 64 samples per tail on an
    H200 and an H100), is what it may cost here: every tail the bundle has, against the CPU."""
    registry = TailRegistry([bundle], device="cuda", tf32=True)
    cpu = TailRegistry([bundle], threads=1, device="cpu")
    assert registry.tails.keys() == cpu.tails.keys()
    for key, tail in registry.tails.items():
        x = sample_batch(tail, 4, seed=len(key[1]))
        np.testing.assert_allclose(tail.run(x), cpu.tails[key].run(x), atol=TF32_ERROR, rtol=0, err_msg=str(key))


@pytest.mark.needs_gpu
@pytest.mark.skipif(not HAS_CUDA, reason=NEEDS_CUDA)
def test_cuda_buckets_and_binding_match_the_cpu(bundle) -> None:
    """Padded batches on CUDA in one session per tail (``per_bucket=False``, as before issue 32), bound,
    within 1e-4 of the CPU: every tail the bundle has."""
    buckets = bucket_sizes("auto", 8, cuda=True)
    registry = TailRegistry([bundle], device="cuda", fixed_shapes=True, buckets=buckets, per_bucket=False)
    cpu = TailRegistry([bundle], threads=1, device="cpu")
    for key, tail in registry.tails.items():
        assert isinstance(tail, TailSession) and tail.io_binding and not tail.sessions
        for samples in range(1, 9):
            x = sample_batch(tail, samples, seed=samples)
            output, _, _ = run_batch(tail, [x], bucket_for(samples, buckets) if can_pad(tail) else 0)
            np.testing.assert_allclose(output, cpu.tails[key].run(x), atol=1e-4, rtol=0, err_msg=str(key))


@pytest.mark.needs_gpu
@pytest.mark.skipif(not HAS_CUDA, reason=NEEDS_CUDA)
def test_on_cuda_each_bucket_has_a_session_of_its_own(bundle) -> None:
    """Issue 32: a session per bucket size in every tail that can be padded, on CUDA, each of one shape;
    padded batches on them within 1e-4 of the CPU; and batches of changing sizes, which cost a single
    session 30-130 ms each (cuDNN's plan rebuilt), run at a GPU's speed."""
    registry = TailRegistry([bundle], device="cuda", buckets=BUCKETS)
    cpu = TailRegistry([bundle], threads=1, device="cpu")
    padded = [tail for tail in registry.tails.values() if can_pad(tail)]
    assert padded, "the bundle has no tail with a free batch axis"
    assert "one per batch size (1,2,4,8)" in registry.sessions() and cuda_memory() is not None
    for key, tail in registry.tails.items():
        if not can_pad(tail):
            continue
        assert sorted(tail.sessions) == list(BUCKETS) and tail.io_binding
        for size, session in tail.sessions.items():
            assert session.get_providers()[0] == CUDA
            assert session.get_inputs()[0].shape[0] == size  # fixed: this session sees no other shape
        warm_up(tail, BUCKETS)
        for samples in (1, 3, 8):
            x = sample_batch(tail, samples, seed=samples)
            output, _, _ = run_batch(tail, [x], bucket_for(samples, BUCKETS))
            np.testing.assert_allclose(output, cpu.tails[key].run(x), atol=1e-4, rtol=0, err_msg=str(key))
        xs = [sample_batch(tail, samples, seed=samples) for samples in (1, 3, 8, 2)]
        times = []
        for _ in range(10):
            for x in xs:
                _, _, ms = run_batch(tail, [x], bucket_for(x.shape[0], BUCKETS))
                times.append(ms)
        assert sorted(times)[len(times) // 2] < 20, f"{key}: median {sorted(times)[len(times) // 2]:.1f} ms a batch"


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
    """A tail that counts the batch sizes the warm-up and the workers run (thread-safe: they share it).
    The profiler's start-up probe is not counted: it costs each tail in the background, on its own
    thread, and may or may not have reached a tail before the host closes (a loaded machine once
    failed test_no_warm_up_without_buckets on it)."""

    def __init__(self, tail) -> None:
        self.tail, self.runs, self._lock = tail, Counter(), threading.Lock()

    def run(self, x: np.ndarray) -> np.ndarray:
        if not threading.current_thread().name.startswith("profile"):
            with self._lock:
                self.runs[int(x.shape[0])] += 1
        return self.tail.run(x)

    def __getattr__(self, name: str):
        return getattr(self.tail, name)


def counting_host(mobilenet_bundle, **batching):
    """A host whose tails count their runs, started (and warmed) only once they count."""
    from host_runtime._server import HostServer, ServerConfig

    registry = TailRegistry.from_paths([mobilenet_bundle], threads=1, device="cpu")
    registry.tails = {key: Counting(tail) for key, tail in registry.tails.items()}
    return HostServer(registry, ServerConfig(host="127.0.0.1", port=0, workers=2, batching=BatchConfig(**batching)))


def test_each_bucket_is_warmed_once_per_tail_at_start(mobilenet_bundle) -> None:
    server = counting_host(mobilenet_bundle, max_batch=8, buckets=(1, 2, 4, 8))

    async def go() -> None:
        await server.start()
        await server.close()

    asyncio.run(go())
    assert server.registry.tails
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


# -- one shape per session (issue 32), forced on the CPU ----------------------------------------------


class Spy:
    """An onnxruntime session that notes the batch sizes it runs (plain or bound)."""

    def __init__(self, session) -> None:
        self.session, self.sizes, self._lock = session, [], threading.Lock()

    def run(self, names, feeds):
        with self._lock:
            self.sizes.append(int(next(iter(feeds.values())).shape[0]))
        return self.session.run(names, feeds)

    def run_with_iobinding(self, binding):
        with self._lock:
            self.sizes.append("bound")
        return self.session.run_with_iobinding(binding)

    def __getattr__(self, name: str):
        return getattr(self.session, name)


def spied(tail: TailSession) -> TailSession:
    tail.session = Spy(tail.session)
    tail.sessions = {size: Spy(session) for size, session in tail.sessions.items()}
    return tail


def test_a_session_per_bucket_only_on_cuda_unless_asked(bundle) -> None:
    """Off CUDA one session serves every size, as before; ``per_bucket`` forces a session per bucket,
    each with its batch axis fixed to the bucket, in every tail that can be padded."""
    assert all(not tail.sessions for tail in TailRegistry([bundle], threads=1, device="cpu", buckets=BUCKETS).tails.values())
    registry = TailRegistry([bundle], threads=1, device="cpu", buckets=BUCKETS, per_bucket=True)
    assert registry.tails
    for tail in registry.tails.values():
        assert sorted(tail.sessions) == (list(BUCKETS) if can_pad(tail) else [])
        assert all(session.get_inputs()[0].shape[0] == size for size, session in tail.sessions.items())
    assert registry.sessions().startswith(f"{len(registry.tails) * (1 + len(BUCKETS))} onnxruntime sessions")


@pytest.mark.parametrize("bound", [False, True], ids=["run", "io-binding"])
def test_a_padded_batch_runs_on_the_session_of_its_bucket(bundle, bound) -> None:
    """Every batch size 1..8 padded to its bucket runs on that bucket's session and no other, within
    1e-6 of the same requests unpadded; a batch past the largest bucket runs on the general session."""
    path = bundle.artifact(SPLIT, "tail")
    tail = spied(TailSession(path, 1, [CPU], bound, BUCKETS, per_bucket=True))
    reference = TailRegistry([bundle], threads=1, device="cpu").lookup(bundle.id, SPLIT)
    for samples in range(1, 11):
        tensors = [cut(bundle, SPLIT, 1, seed=100 * samples + i) for i in range(samples)]
        before = {size: len(spy.sizes) for size, spy in tail.sessions.items()} | {0: len(tail.session.sizes)}
        padded, _, _ = run_batch(tail, tensors, bucket_for(samples, BUCKETS))
        ran = {size: len(spy.sizes) - before[size] for size, spy in tail.sessions.items()}
        ran[0] = len(tail.session.sizes) - before[0]
        expected_session = bucket_for(samples, BUCKETS) if samples <= BUCKETS[-1] else 0
        assert ran == {size: int(size == expected_session) for size in ran}, (samples, ran)
        unpadded, _, _ = run_batch(reference, tensors)
        assert padded.shape == unpadded.shape == (samples, 1000)
        np.testing.assert_allclose(padded, unpadded, atol=1e-6, rtol=0)


def test_each_worker_thread_binds_each_session_once(bundle) -> None:
    """With I/O binding, a thread keeps one binding per session, reused across its runs, its own."""
    tail = TailSession(bundle.artifact(SPLIT, "tail"), 1, [CPU], True, BUCKETS, per_bucket=True)
    made: list[tuple[str, int]] = []
    for size, session in [*tail.sessions.items(), (0, tail.session)]:
        real = session.io_binding

        def io_binding(real=real, size=size):
            made.append((threading.current_thread().name, size))
            return real()
        session.io_binding = io_binding
    x3, x8 = cut(bundle, SPLIT, 3), cut(bundle, SPLIT, 8)

    def work() -> None:
        for _ in range(3):
            for x in (x3, x8, cut(bundle, SPLIT, 9)):
                run_batch(tail, [x], bucket_for(x.shape[0], BUCKETS))
    threads = [threading.Thread(target=work, name=f"tail-{i}") for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(made) == sorted((f"tail-{i}", size) for i in range(2) for size in (4, 8, 0))


def test_the_host_warms_and_runs_each_bucket_on_its_own_session(mobilenet_bundle, bundle) -> None:
    """The host as it runs on CUDA, forced on the CPU: its warm-up runs every bucket's session once, and
    a request of 3 samples then runs on the session of 4, answered with its own rows only."""
    from host_runtime._server import HostServer, ServerConfig
    from device_runtime.link import HostClient

    registry = TailRegistry([bundle], threads=1, device="cpu", buckets=BUCKETS, per_bucket=True)
    for tail in registry.tails.values():
        spied(tail)
    server = HostServer(registry, ServerConfig(host="127.0.0.1", port=0, workers=2,
                                               batching=BatchConfig(max_batch=8, buckets=BUCKETS)))
    x = cut(bundle, SPLIT, 3)

    async def go():
        host, port = await server.start()
        warmed = {key: {size: list(spy.sizes) for size, spy in tail.sessions.items()} for key, tail in registry.tails.items()}
        client = await HostClient.connect(host, port)
        try:
            reply = await infer(client, bundle.id, SPLIT, x)
        finally:
            await client.close()
            await server.close()
        return warmed, reply

    warmed, reply = asyncio.run(go())
    for key, sessions in warmed.items():
        # Once each; the profiler's probe of each tail at start (a batch of 1) may have come too.
        assert {size: runs[-1:] for size, runs in sessions.items()} == {size: [size] for size in BUCKETS}, key
        assert all(len(runs) == 1 for size, runs in sessions.items() if size != 1), key
    tail = registry.tails[(bundle.id, SPLIT)]
    assert tail.sessions[4].sizes == [4, 4] and tail.session.sizes == []
    assert all(tail.sessions[size].sizes == [size] for size in (2, 8))
    (expected,) = unbatched(bundle, SPLIT, [x])
    assert reply["batch"] == 3 and reply["tensor"].shape == (3, 1000)
    np.testing.assert_allclose(reply["tensor"], expected, atol=1e-5, rtol=0)


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
