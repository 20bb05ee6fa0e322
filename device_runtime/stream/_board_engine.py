"""The board's one inference engine: a thread of its own, held to a trial's pace when there is one.

Every stage the board computes runs here (preprocessing, heads, the full model), one at a time,
so that capture and the link overlap with it. A batch a host did not answer is answered here
with the full model (:meth:`BoardEngine.fallback`): no frame is lost.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Callable, TypeVar

import numpy as np

from device_runtime.bundle import LOCAL
from device_runtime.engine import DeviceRunner
from device_runtime.stream._camera import Frame
from device_runtime.stream._handoff import Answer, Captured, HeadDone
from device_runtime.stream._pace import PREPROCESS, BoardPace
from device_runtime.stream._reason import DEADLINE, FALLBACK, Reason
from device_runtime.stream._results import FrameResult
from device_runtime.wire import ErrorCode
from splitedge.errors import RemoteError

__all__ = ["BoardEngine"]

T = TypeVar("T")


class BoardEngine:
    """Runs the board's stages of ``runner`` on one thread, each held to ``pace`` when there is one."""

    def __init__(self, runner: DeviceRunner, pace: BoardPace | None) -> None:
        self.runner, self.pace = runner, pace
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="compute")

    async def call(self, run: Callable[..., T], *args: object) -> T:
        """``run(*args)`` on the engine's thread."""
        return await asyncio.get_running_loop().run_in_executor(self._thread, run, *args)

    async def on(self, batch: list[Captured], stage: str, run: Callable[[], tuple[T, float]]) -> tuple[T, float]:
        """:meth:`held` for a batch, on the engine's thread."""
        return await self.call(self.held, batch[0].frame.index, len(batch), stage, run)

    def held(self, index: int, batch: int, stage: str, run: Callable[[], tuple[T, float]]) -> tuple[T, float]:
        """``run`` a stage of the batch of ``batch`` frames from frame ``index`` on the board's engine
        (this thread): with a pace, held to the time the trial's board took for it."""
        pace = self.pace
        return run() if pace is None else pace.hold(pace.target_ms(index, stage, batch), run)

    def preprocess(self, frames: list[Frame], deadline_ms: float | None) -> list[Captured]:
        """On this thread: each frame preprocessed and timed, with its own deadline or else ``deadline_ms``."""
        return [Captured(frame, *self.held(frame.index, 1, PREPROCESS, partial(self._timed_preprocess, frame)),
                         deadline_ms=frame.deadline_ms if frame.deadline_ms is not None else deadline_ms)
                for frame in frames]

    def _timed_preprocess(self, frame: Frame) -> tuple[np.ndarray, float]:
        start = time.perf_counter()
        x = self.runner.preprocess(frame.image)
        return x, (time.perf_counter() - start) * 1000.0

    async def full(self, batch: list[Captured], x: np.ndarray) -> tuple[np.ndarray, float]:
        """The full model on the batch's input ``x``: its logits and time (ms)."""
        return await self.on(batch, LOCAL, partial(self.runner.run_full, x))

    async def fallback(self, done: HeadDone, exc: Exception) -> list[FrameResult]:
        """A remote batch that failed, answered here with the full model: no frame is lost. Its
        reason says so: ``deadline`` where the host refused it for the frame's deadline, else
        ``fallback``, with the reason its split was chosen for."""
        logits, ms = await self.full(done.batch, done.x)
        refused = isinstance(exc, RemoteError) and exc.code == ErrorCode.DEADLINE_EXCEEDED
        reason = Reason(DEADLINE if refused else FALLBACK, batch=len(done.batch), rate_bps=done.rate, wanted=done.split,
                        error=str(exc), deadline_ms=done.deadline if refused else None, chosen=done.reason)
        answer = Answer(LOCAL, done.rate, reason, done.head_ms + ms, error=f"{done.split}: {exc}",
                        attempted=done.split, started=done.started, slot_ms=done.slot_ms)
        return answer.results(done.batch, logits, self.runner.labels)

    def shutdown(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)
