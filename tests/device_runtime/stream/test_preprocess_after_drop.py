"""Frames are preprocessed after the queue decides which to keep: a dropped frame is never resized."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Iterator

import numpy as np

from device_runtime.bundle import LOCAL, Bundle
from device_runtime.engine._runner import DeviceRunner
from device_runtime.stream._camera import Frame, FrameSource
from device_runtime.stream._pipeline import Pipeline, PipelineConfig
from device_runtime.stream._policy import StaticPolicy
from device_runtime.stream._results import DROP_QUEUE_FULL

FRAMES = 12


class _FastCamera(FrameSource):
    """A live camera that delivers ``FRAMES`` frames at once, and says when the last was taken."""

    live = True

    def __init__(self) -> None:
        self.all_taken = threading.Event()

    def __iter__(self) -> Iterator[Frame]:
        image = np.random.default_rng(0).integers(0, 255, (60, 80, 3), dtype=np.uint8)
        for index in range(FRAMES):
            yield Frame(index, f"fast#{index}", image, time.monotonic())
        self.all_taken.set()  # the capture thread asked for one more: every frame is in the queue or dropped


def test_dropped_frames_are_never_preprocessed(mobilenet_bundle: Path) -> None:
    """The head is held on the first frame until the camera has delivered all of them: with a
    queue of one, frames 1..10 are dropped, and only frames 0 and 11 are preprocessed."""
    bundle = Bundle.load(mobilenet_bundle, roles=("full",))
    runner = DeviceRunner(bundle, threads=1)
    camera = _FastCamera()
    preprocessed: list[int] = []
    preprocess, run_full = runner.preprocess, runner.run_full

    def counting_preprocess(image: np.ndarray) -> np.ndarray:
        preprocessed.append(int(image.sum()))  # any stable mark: counted below
        return preprocess(image)

    def slow_head(x: np.ndarray) -> tuple[np.ndarray, float]:
        assert camera.all_taken.wait(30), "the camera never finished"
        return run_full(x)

    runner.preprocess = counting_preprocess  # type: ignore[method-assign]
    runner.run_full = slow_head  # type: ignore[method-assign]

    async def go():
        pipeline = Pipeline(runner, StaticPolicy(LOCAL, bundle), config=PipelineConfig(queue=1))
        return [r async for r in pipeline.run(camera)], pipeline.stats

    results, stats = asyncio.run(go())
    answered = sorted(r.index for r in results if not r.dropped)
    assert sorted(r.index for r in results) == list(range(FRAMES))  # every frame reported once
    assert answered == [0, FRAMES - 1] and stats.dropped == FRAMES - 2
    assert {r.drop_reason for r in results if r.dropped} == {DROP_QUEUE_FULL}  # the trace's reason
    assert len(preprocessed) == len(answered)  # was FRAMES: every captured frame was preprocessed
