"""What the stream loop hands over once a head is done, and how a batch's answer becomes its frames' results.

The loop (:mod:`device_runtime.stream._pipeline`) captures, queues, chooses and runs the head; a batch
that goes on to a host leaves it as one frozen :class:`HeadDone`, taken by whoever answers it: the
connected host (:mod:`device_runtime.stream._remote`), a semantic split's fragments
(:mod:`device_runtime.stream._fragments`), or the board again when they fail
(:meth:`~device_runtime.stream._board_engine.BoardEngine.fallback`). Each of them says how it
answered in an :class:`Answer`, which every frame of the batch shares.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import numpy as np

from device_runtime.stream._camera import Frame
from device_runtime.stream._reason import Reason
from device_runtime.stream._results import FrameResult, top1

__all__ = ["Answer", "Captured", "HeadDone", "InFlight"]


@dataclass(frozen=True)
class Captured:
    """A frame the queue kept, preprocessed."""

    frame: Frame
    x: np.ndarray  # (1, *input) preprocessed
    preprocess_ms: float
    deadline_ms: float | None  # the frame's own deadline, else the run's


@dataclass(frozen=True)
class Answer:
    """How one batch was answered: the split that answered it, its stages' times (ms), the host
    (None: here) and the waits apart from its stages; every frame of the batch shares them."""

    split: str
    rate: float | None  # the rate estimate the split was chosen with (bit/s)
    reason: Reason  # why the split answered it
    head_ms: float
    transfer_ms: float = 0.0
    tail_ms: float = 0.0
    sent_bytes: int = 0
    host: str | None = None
    error: str | None = None  # why a remote answer fell back here
    started: float | None = None  # monotonic s when the batch's head started
    slot_ms: float = 0.0
    host_queue_ms: float = 0.0
    missing: tuple[int, ...] = ()  # semantic fragments that did not answer in time
    attempted: str | None = None  # the split tried before a fallback

    def results(self, batch: list[Captured], logits: np.ndarray, labels: list[str]) -> list[FrameResult]:
        """One result per frame; each frame waited in the queue from its preprocessing's end until
        the batch's head started (``started``)."""
        now = time.monotonic()
        results = []
        for captured, row in zip(batch, logits):
            label, probability = top1(row, labels)
            results.append(FrameResult(
                index=captured.frame.index, name=captured.frame.name, label=label, probability=probability,
                split=self.split, preprocess_ms=captured.preprocess_ms, head_ms=self.head_ms,
                transfer_ms=self.transfer_ms, tail_ms=self.tail_ms,
                total_ms=(now - captured.frame.captured) * 1000.0, captured=captured.frame.captured,
                queue_ms=0.0 if self.started is None else max(
                    (self.started - captured.frame.captured) * 1000.0 - captured.preprocess_ms, 0.0),
                slot_ms=self.slot_ms, host_queue_ms=self.host_queue_ms,
                batch=len(batch), bytes=self.sent_bytes // len(batch), rate_bps=self.rate,
                where="local" if self.host is None else "remote", host=self.host, error=self.error,
                missing=self.missing, attempted=self.attempted, reason=self.reason, deadline_ms=captured.deadline_ms,
            ))
        return results


@dataclass(frozen=True)
class HeadDone:
    """A batch whose head has run, on its way to a host: what it carries to whoever answers it."""

    batch: list[Captured]
    x: np.ndarray  # the batch's input, for the board to answer it with the full model after all
    split: str
    tensor: np.ndarray  # the cut, as sent
    fields: dict[str, float]  # the cut's quantization fields, sent with it
    head_ms: float
    rate: float | None  # the rate estimate the split was chosen with (bit/s)
    reason: Reason  # why the split was chosen
    started: float  # monotonic s when the head started: the frames' queueing ends there
    slot_ms: float  # waited for one of the ``in_flight`` slots
    deadline: float | None  # the batch's (ms): the tightest of its frames'

    def answered(
        self, host: str, transfer_ms: float, tail_ms: float, host_queue_ms: float, missing: tuple[int, ...] = (),
    ) -> Answer:
        """This batch answered by its split on ``host`` (several: a chain's, a semantic split's)."""
        return Answer(self.split, self.rate, self.reason, self.head_ms, transfer_ms=transfer_ms, tail_ms=tail_ms,
                      sent_bytes=self.tensor.nbytes, host=host, started=self.started, slot_ms=self.slot_ms,
                      host_queue_ms=host_queue_ms, missing=missing)


class InFlight:
    """Remote batches outstanding, at most ``limit``: the loop takes a slot before a batch goes,
    and whoever answers it gives the slot back when its request settles. Local batches take none:
    the board keeps running them while the link is slow."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0
        self._slots: asyncio.Semaphore | None = None  # made in the run's loop (:meth:`open`)

    def open(self) -> None:
        self._slots = asyncio.Semaphore(self.limit)

    async def take(self) -> float:
        """Wait for a slot; returns how long that took (ms)."""
        assert self._slots is not None
        waiting = time.monotonic()
        await self._slots.acquire()
        slot_ms = (time.monotonic() - waiting) * 1e3
        self.count += 1
        return slot_ms

    def give_back(self) -> None:
        self.count -= 1
        assert self._slots is not None
        self._slots.release()
