"""The stream: overlap, drops by policy, and no frame lost when the host dies and comes back."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from device_runtime.bundle import LOCAL, Bundle
from device_runtime.engine._runner import DeviceRunner
from device_runtime.hosts._host_link import HostLink
from device_runtime.stream._camera import Frame, FrameSource, Synthetic
from device_runtime.stream._frame_queue import FrameQueue
from device_runtime.stream._pipeline import Pipeline, PipelineConfig
from device_runtime.stream._policy import StaticPolicy
from device_runtime.stream._reason import DEADLINE, FALLBACK, FIXED, NO_HOST, Reason
from splitedge.errors import BundleError
from tests.conftest import TEST_SPLITS, run_stream, start_host, until

SPLIT = TEST_SPLITS[-1]


def test_queue_drops_the_oldest_when_newest_wins() -> None:
    async def go():
        queue: FrameQueue[int] = FrameQueue(2, "newest")
        dropped = [await queue.put(i) for i in range(5)]
        queue.close()
        return dropped, await queue.get_batch(4), queue.dropped

    dropped, left, count = asyncio.run(go())
    assert dropped == [None, None, 0, 1, 2] and left == [3, 4] and count == 3


def test_queue_without_drops_makes_the_reader_wait() -> None:
    async def go():
        queue: FrameQueue[int] = FrameQueue(2, "none")
        writer = asyncio.ensure_future(asyncio.gather(*(queue.put(i) for i in range(6))))
        got = []
        while len(got) < 6:
            got += await queue.get_batch(2)
        await writer
        return got, queue.dropped

    assert asyncio.run(go()) == ([0, 1, 2, 3, 4, 5], 0)


def test_a_live_camera_faster_than_the_board_drops_frames_and_counts_them(mobilenet_bundle: Path) -> None:
    """A camera faster than the full model: frames are dropped, never lost silently."""
    bundle = Bundle.load(mobilenet_bundle, roles=("full",))
    runner = DeviceRunner(bundle, threads=1)
    runner.warm_up(LOCAL)

    async def go():
        pipeline = Pipeline(runner, StaticPolicy(LOCAL, bundle), config=PipelineConfig(queue=2))
        with _InstantCamera() as source:
            results = [r async for r in pipeline.run(source, frames=60)]
        return results, pipeline.stats

    results, stats = asyncio.run(go())
    assert sorted(r.index for r in results) == list(range(60))  # every captured frame is reported once
    dropped = [r for r in results if r.dropped]
    assert dropped and stats.dropped == len(dropped) and stats.drop_rate == pytest.approx(len(dropped) / 60)
    assert all(r.label for r in results if not r.dropped)
    # Newest wins: what is classified comes out in capture order, with the dropped ones between.
    answered = [r.index for r in results if not r.dropped]
    assert answered == sorted(answered)


@pytest.mark.parametrize(
    ("config", "live", "expected"),
    [
        (PipelineConfig(), True, (1, "newest")),  # a live camera: the freshest frame next, no standing backlog
        (PipelineConfig(batch=4), True, (4, "newest")),  # one batch's worth
        (PipelineConfig(), False, (4, "none")),  # files and videos: wait, drop nothing
        (PipelineConfig(queue=6, drop="newest"), False, (6, "newest")),  # as asked
    ],
)
def test_the_frame_queue_follows_the_source(config: PipelineConfig, live: bool, expected: tuple[int, str]) -> None:
    assert config.frame_queue(live) == expected


class _InstantCamera(FrameSource):
    """A live camera whose next frame is always ready: capture costs nearly nothing, far less
    than the full model, whatever else the machine is doing."""

    live = True

    def __iter__(self) -> Iterator[Frame]:
        image = np.random.default_rng(0).integers(0, 255, (60, 80, 3), dtype=np.uint8)
        for index in itertools.count():
            yield Frame(index, f"instant#{index}", image, time.monotonic())


def test_batches_group_frames(mobilenet_bundle: Path, host) -> None:
    bundle = Bundle.load(mobilenet_bundle)
    # No deadline: the live source's 33 ms would let a busy machine's host refuse a batch, and
    # this test is about batching, not admission.
    results = run_stream(
        DeviceRunner(bundle, threads=1), "synthetic", SPLIT, host, frames=12, batch=4, drop="none", deadline_ms=None
    )
    assert [r.index for r in results] == list(range(12))
    assert {r.batch for r in results} == {4} and all(r.where == "remote" for r in results)
    assert all(r.bytes == 160 * 7 * 7 * 4 for r in results)  # each frame's share of the batch's cut tensor


def test_host_killed_mid_stream_every_frame_answered_then_offloads_again(mobilenet_bundle: Path) -> None:
    """Kill the host with batches in flight: those run here, the stream goes on locally, and the
    device offloads again once a host answers on the same address."""
    bundle = Bundle.load(mobilenet_bundle)
    runner = DeviceRunner(bundle, threads=1)
    reference = {r.index: r.label for r in run_stream(runner, "synthetic", LOCAL, frames=90, drop="none")}
    first = start_host([mobilenet_bundle])
    host = next(first)
    port = host.port
    second = None

    def kill_then_restart(seen: threading.Event) -> None:
        nonlocal second
        seen.wait(30)
        next(first, None)  # the host goes away (its connections close)
        time.sleep(1.5)
        second = start_host([mobilenet_bundle], port=port)
        next(second)

    async def go():
        hosts = HostLink(bundle, f"127.0.0.1:{port}", retry_s=0.3, timeout=2.0)
        assert await hosts.connect()
        pipeline = Pipeline(runner, StaticPolicy(SPLIT, bundle), hosts, PipelineConfig(drop="none", request_timeout_s=2.0))
        seen = threading.Event()
        killer = threading.Thread(target=kill_then_restart, args=(seen,))
        killer.start()
        results = []
        try:
            with Synthetic(fps=30) as source:
                async for r in pipeline.run(source, frames=90):
                    results.append(r)
                    if len(results) == 10:
                        seen.set()
                    if len(results) == 60:  # the rest offload, however long the restart took
                        await until(lambda: hosts.client is not None, what="finding the restarted host")
        finally:
            seen.set()
            await hosts.close()
            await asyncio.get_running_loop().run_in_executor(None, killer.join, 30)
        return results, hosts.losses

    try:
        results, losses = asyncio.run(go())
    finally:
        if second is not None:
            next(second, None)
    results.sort(key=lambda r: r.index)  # a live stream answers each frame as soon as it is known
    assert [r.index for r in results] == list(range(90))  # none lost, none dropped
    assert {r.index: r.label for r in results} == reference
    where = [r.where for r in results]
    assert where[:10] == ["remote"] * 10, where[:10]
    assert "local" in where[10:] and where[-1] == "remote", where  # fell back, then offloaded again
    assert losses == 1
    # Each frame says why it ran where it did: the fixed split remotely; here, the split that could not
    # run (its batch failed on the way, no host to send it to, or refused for the frame's deadline).
    assert all(r.reason == Reason(FIXED) for r in results if r.where == "remote")
    local = [r for r in results if r.where == "local"]
    assert {r.reason.kind for r in local} <= {FALLBACK, NO_HOST, DEADLINE} and {r.reason.wanted for r in local} == {SPLIT}
    assert {FALLBACK, NO_HOST} & {r.reason.kind for r in local}, [r.reason for r in local]
    assert all(r.error == f"{SPLIT}: {r.reason.error}" for r in local if r.reason.kind == FALLBACK)
    assert all(r.reason.chosen == Reason(FIXED) for r in local if r.reason.kind in (FALLBACK, DEADLINE))
    assert all(r.line().endswith(f"why: {r.reason.text()}") for r in results)


def test_a_failure_ends_the_stream_with_its_error_not_a_hang(mobilenet_bundle: Path, host) -> None:
    """uint8 on the link for a bundle built without --quantize: the error, after no silent loss."""
    bundle = Bundle.load(mobilenet_bundle)
    with pytest.raises(BundleError, match="has no uint8 quantization; rebuild the bundle with --quantize int8"):
        run_stream(DeviceRunner(bundle, threads=1, transmit="uint8"), "synthetic", SPLIT, host, frames=5, drop="none")
