"""The Raspberry Pi camera module through Picamera2 (libcamera): RGB frames at the requested
size, one copy each, with the sensor's timestamps as their capture times.

Picamera2 comes only with Raspberry Pi OS (``sudo apt install python3-picamera2``, and a
virtual environment sees it only when made with ``--system-site-packages``), so it is
imported when a Pi camera is asked for, never before.

One copy per frame, and no other. The camera fills a ring of ``buffer_count`` DMA buffers;
each completed request holds one until it is released, and a camera with no free buffer
stalls. So each request is released as soon as its pixels are copied out (``make_buffer``):
the frame then outlives the request while it waits in the pipeline's queue. The copy is
shaped into (H, W, 3) as a view that steps over each row's padding (the stride), where
``make_array`` would copy once more to drop it. The stream is asked for ``BGR888``, which
libcamera names after the 24-bit word and stores little-endian: [R, G, B] in memory, RGB as
it stands (Picamera2 manual, appendix A: "RGB888" is [B, G, R]).

Frames at the model's size come from the ISP, not the board. Given the model's ``resize``, the
camera is configured with a second, low-resolution stream (``lores``) at :func:`model_size` of
the main stream: the ISP scales every frame to it in hardware, and the board only crops. The
lores stream keeps main's aspect because it shares main's crop of the sensor mode (Picamera2's
``preserve_ar`` is off for lores): another aspect would stretch the picture. On the Pi 4's ISP
lores is YUV420 only, so it is asked for that on every Pi, copied out like main
(``make_buffer``) and made RGB with OpenCV's ``COLOR_YUV2RGB_I420``: a second pass over a
frame a fifth of main's, where converting straight from the DMA mapping would tie this to
``MappedArray``, whose interface has changed between Picamera2 releases. Main, never read then,
is YUV420 too, the least memory its buffers can take. A model size larger than main is not
asked of lores (Picamera2 refuses a lores larger than main): frames come from main and the
board enlarges them, as the run says.

Capture times are the sensor's: each frame's ``SensorTimestamp`` (ns), stamped by the kernel
on CLOCK_MONOTONIC, the clock of ``time.monotonic()`` and of :attr:`Frame.captured`
(Picamera2's own ``capture_request(flush=True)`` compares it with ``time.monotonic_ns()``).
A frame handed over late, while the reader was busy, keeps the time it was exposed.
"""

from __future__ import annotations

import re
import time
from types import ModuleType
from typing import Any, Callable, Iterator

import numpy as np

from device_runtime.stream._camera import Frame, FrameSource, model_size, opencv
from splitedge.errors import CameraError

__all__ = ["FORMAT", "INSTALL", "LORES_FORMAT", "PiCamera", "open_picamera", "pi_camera_absent"]

INSTALL = (
    "the Pi camera needs Picamera2, which comes with Raspberry Pi OS: sudo apt install python3-picamera2 "
    "(a virtual environment sees it only if made with --system-site-packages: "
    "python3 -m venv --system-site-packages VENV)"
)
#: [R, G, B] bytes in memory: RGB without a channel swap (libcamera names formats by the 24-bit word).
FORMAT = "BGR888"
#: The lores stream's format: the only one the Pi 4's ISP gives it; the Pi 5's gives it too.
LORES_FORMAT = "YUV420"
_SPEC = re.compile(r"picam(?P<num>\d*)(?::(?P<w>\d+)x(?P<h>\d+))?(?:@(?P<fps>\d+(?:\.\d+)?))?")


def _picamera2() -> ModuleType:
    try:
        import picamera2
    except ImportError as exc:
        raise CameraError(INSTALL) from exc
    return picamera2


def _cameras(module: ModuleType) -> list[dict[str, Any]]:
    """The camera modules libcamera lists, in Picamera2's numbering."""
    try:
        return list(module.Picamera2.global_camera_info())
    except Exception as exc:  # libcamera's own failures come up as bare RuntimeErrors
        raise CameraError(f"libcamera cannot list the cameras: {exc}") from exc


def pi_camera_absent() -> str | None:
    """Why a Pi camera cannot be used here, or None when Picamera2 lists one."""
    try:
        found = _cameras(_picamera2())
    except CameraError as exc:
        return str(exc)
    return None if found else "libcamera lists no camera module"


class PiCamera(FrameSource):
    """A Pi camera module, ``size`` (width, height) RGB frames at ``fps``; with ``resize`` (the
    model's), frames the ISP scaled to :func:`model_size` of ``size`` (its lores stream).

    ``buffer_count``: the DMA buffers (four: one exposed into, one Picamera2 keeps queued, one
    being copied out here, one spare; each is a frame of memory, scarce on a Zero).
    ``timeout_s``: how long a frame may take before the camera is taken for dead (default:
    two seconds, plus four frame intervals). ``clock``: the capture time of a frame whose
    metadata lacks a sensor timestamp.
    """

    live = True

    def __init__(
        self, camera: int = 0, size: tuple[int, int] = (640, 480), fps: float = 30.0, buffer_count: int = 4,
        timeout_s: float | None = None, clock: Callable[[], float] = time.monotonic, resize: int | None = None,
    ) -> None:
        if not fps > 0:
            raise CameraError(f"Pi camera {camera}: the frame rate must be above 0, got {fps:g}")
        module = _picamera2()
        found = _cameras(module)
        if camera >= len(found):
            raise CameraError(
                f"Pi camera {camera}: libcamera lists {len(found)} camera module(s); is the ribbon cable seated "
                "(rpicam-hello --list-cameras lists them)?"
            )
        self.number, self.fps, self.clock = camera, fps, clock
        self.model = str(found[camera].get("Model", "camera"))
        self.timeout_s = timeout_s if timeout_s is not None else 2.0 + 4.0 / fps
        self.frame_interval_s = 1.0 / fps
        asked = model_size(*size, resize) if resize is not None else None
        lores = asked is not None and asked != tuple(size) and asked[0] <= size[0] and asked[1] <= size[1]
        self.stream = "lores" if lores else "main"
        self._yuv = opencv() if lores else None  # before the camera opens: without OpenCV, one line and nothing to stop
        self.camera: Any = None
        try:
            self.camera = module.Picamera2(camera)
            # The frame duration both ways (µs) fixes the rate: every Picamera2 knows it, where
            # "FrameRate" is a newer shorthand for it.
            period_us = round(1e6 / fps)
            main_format = LORES_FORMAT if lores else FORMAT  # main unread beside lores: its least memory
            streams: dict[str, dict[str, Any]] = {"main": {"size": tuple(size), "format": main_format}}
            if lores:
                streams["lores"] = {"size": asked, "format": LORES_FORMAT}
            config = self.camera.create_video_configuration(
                **streams, controls={"FrameDurationLimits": (period_us, period_us)}, buffer_count=buffer_count,
            )
            self.camera.configure(config)
            main, delivered = self.camera.camera_config["main"], self.camera.camera_config[self.stream]
            self.camera.start()
        except Exception as exc:  # Picamera2 raises bare RuntimeErrors (IndexError for a camera that went away)
            self._release()
            raise CameraError(f"Pi camera {camera} ({self.model}): {exc}") from exc
        self.width, self.height = delivered["size"]
        self.stride = int(delivered["stride"])
        self.description = f"Pi camera {camera} ({self.model}) {self.width}x{self.height} at {fps:g} fps"
        if lores:
            self.description += f" (the ISP's lores stream; main {main['size'][0]}x{main['size'][1]})"
        if asked is not None:
            self.asked, self.got, self.resize = asked, (self.width, self.height), resize

    def __iter__(self) -> Iterator[Frame]:
        index = 0
        while True:
            buffer, metadata = self._capture(index)
            stamp = metadata.get("SensorTimestamp")
            captured = stamp / 1e9 if stamp else self.clock()
            yield Frame(index, f"picam:{self.number}#{index}", self._image(buffer), captured)
            index += 1

    def _capture(self, index: int) -> tuple[np.ndarray, dict[str, Any]]:
        """The next frame's pixels (one copy out of the DMA buffer) and metadata."""
        if self.camera is None:
            raise CameraError(f"Pi camera {self.number} is closed")
        try:
            request = self.camera.capture_request(wait=self.timeout_s)
        except Exception as exc:  # TimeoutError when no frame comes; RuntimeError from libcamera
            raise CameraError(
                f"Pi camera {self.number} stopped delivering frames after {index} "
                f"({type(exc).__name__}: {str(exc) or f'no frame in {self.timeout_s:g} s'})"
            ) from exc
        try:
            return request.make_buffer(self.stream), request.get_metadata()
        except Exception as exc:
            raise CameraError(f"Pi camera {self.number}: frame {index} unreadable: {exc}") from exc
        finally:
            request.release()  # at once: a camera whose buffers are all held stalls

    def _image(self, buffer: np.ndarray) -> np.ndarray:
        """(H, W, 3) RGB over ``buffer``'s rows, their padding stepped over, not copied away; a
        YUV420 lores buffer (the Y plane's rows, then U's and V's at half the stride, as OpenCV's
        I420 of the stride's width) made RGB, then its padding columns stepped over."""
        rows = self.height * 3 // 2 if self._yuv is not None else self.height
        if buffer.size < rows * self.stride:
            raise CameraError(
                f"Pi camera {self.number}: a frame of {buffer.size} bytes, expected {rows} rows of {self.stride}"
            )
        planes = buffer[: rows * self.stride].reshape(rows, self.stride)
        if self._yuv is not None:
            return self._yuv.cvtColor(planes, self._yuv.COLOR_YUV2RGB_I420)[:, : self.width]
        return planes[:, : self.width * 3].reshape(self.height, self.width, 3)

    def close(self) -> None:
        """Stop the camera and free it for the next process; twice is harmless."""
        try:
            self._release()
        except Exception as exc:
            raise CameraError(f"Pi camera {self.number} did not stop cleanly: {exc}") from exc

    def _release(self) -> None:
        camera, self.camera = self.camera, None
        if camera is not None:
            try:
                # A capture that timed out (or still waits, in the capture thread) is a job in
                # Picamera2's list, and stop() queues behind it for ever: clear them first
                # (where this Picamera2 has it: older releases do not).
                flush = getattr(camera, "cancel_all_and_flush", None)
                if flush is not None:
                    flush()
                camera.stop()
            finally:
                camera.close()


def open_picamera(spec: str, resize: int | None = None) -> PiCamera:
    """``picam[N][:WIDTHxHEIGHT][@FPS]``: camera N (default 0), 640x480 at 30 fps unless given,
    e.g. ``picam``, ``picam:1280x720``, ``picam@15``, ``picam1:640x480@10``; ``resize``, the
    model's: frames from the lores stream at its size (:class:`PiCamera`)."""
    match = _SPEC.fullmatch(spec)
    if match is None:
        raise CameraError(
            f"camera source {spec!r}: expected picam[N][:WIDTHxHEIGHT][@FPS], e.g. picam, picam:1280x720@15"
        )
    size = (int(match["w"]), int(match["h"])) if match["w"] else (640, 480)
    fps = float(match["fps"]) if match["fps"] else 30.0
    return PiCamera(int(match["num"] or 0), size, fps, resize=resize)
