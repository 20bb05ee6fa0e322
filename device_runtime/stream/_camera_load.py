"""``calibrate --camera``: the board's camera capturing while its heads are timed, as in the run.

A run's board does more than its heads and preprocessing: its camera thread captures (and, for a
video file, decodes) every frame on the same CPUs. Timed without it, a quarter core's stages
came out half of what the run measured (issue 43's trial: preprocessing 9 ms calibrated, 17-22 ms
in the run, beside a 720×528 video's decoding). So ``calibrate --camera SPEC`` opens the camera
the run will open and keeps it capturing at its own pace in a thread of its own while the board
is timed, and preprocessing is timed on its latest frame (its real size and content) rather than
on a synthetic one.
"""

from __future__ import annotations

import threading
from typing import Iterator

import numpy as np

from device_runtime.stream._camera import Frame, FrameSource
from splitedge.errors import CameraError

__all__ = ["CameraLoad"]

#: How long to wait for the camera's first frame before calibration gives up on it.
FIRST_FRAME_S = 30.0
#: How long closing waits for the capture thread (one frame's capture, at most a slow one's).
JOIN_S = 5.0


class CameraLoad:
    """A source capturing in a thread of its own until :meth:`close`; :meth:`latest` is its newest
    frame. A context manager. A camera that fails is an error at the next :meth:`latest`."""

    def __init__(self, source: FrameSource) -> None:
        self.source = source
        self.frames = 0  # captured so far
        self._latest: np.ndarray | None = None
        self._error: BaseException | None = None
        self._first = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._capture, name="calibrate-camera", daemon=True)

    def __enter__(self) -> CameraLoad:
        self._thread.start()
        if not self._first.wait(FIRST_FRAME_S) or self._latest is None:
            self.close()
            raise CameraError(self._error_text(f"no frame from {self.source.description} in {FIRST_FRAME_S:g} s"))
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _capture(self) -> None:
        frames: Iterator[Frame] = iter(self.source)
        try:
            while not self._stop.is_set():
                frame = next(frames, None)
                if frame is None:
                    break
                self._latest = frame.image
                self.frames += 1
                self._first.set()
        except Exception as exc:  # a dead camera: said at the next latest(), not lost in a thread
            self._error = exc
        finally:
            self._first.set()

    def _error_text(self, fallback: str) -> str:
        return f"the camera failed while the board was timed: {self._error}" if self._error else fallback

    @property
    def size(self) -> tuple[int, int]:
        """The camera's frames' (width, height)."""
        assert self._latest is not None  # __enter__ waited for one
        height, width = self._latest.shape[:2]
        return width, height

    def latest(self) -> np.ndarray:
        """The newest frame captured (the camera keeps capturing meanwhile)."""
        if self._error is not None:
            raise CameraError(self._error_text(""))
        assert self._latest is not None
        return self._latest

    def close(self) -> None:
        self._stop.set()
        self._thread.join(JOIN_S)
        self.source.close()
