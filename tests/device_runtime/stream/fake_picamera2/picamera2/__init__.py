"""A stand-in for Picamera2 (Raspberry Pi OS's ``python3-picamera2``): its interface and its
timing, for tests on machines without a Pi camera. Put on ``sys.path`` by the ``picamera2``
fixture of ``tests/device_runtime/stream/test_picamera.py``.

What it keeps of the real one (picamera2 0.3 on libcamera; ``picamera2/picamera2.py`` and
``picamera2/request.py`` of github.com/raspberrypi/picamera2):

* ``Picamera2.global_camera_info()`` lists the attached cameras (``Model``, ``Location``,
  ``Rotation``, ``Id``, ``Num``); ``Picamera2(n)`` of an absent camera raises ``IndexError``,
  as the real one's ``global_camera_info()[camera_num]`` does, and a camera already open in
  this process cannot be opened again until closed.
* ``create_video_configuration(main=, lores=None, controls=, buffer_count=6, queue=True)``
  returns a dict: main defaults to XBGR8888 1280x720, lores (where given) to YUV420 at main's
  size with ``preserve_ar`` off, a stream key other than format, size, stride and preserve_ar
  is a ``ValueError``, and both sizes are aligned as ``align_stream(optimal=False)`` aligns
  them (down to even). ``align_stream``/``align_configuration`` (optimal) align widths down as
  on the Pi 4 (VC4): 64 pixels for YUV420, 16 for XBGR8888, 32 otherwise.
* ``configure`` checks each stream like ``check_stream_config`` (``RuntimeError("Bad format X
  in stream main")``, odd sizes refused), refuses a lores larger than main ("lores stream
  dimensions may not exceed main stream") or not YUV ("lores stream must be YUV", the VC4
  rule), and fills in each stream's stride (rows padded to 64 bytes; YUV420's chroma rows are
  half that) and frame size; ``start``, ``stop`` (harmless when stopped), ``close``.
* The sensor runs on its own clock: frame k is exposed at ``start + k / FrameRate`` and
  completes one frame interval later. ``capture_request(wait=S)`` returns the newest
  completed frame not yet handed out (Picamera2 keeps one queued), else waits for the next,
  and raises ``TimeoutError`` after S seconds when none comes: a dead camera, or one whose
  buffers are all held. (Without a timeout the real one waits forever; here that fails the
  test instead of hanging it.) The timed-out job stays in the camera's job list, and
  ``stop`` (a job itself while the event loop runs) waits behind it for ever unless
  ``cancel_all_and_flush()`` cleared it first: here that too fails the test.
* A request holds one of ``buffer_count`` buffers until ``release()``; the camera needs one
  free buffer to expose into and Picamera2 keeps one queued, so ``buffer_count - 1`` held
  requests stall it. ``make_buffer(stream)`` copies the buffer out (1-D, with the row padding);
  ``make_array`` also drops the padding (a second copy where there is any), except for YUV420,
  which it gives as (height * 3 / 2, stride) rows with their padding (the Y plane, then U and
  V at half the stride), as OpenCV's I420 conversions take it; a stream not configured is a
  ``RuntimeError``; a released request has no buffer.
* YUV420 is BT.601 limited range (the colour space Picamera2 gives video below 1280x720),
  made here by OpenCV's ``COLOR_RGB2YUV_I420`` from the scene, so the stand-in needs OpenCV
  for it.
* Byte order in memory: ``RGB888`` [B, G, R], ``BGR888`` [R, G, B], ``XBGR8888``
  [R, G, B, 255], ``XRGB8888`` [B, G, R, 255] (Picamera2 manual, appendix A).
* Metadata: ``SensorTimestamp`` (ns on the stand-in's clock), ``ExposureTime`` and
  ``FrameDuration`` (µs).

Knobs for tests, module-level and reset by :func:`reset`: :data:`CAMERAS`, :data:`FORMATS`
(the formats the camera accepts), :data:`DIE_AFTER` (the sensor's frame number from which a
camera goes silent), :func:`use_clock` and :data:`SCENE` (what the sensor sees, RGB). Every camera
made is in :data:`OPENED`.
"""

from __future__ import annotations

import math
import time
from copy import deepcopy
from typing import Any, Callable

import numpy as np

IMX708 = {"Model": "imx708", "Location": 2, "Rotation": 180, "Id": "/base/axi/pcie@120000/rp1/i2c@88000/imx708@1a"}
_ORDER = {"RGB888": (2, 1, 0), "BGR888": (0, 1, 2), "XBGR8888": (0, 1, 2), "XRGB8888": (2, 1, 0)}
_YUV = frozenset({"YUV420", "YVU420"})
_ALL_FORMATS = frozenset(_ORDER) | _YUV
_STREAM_KEYS = ("format", "size", "stride", "preserve_ar")


def stripes(frame: int, height: int, width: int) -> np.ndarray:
    """Red, green and blue vertical thirds, RGB (the frame number does not change them)."""
    image = np.zeros((height, width, 3), np.uint8)
    third = width // 3
    image[:, :third, 0] = 255
    image[:, third : 2 * third, 1] = 255
    image[:, 2 * third :, 2] = 255
    return image


def _yuv420(rgb: np.ndarray, stride: int, swap: bool) -> np.ndarray:
    """The DMA bytes of a YUV420 (YVU420: V before U) frame: the Y plane's rows padded to
    ``stride``, then each chroma plane's rows padded to half of it."""
    import cv2

    height, width = rgb.shape[:2]
    i420 = cv2.cvtColor(np.ascontiguousarray(rgb), cv2.COLOR_RGB2YUV_I420).reshape(-1)
    quarter = (height // 2) * (width // 2)
    y = i420[: height * width].reshape(height, width)
    u, v = i420[height * width :].reshape(2, quarter)
    planes = [(y, stride)] + [(c.reshape(height // 2, width // 2), stride // 2) for c in ((v, u) if swap else (u, v))]
    out = []
    for plane, pitch in planes:
        padded = np.full((plane.shape[0], pitch), 0xEE, np.uint8)  # the padding holds garbage
        padded[:, : plane.shape[1]] = plane
        out.append(padded.reshape(-1))
    return np.concatenate(out)


CAMERAS: list[dict[str, Any]] = []
FORMATS: set[str] = set()
DIE_AFTER: int | None = None
SCENE: Callable[[int, int, int], np.ndarray] = stripes
OPENED: list["Picamera2"] = []
_clock: Callable[[], float] = time.monotonic
_sleep: Callable[[float], object] = time.sleep


def reset() -> None:
    """One IMX708 camera, every format, a camera that never dies, the real clock."""
    global DIE_AFTER, SCENE, _clock, _sleep
    CAMERAS[:] = [dict(IMX708)]
    FORMATS.clear()
    FORMATS.update(_ALL_FORMATS)
    DIE_AFTER, SCENE = None, stripes
    OPENED.clear()
    _clock, _sleep = time.monotonic, time.sleep


def use_clock(clock: Callable[[], float], sleep: Callable[[float], object]) -> None:
    """The sensor's clock (seconds; SensorTimestamp is its ns) and how waiting for a frame sleeps."""
    global _clock, _sleep
    _clock, _sleep = clock, sleep


reset()


def _stream_config(defaults: dict[str, Any], updates: dict[str, Any]) -> dict[str, Any]:
    """A stream's configuration: ``defaults`` with the caller's ``updates`` (known keys only)."""
    for key in updates:
        if key not in _STREAM_KEYS:
            raise ValueError(f"Bad key {key!r}: valid stream configuration keys are {_STREAM_KEYS}")
    return defaults | updates


def _configured(stream: dict[str, Any], name: str) -> dict[str, Any]:
    """``stream`` checked as ``check_stream_config`` checks it, with libcamera's stride and frame size."""
    stream = dict(stream)
    fmt, size = stream["format"], stream["size"]
    if fmt not in _ALL_FORMATS:
        raise RuntimeError(f"Bad format {fmt} in stream {name}")
    if fmt not in FORMATS:
        raise RuntimeError(f"Failed to configure camera: this sensor's pipeline has no {fmt} output")
    if not isinstance(size, tuple) or len(size) != 2:
        raise RuntimeError(f"size in {name} stream should be (width, height)")
    if size[0] % 2 or size[1] % 2:
        raise RuntimeError("width and height should be even")
    if fmt in _YUV:
        stream["stride"] = math.ceil(size[0] / 64) * 64  # chroma rows: half the stride, 32-byte aligned
        stream["framesize"] = stream["stride"] * size[1] * 3 // 2
    else:
        stream["stride"] = math.ceil(size[0] * (4 if fmt.startswith("X") else 3) / 64) * 64
        stream["framesize"] = stream["stride"] * size[1]
    return stream


class CompletedRequest:
    def __init__(self, camera: "Picamera2", frame: int, exposed: float) -> None:
        self.camera, self.frame, self.exposed = camera, frame, exposed
        self.config = deepcopy(camera.camera_config)
        self.ref_count = 1

    def _stream(self, name: str) -> dict[str, Any]:
        if name not in ("main", "lores") or self.config[name] is None:
            raise RuntimeError(f"Stream {name!r} is not defined")
        return self.config[name]

    def _dma(self, name: str) -> np.ndarray:
        if self.ref_count == 0:
            raise RuntimeError("request released: its buffer is back with the camera")
        stream = self._stream(name)
        (width, height), stride, fmt = stream["size"], stream["stride"], stream["format"]
        rgb = SCENE(self.frame, height, width)
        if fmt in _YUV:
            return _yuv420(rgb, stride, swap=fmt == "YVU420")
        pixels = rgb[..., list(_ORDER[fmt])]
        if fmt.startswith("X"):
            pixels = np.concatenate([pixels, np.full((height, width, 1), 255, np.uint8)], axis=2)
        dma = np.full((height, stride), 0xEE, np.uint8)  # the padding holds garbage
        dma[:, : pixels.shape[1] * pixels.shape[2]] = pixels.reshape(height, -1)
        return dma.reshape(-1)

    def make_buffer(self, name: str) -> np.ndarray:
        buffer = np.array(self._dma(name), dtype=np.uint8)  # the copy out of the DMA buffer
        self.camera.buffers_made.append(buffer)
        return buffer

    def make_array(self, name: str) -> np.ndarray:
        buffer = self.make_buffer(name)
        stream = self.config[name]
        (width, height), stride = stream["size"], stream["stride"]
        if stream["format"] in _YUV:
            return buffer.reshape(height * 3 // 2, stride)
        channels = 4 if stream["format"].startswith("X") else 3
        rows = buffer.reshape(height, stride)
        if stride != width * channels:
            rows = np.asarray(rows[:, : width * channels], order="C")  # Picamera2 copies the padding away
        return rows.reshape(height, width, channels)

    def get_metadata(self) -> dict[str, Any]:
        period_us = round(1e6 * self.camera.period)
        return {
            "SensorTimestamp": round(self.exposed * 1e9),
            "ExposureTime": int(period_us * 0.8),
            "FrameDuration": period_us,
        }

    def release(self) -> None:
        self.ref_count -= 1
        if self.ref_count < 0:
            raise RuntimeError("CompletedRequest: lock now has negative ref_count")
        if self.ref_count == 0:
            self.camera.held -= 1


class Picamera2:
    @staticmethod
    def global_camera_info() -> list[dict[str, Any]]:
        return [dict(info, Num=num) for num, info in enumerate(CAMERAS)]

    def __init__(self, camera_num: int = 0) -> None:
        self.camera_idx = self.global_camera_info()[camera_num]["Num"]  # IndexError, as the real one
        if any(c.is_open and c.camera_idx == self.camera_idx for c in OPENED):
            raise RuntimeError("Camera __init__ sequence did not complete.")
        self.is_open, self.started = True, False
        self.camera_config: dict[str, Any] | None = None
        self.period = 1 / 30
        self.held = 0  # requests handed out and not yet released
        self.handed = -1  # the last frame handed out
        self.buffers_made: list[np.ndarray] = []
        self.stop_count = 0
        self.stuck_jobs = 0  # capture jobs that timed out and still wait in the job list
        self._start = 0.0
        OPENED.append(self)

    def create_video_configuration(
        self, main: dict | None = None, lores: dict | None = None, raw: dict | None = None, buffer_count: int = 6,
        controls: dict | None = None, queue: bool = True, **_: Any,
    ) -> dict[str, Any]:
        if not self.is_open:
            raise RuntimeError("Camera not opened")
        stream = _stream_config({"format": "XBGR8888", "size": (1280, 720), "preserve_ar": True}, main or {})
        self.align_stream(stream, optimal=False)
        if lores is not None:
            lores = _stream_config({"format": "YUV420", "size": stream["size"], "preserve_ar": False}, lores)
            self.align_stream(lores, optimal=False)
        return {"use_case": "video", "buffer_count": buffer_count, "queue": queue, "main": stream,
                "lores": lores, "raw": raw, "controls": {"FrameDurationLimits": (33333, 33333)} | (controls or {})}

    @staticmethod
    def align_stream(stream_config: dict[str, Any], optimal: bool = True) -> None:
        if optimal:  # the Pi 4's (VC4) alignment: every plane a multiple of 32 bytes wide
            align = 64 if stream_config["format"] in _YUV else 16 if stream_config["format"].startswith("X") else 32
        else:
            align = 2
        width, height = stream_config["size"]
        stream_config["size"] = (width - width % align, height - height % 2)

    @staticmethod
    def align_configuration(config: dict[str, Any], optimal: bool = True) -> None:
        Picamera2.align_stream(config["main"], optimal=optimal)
        if config.get("lores") is not None:
            Picamera2.align_stream(config["lores"], optimal=optimal)

    def configure(self, config: dict[str, Any]) -> None:
        if not self.is_open:
            raise RuntimeError("Camera not opened")
        if self.started:
            raise RuntimeError("Camera must be stopped before configuring")
        main = _configured(config["main"], "main")
        lores = None
        if config.get("lores") is not None:
            lores = _configured(config["lores"], "lores")
            if lores["size"][0] > main["size"][0] or lores["size"][1] > main["size"][1]:
                raise RuntimeError("lores stream dimensions may not exceed main stream")
            if lores["format"] not in _YUV:
                raise RuntimeError("lores stream must be YUV")
        controls = config.get("controls", {})
        if "FrameRate" in controls:  # newer Picamera2: a shorthand for FrameDurationLimits
            self.period = 1.0 / controls["FrameRate"]
        else:
            shortest, longest = controls["FrameDurationLimits"]
            if shortest != longest:
                raise AssertionError("the stand-in runs at one frame rate: FrameDurationLimits (d, d)")
            self.period = shortest / 1e6
        self.camera_config = {**config, "main": main, "lores": lores}

    def start(self) -> None:
        if self.camera_config is None:
            raise RuntimeError("Camera has not been configured")
        if not self.started:
            self.started, self._start, self.handed = True, _clock(), -1

    def stop(self) -> None:
        if self.started:
            if self.stuck_jobs:
                raise AssertionError("stop() queued behind a timed-out capture job: the real Picamera2 waits for ever")
            self.started = False
            self.stop_count += 1

    def cancel_all_and_flush(self) -> None:
        self.stuck_jobs = 0

    def close(self) -> None:
        self.stop()
        self.is_open = False

    def capture_request(self, wait: Any = None, signal_function: Any = None, flush: Any = None) -> CompletedRequest:
        if not self.started:
            raise RuntimeError("Camera is not started")
        assert self.camera_config is not None
        now = _clock()
        done = math.floor((now - self._start) / self.period + 1e-6) - 1  # the newest completed frame
        frame = done if self.camera_config["queue"] and done > self.handed else max(self.handed, done) + 1
        ready = self._start + (frame + 1) * self.period
        stalled = self.held >= self.camera_config["buffer_count"] - 1 or (DIE_AFTER is not None and frame >= DIE_AFTER)
        timeout = None if wait is None or wait is True else float(wait)
        if stalled or (timeout is not None and ready - now > timeout):
            if timeout is None:
                raise AssertionError("capture_request without a timeout: the real Picamera2 would wait forever here")
            _sleep(timeout)
            self.stuck_jobs += 1
            raise TimeoutError()
        if ready > now:
            _sleep(ready - now)
        self.handed, self.held = frame, self.held + 1
        return CompletedRequest(self, frame, self._start + frame * self.period)

    def capture_array(self, name: str = "main", wait: Any = None) -> np.ndarray:
        request = self.capture_request(wait=wait)
        try:
            return request.make_array(name)
        finally:
            request.release()
