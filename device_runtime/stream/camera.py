"""Frame sources: a camera, a video file, a folder of images, or a synthetic stream.

Every source yields ``Frame`` objects holding an RGB uint8 (H, W, 3) array and closes its
device on exit (they are context managers). A camera that stops delivering raises
:class:`CameraError` instead of yielding nothing, so a dead camera is reported, not
mistaken for the end of the stream. The synthetic source paces itself at its frame rate,
like a real camera, so pipelines and drop policies see realistic timing in tests.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from splitedge.errors import CameraError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".tif", ".tiff", ".webp")


@dataclass(frozen=True)
class Frame:
    index: int
    name: str  # file name, or "camera:0#17"
    image: np.ndarray  # (H, W, 3) RGB uint8
    captured: float  # time.monotonic() at capture


def _cv2():
    try:
        import cv2
    except ImportError as exc:
        raise CameraError("this source needs OpenCV: pip install 'splitedge[camera]'") from exc
    return cv2


class FrameSource:
    """Base: iterate frames; ``close()`` releases the device."""

    description = "source"
    #: A live source (a camera) keeps producing whether or not frames are read: a pipeline
    #: that falls behind drops old frames. A recorded one (files, video) waits for the reader.
    live = False
    #: Seconds between a live source's frames, where known: the budget of each frame (the
    #: next one is due then). None: unknown, or a source that waits for its reader.
    frame_interval_s: float | None = None

    def __iter__(self) -> Iterator[Frame]:
        raise NotImplementedError

    def close(self) -> None:
        """Nothing to release by default."""

    def __enter__(self) -> "FrameSource":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ImageFiles(FrameSource):
    """Image files in order, once (``loop=True`` repeats them)."""

    def __init__(self, paths: list[Path], loop: bool = False) -> None:
        self.paths = paths
        self.loop = loop
        self.description = f"{len(paths)} image(s)"

    @classmethod
    def from_folder(cls, folder: Path, loop: bool = False) -> "ImageFiles":
        paths = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not paths:
            raise CameraError(f"{folder}: no images ({', '.join(IMAGE_SUFFIXES)})")
        source = cls(paths, loop)
        source.description = f"{len(paths)} images in {folder}"
        return source

    def __iter__(self) -> Iterator[Frame]:
        cv2 = _cv2()
        index = 0
        while True:
            for path in self.paths:
                bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
                if bgr is None:
                    raise CameraError(f"{path}: not a readable image")
                yield Frame(index, path.name, cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), time.monotonic())
                index += 1
            if not self.loop:
                return


class VideoCapture(FrameSource):
    """An OpenCV camera index or video file. A camera that stops returning frames is an error."""

    def __init__(self, target: int | str) -> None:
        cv2 = _cv2()
        self.target = target
        self.is_camera = isinstance(target, int)
        self.capture = cv2.VideoCapture(target)
        if not self.capture.isOpened():
            self.capture.release()
            kind = "camera" if self.is_camera else "video file"
            raise CameraError(f"cannot open {kind} {target!r}")
        self.description = f"camera {target}" if self.is_camera else f"video {target}"
        self.live = self.is_camera
        fps = self.capture.get(cv2.CAP_PROP_FPS) if self.is_camera else 0.0  # 0 where the driver does not say
        self.frame_interval_s = 1.0 / fps if fps > 0 else None

    def __iter__(self) -> Iterator[Frame]:
        cv2 = _cv2()
        index = 0
        while True:
            ok, bgr = self.capture.read()
            if not ok or bgr is None:
                if self.is_camera:
                    raise CameraError(f"camera {self.target} stopped delivering frames after {index}")
                return  # end of the video file
            name = f"camera:{self.target}#{index}" if self.is_camera else f"{Path(str(self.target)).name}#{index}"
            yield Frame(index, name, cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), time.monotonic())
            index += 1

    def close(self) -> None:
        self.capture.release()


class Synthetic(FrameSource):
    """Moving colour gradients at a fixed frame rate; endless, deterministic, no hardware.

    Paced like a camera: a frame read late does not make the next one come early (a sensor
    does not catch up), so a slow reader sees the same gaps it would on a Pi camera. Like a
    camera's DMA, delivering a frame costs the reader nearly nothing: a cycle of
    :data:`CYCLE` frames is drawn once, then handed out in turn.
    """

    live = True
    CYCLE = 16

    def __init__(
        self, height: int = 480, width: int = 640, fps: float = 30.0, seed: int = 0,
        clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        """``clock`` and ``sleep`` are the pace's (a test passes a clock it drives)."""
        self.height, self.width, self.fps = height, width, fps
        self.clock, self.sleep = clock, sleep
        self.rng = np.random.default_rng(seed)
        self.description = f"synthetic {width}x{height} at {fps:g} fps"
        self.frame_interval_s = 1.0 / fps if fps > 0 else None
        self._frames: list[np.ndarray] | None = None

    def _draw(self) -> list[np.ndarray]:
        yy, xx = np.mgrid[0 : self.height, 0 : self.width].astype(np.float32)
        frames = []
        for index in range(self.CYCLE):
            phase = 2 * np.pi * index / self.CYCLE
            image = np.stack(
                [
                    127 + 127 * np.sin(xx / 40 + phase),
                    127 + 127 * np.sin(yy / 30 - phase),
                    127 + 127 * np.sin((xx + yy) / 50 + 2 * phase),
                ],
                axis=-1,
            )
            noise = self.rng.integers(0, 8, size=image.shape)
            frames.append(np.clip(image + noise, 0, 255).astype(np.uint8))
        return frames

    def __iter__(self) -> Iterator[Frame]:
        if self._frames is None:
            self._frames = self._draw()
        period = 1.0 / self.fps if self.fps > 0 else 0.0
        next_due = self.clock()
        index = 0
        while True:
            delay = next_due - self.clock()
            if delay > 0:
                self.sleep(delay)
            yield Frame(index, f"synthetic#{index}", self._frames[index % self.CYCLE], self.clock())
            index += 1
            next_due = max(next_due + period, self.clock())


def open_source(spec: str, loop: bool = False) -> FrameSource:
    """``synthetic[:FPS]`` (FPS 0: as fast as it can), a camera index (``0``), a video file, or a folder of images."""
    if spec == "synthetic":
        return Synthetic()
    if spec.startswith("synthetic:"):
        rate = spec.partition(":")[2]
        try:
            fps = float(rate)
        except ValueError:
            raise CameraError(f"camera source {spec!r}: expected synthetic:FPS, e.g. synthetic:15") from None
        if fps < 0:
            raise CameraError(f"camera source {spec!r}: the frame rate cannot be negative")
        return Synthetic(fps=fps)
    if spec.isdigit():
        return VideoCapture(int(spec))
    path = Path(spec)
    if path.is_dir():
        return ImageFiles.from_folder(path, loop=loop)
    if path.is_file():
        if path.suffix.lower() in IMAGE_SUFFIXES:
            return ImageFiles([path], loop=loop)
        return VideoCapture(str(path))
    raise CameraError(f"camera source {spec!r}: not 'synthetic', a camera index, a video file or a folder of images")
