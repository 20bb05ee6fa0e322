"""The bounded queue between the camera and the head: where frames are dropped, by policy.

A live camera does not wait for the network. When the queue is full, ``newest`` wins: the
oldest waiting frame is dropped to make room, so what is classified is as fresh as the
pipeline allows (the frame drop rate of the DNN-slicing simulator paper, counted here). A
recorded source (files, a video) is never dropped: its reader waits instead.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

__all__ = ["DROP_POLICIES", "FrameQueue"]

DROP_POLICIES = ("newest", "none")  # newest wins (drop the oldest waiting), or block the reader

Frame = TypeVar("Frame")


class FrameQueue(Generic[Frame]):
    """Frames waiting for the head, at most ``capacity`` of them."""

    def __init__(self, capacity: int, policy: str = "newest") -> None:
        if capacity < 1:
            raise ValueError(f"queue capacity must be at least 1, got {capacity}")
        if policy not in DROP_POLICIES:
            raise ValueError(f"drop policy {policy!r}: expected one of {', '.join(DROP_POLICIES)}")
        self.capacity, self.policy = capacity, policy
        self._frames: deque[Frame] = deque()
        self._changed = asyncio.Event()
        self._closed = False
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._frames)

    async def put(self, frame: Frame) -> Frame | None:
        """Queue ``frame``; returns the frame dropped to make room, if any (policy ``newest``)."""
        if self._closed:
            raise RuntimeError("put on a closed frame queue")
        victim = None
        if self.policy == "newest":
            if len(self._frames) >= self.capacity:
                victim = self._frames.popleft()
                self.dropped += 1
        else:
            while len(self._frames) >= self.capacity:
                await self._wait()
        self._frames.append(frame)
        self._notify()
        return victim

    def close(self) -> None:
        """No more frames: readers get what is left, then an empty batch."""
        self._closed = True
        self._notify()

    async def get_batch(self, size: int) -> list[Frame]:
        """Up to ``size`` frames, oldest first: waits until ``size`` are queued or the queue is
        closed. An empty list means closed and drained."""
        while len(self._frames) < size and not self._closed:
            await self._wait()
        batch = [self._frames.popleft() for _ in range(min(size, len(self._frames)))]
        self._notify()
        return batch

    async def _wait(self) -> None:
        self._changed.clear()
        await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()
