"""Frame sources: a camera, a video file, a folder of images, or a synthetic stream.

Every source yields ``Frame`` objects holding an RGB uint8 (H, W, 3) array and closes its
device on exit (they are context managers). A camera that stops delivering raises
:class:`CameraError` instead of yielding nothing, so a dead camera is reported, not
mistaken for the end of the stream. The synthetic source paces itself at its frame rate,
like a real camera, so pipelines and drop policies see realistic timing in tests; a video
file can be paced at its own frame rate (``realtime``), so a recording replays like a live
camera. The Pi camera (Picamera2) is :mod:`device_runtime.stream._picamera`.

A camera is asked for frames at the size the model wants (``resize``, the shorter side the
model's preprocessing scales a frame to): a frame whose shorter side is already ``resize``
needs no scaling on the board, only the crop, and scaling a full frame on a Raspberry-Pi-class
core can cost more than the head (issue 29). :func:`model_size` is that size for a camera's
aspect; each camera says what it asked for and what it got (:meth:`FrameSource.negotiation`).

OpenCV decodes to BGR; the RGB image is a view of the decoded one with the channel axis
reversed (``[..., ::-1]``), not a copy: preprocessing reads it once to resize it (through
the memory as it lies, :mod:`device_runtime.engine._preprocess`), and a copy would cost a
frame's worth of memory traffic for nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Callable, Iterator

import numpy as np

from splitedge.errors import CameraError

#: How much larger each further size asked of an OpenCV camera is, when its driver gave one too small.
_STEP = 1.25
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".tif", ".tiff", ".webp")


@dataclass(frozen=True)
class Frame:
    index: int
    name: str  # file name, or "camera:0#17", "picam:0#17"
    image: np.ndarray  # (H, W, 3) RGB uint8; may be a strided view (BGR memory read backwards, padded rows)
    captured: float  # on time.monotonic()'s clock: when read, or a Pi camera's sensor timestamp
    deadline_ms: float | None = None  # the application's for this frame (capture to answer); None: the run's


def _rgb(bgr: np.ndarray) -> np.ndarray:
    """OpenCV's (H, W, 3) BGR image as RGB, a view of the same memory."""
    return bgr[..., ::-1]


#: A paced video's frame is decoded this long, plus twice its recent decoding time, before it is due.
DECODE_MARGIN_S = 0.001


class _Pace:
    """Frames one period apart, like a sensor: a frame read late does not make the next one
    come early (a sensor does not catch up), it comes one period after the late one."""

    def __init__(self, fps: float, clock: Callable[[], float], sleep: Callable[[float], object]) -> None:
        self.period = 1.0 / fps if fps > 0 else 0.0
        self.clock, self.sleep = clock, sleep
        self.next_due: float | None = None

    def wait(self) -> float:
        """Sleep until the next frame is due; its capture time."""
        now = self.clock()
        if self.next_due is None:
            self.next_due = now
        elif self.next_due > now:
            self.sleep(self.next_due - now)
        captured = self.clock()
        self.next_due = max(self.next_due, captured) + self.period  # the period runs from a late frame
        return captured

    def ahead(self, lead_s: float) -> None:
        """Sleep until ``lead_s`` before the next frame is due. Work started then (decoding it) is
        done when the frame is due, and is not done while the frame before is still being
        classified: on a board of one core the two would share it, and the frame before would
        wait (a street video's decoding, started as soon as the frame before was handed over,
        held that frame ~1 ms in the board's queue of a 10 ms head)."""
        if self.next_due is not None and self.next_due - lead_s > (now := self.clock()):
            self.sleep(self.next_due - lead_s - now)


def model_size(width: int, height: int, resize: int) -> tuple[int, int]:
    """(width, height) of a ``width`` x ``height`` frame scaled so its shorter side is ``resize``,
    the longer one truncated as torchvision truncates it: the size the model's preprocessing
    would scale the frame to, so a camera delivering it leaves only the crop to do."""
    if width >= height:
        return int(resize * width / height), resize
    return resize, int(resize * height / width)


def _size(size: tuple[int, int]) -> str:
    return f"{size[0]}x{size[1]}"


def opencv() -> ModuleType:
    """``cv2``, imported when a source needs it (decoding, a camera): a board can run without it."""
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
    #: A source that ends by itself (image files once, a video file): a run over it is one a person
    #: reads to its end, answer by answer. A camera (or a looped folder) goes on until stopped.
    ends = False
    #: The frame size (width, height) the device was asked for, for the model, and the size it
    #: delivers: None where no size was asked (files, synthetic frames, no model size given).
    asked: tuple[int, int] | None = None
    got: tuple[int, int] | None = None
    #: The model's resize (the shorter side its preprocessing scales a frame to) the size was asked for.
    resize: int | None = None

    def negotiation(self) -> str | None:
        """One line for the run: what the camera was asked for and what it gives, and whether
        the board still scales its frames (so a user sees why preprocessing costs what it does)."""
        if self.asked is None or self.got is None or self.resize is None:
            return None
        short = min(self.got)
        scaling = "no scaling before the crop" if short == self.resize else \
            f"the board {'shrinks' if short > self.resize else 'enlarges'} each frame to a {self.resize}-pixel side"
        return f"asked {_size(self.asked)} (the model's resize), got {_size(self.got)}: {scaling}"

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
        self.ends = not loop
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
        cv2 = opencv()
        index = 0
        while True:
            for path in self.paths:
                bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
                if bgr is None:
                    raise CameraError(f"{path}: not a readable image")
                yield Frame(index, path.name, _rgb(bgr), time.monotonic())
                index += 1
            if not self.loop:
                return


class VideoCapture(FrameSource):
    """An OpenCV camera index or video file. A camera that stops returning frames is an error.

    A video file is read as fast as its reader asks (a recording waits for the pipeline), or
    with ``realtime`` at the file's own frame rate: then it stands for a live camera, frames
    the pipeline cannot keep up with are dropped, and each gets the frame interval as its
    budget. ``clock`` and ``sleep`` are the pace's (a test passes a clock it drives).

    ``resize``: a camera is asked for frames whose shorter side is the model's resize
    (:meth:`_ask_size`); a video file is what it is.
    """

    def __init__(
        self, target: int | str, realtime: bool = False,
        clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], object] = time.sleep,
        resize: int | None = None,
    ) -> None:
        cv2 = opencv()
        self.target = target
        self.is_camera = isinstance(target, int)
        self.clock = clock
        self.capture = cv2.VideoCapture(target)
        if not self.capture.isOpened():
            self.capture.release()
            kind = "camera" if self.is_camera else "video file"
            raise CameraError(f"cannot open {kind} {target!r}")
        if self.is_camera and resize is not None:
            self._ask_size(cv2, resize)
        self.description = f"camera {target}" if self.is_camera else f"video {target}"
        fps = self.capture.get(cv2.CAP_PROP_FPS) if self.is_camera or realtime else 0.0  # 0: the driver does not say
        self._pace: _Pace | None = None
        if realtime and not self.is_camera:
            if not fps > 0:
                self.capture.release()
                raise CameraError(f"video {target!r} does not say its frame rate: it cannot be replayed in real time")
            self._pace = _Pace(fps, clock, sleep)
            self.description += f" at its {fps:g} fps"
        self.live = self.is_camera or self._pace is not None
        self.ends = not self.is_camera  # a video file, paced or not
        self.frame_interval_s = 1.0 / fps if fps > 0 else None

    def _frame_size(self, cv2: ModuleType) -> tuple[int, int]:
        """(width, height) the driver says it delivers; (0, 0) where it does not say."""
        return int(self.capture.get(cv2.CAP_PROP_FRAME_WIDTH)), int(self.capture.get(cv2.CAP_PROP_FRAME_HEIGHT))

    def _ask_size(self, cv2: ModuleType, resize: int) -> None:
        """Ask for the smallest mode at or above the model's size (:func:`model_size`, the aspect of
        the mode the camera opened in) and read back what the driver chose.

        OpenCV cannot list a camera's modes, and a V4L2 driver gives the mode nearest to what is
        asked, which may be smaller (341x256 asked of a webcam gets 320x240): frames the board
        would enlarge lose detail the camera had. So a mode too small is asked again a quarter
        larger, up to the mode it opened in, which comes back if none between fits. A driver that
        says no size, or ignores the request, keeps delivering what it did.
        """
        opened = self._frame_size(cv2)
        if 0 in opened:
            return
        asked = model_size(*opened, resize)
        got, side = opened, resize
        while side < min(opened) or side == resize:
            self._set_size(cv2, model_size(*opened, side))
            got = self._frame_size(cv2)
            if min(got) >= resize:
                break
            side = int(side * _STEP)
        else:
            if got != opened:
                self._set_size(cv2, opened)
                got = self._frame_size(cv2)
        self.asked, self.got, self.resize = asked, got, resize

    def _set_size(self, cv2: ModuleType, size: tuple[int, int]) -> None:
        self.capture.set(cv2.CAP_PROP_FRAME_WIDTH, size[0])
        self.capture.set(cv2.CAP_PROP_FRAME_HEIGHT, size[1])

    def __iter__(self) -> Iterator[Frame]:
        index = 0
        decode_s = 0.0  # the slowest recent decoding, decaying: how far ahead of a due frame to start it
        while True:
            if self._pace is not None:
                self._pace.ahead(2 * decode_s + DECODE_MARGIN_S)
            started = self.clock()
            ok, bgr = self.capture.read()
            decode_s = max(self.clock() - started, 0.9 * decode_s)
            if not ok or bgr is None:
                if self.is_camera:
                    raise CameraError(f"camera {self.target} stopped delivering frames after {index}")
                return  # end of the video file
            # Paced after decoding, started just ahead of the frame's time: ready when it is due.
            captured = self._pace.wait() if self._pace is not None else self.clock()
            name = f"camera:{self.target}#{index}" if self.is_camera else f"{Path(str(self.target)).name}#{index}"
            yield Frame(index, name, _rgb(bgr), captured)
            index += 1

    def close(self) -> None:
        self.capture.release()


class Synthetic(FrameSource):
    """Moving colour gradients at a fixed frame rate; endless, deterministic, no hardware.

    Paced like a camera (:class:`_Pace`): a frame read late does not make the next one come
    early, so a slow reader sees the same gaps it would on a Pi camera. Like a camera's DMA,
    delivering a frame costs the reader nearly nothing: a cycle of :data:`CYCLE` frames is
    drawn once, then handed out in turn.
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
        pace = _Pace(self.fps, self.clock, self.sleep)
        index = 0
        while True:
            captured = pace.wait()
            yield Frame(index, f"synthetic#{index}", self._frames[index % self.CYCLE], captured)
            index += 1


def open_source(spec: str, loop: bool = False, realtime: bool = False, resize: int | None = None) -> FrameSource:
    """``synthetic[:FPS]`` (FPS 0: as fast as it can), a camera index (``0``), the Pi camera
    (``picam[N][:WxH][@FPS]``, see :func:`device_runtime.stream._picamera.open_picamera`), a video
    file (``realtime``: paced at its own frame rate), or a folder of images.

    ``resize``: the model's (the shorter side its preprocessing scales a frame to). The cameras
    are asked for frames that size, so the board need not scale them; files, folders and
    synthetic frames come as they are."""
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
    if spec.startswith("picam"):
        from device_runtime.stream._picamera import open_picamera  # Picamera2 only where asked for

        return open_picamera(spec, resize)
    if spec.isdigit():
        return VideoCapture(int(spec), resize=resize)
    path = Path(spec)
    images = path.is_dir() or (path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES)
    if images and realtime:
        raise CameraError(f"{spec}: images have no frame rate to replay in real time (--realtime is for videos)")
    if path.is_dir():
        return ImageFiles.from_folder(path, loop=loop)
    if path.is_file():
        if images:
            return ImageFiles([path], loop=loop)
        return VideoCapture(str(path), realtime=realtime)
    raise CameraError(
        f"camera source {spec!r}: not 'synthetic', 'picam', a camera index, a video file or a folder of images"
    )
