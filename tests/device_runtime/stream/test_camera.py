"""Frame sources: folders, video files (replayed in real time when asked), synthetic timing, and
the errors of dead or missing cameras. The Pi camera's are in test_picamera.py."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from device_runtime.stream.camera import IMAGE_SUFFIXES, Synthetic, VideoCapture, open_source
from splitedge.errors import CameraError
from tests.calibration.test_timing import ManualClock

cv2 = pytest.importorskip("cv2", reason="camera sources need splitedge[camera]")


def test_folder_yields_rgb_images_in_name_order(photos_dir: Path) -> None:
    with open_source(str(photos_dir)) as source:
        frames = list(source)
    assert [f.name for f in frames] == sorted(p.name for p in photos_dir.iterdir() if p.suffix in IMAGE_SUFFIXES)
    assert len(frames) == 4
    data = pytest.importorskip("skimage.data")
    coffee = next(f for f in frames if f.name == "coffee.png")
    np.testing.assert_array_equal(coffee.image, data.coffee())  # RGB, not OpenCV's BGR


def test_folder_loops_when_asked(photos_dir: Path) -> None:
    with open_source(str(photos_dir), loop=True) as source:
        frames = [f for _, f in zip(range(10), source)]
    assert [f.index for f in frames] == list(range(10))


def _clip(tmp_path: Path, frames: int = 5, fps: float = 10) -> Path:
    """An MJPG clip at ``fps``: frame i's left half is blue and its right half red (BGR on disk)."""
    path = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), fps, (64, 48))
    for i in range(frames):
        bgr = np.zeros((48, 64, 3), np.uint8)
        bgr[:, :32, 0] = bgr[:, 32:, 2] = 200 + 10 * i
        writer.write(bgr)
    writer.release()
    return path


def test_video_file(tmp_path: Path) -> None:
    with open_source(str(_clip(tmp_path))) as source:
        frames = list(source)
        assert not source.live and source.frame_interval_s is None  # a recording waits for its reader
    assert len(frames) == 5 and frames[0].image.shape == (48, 64, 3)
    assert frames[0].name == "clip.avi#0"
    left, right = frames[0].image[24, 8], frames[0].image[24, 56]
    assert left[2] > 150 > left[0] and right[0] > 150 > right[2]  # RGB: blue on the left, red on the right


def test_rgb_is_a_view_of_what_opencv_decoded(tmp_path: Path, photos_dir: Path) -> None:
    """OpenCV decodes to BGR; the RGB frame is the same memory read backwards, not a copy."""

    class Spy:
        def __init__(self, capture) -> None:
            self.capture, self.decoded = capture, []

        def read(self):
            ok, bgr = self.capture.read()
            self.decoded.append(bgr)
            return ok, bgr

        def release(self) -> None:
            self.capture.release()

    with VideoCapture(str(_clip(tmp_path))) as source:
        source.capture = spy = Spy(source.capture)
        frames = iter(source)
        first, second = next(frames), next(frames)
    assert np.shares_memory(first.image, spy.decoded[0])
    # Each read decodes into fresh memory: a frame waiting in the queue is not overwritten by the next.
    assert not np.shares_memory(first.image, second.image)
    np.testing.assert_array_equal(first.image, spy.decoded[0][..., ::-1])
    assert first.image[24, 8, 2] != second.image[24, 8, 2]
    coffee = next(f for f in open_source(str(photos_dir)) if f.name == "coffee.png")
    assert not coffee.image.flags.c_contiguous  # a view: preprocessing reads it as it is (test_preprocess)


def test_a_video_replays_at_its_own_frame_rate_when_asked(tmp_path: Path) -> None:
    """A 10 fps file with ``realtime``: frames 100 ms apart on the clock, not as fast as they
    decode; a frame read late pushes the next one back, it does not come early. It is live now:
    the pipeline drops what it cannot keep up with and gives each frame 100 ms."""
    clock = ManualClock()
    with VideoCapture(str(_clip(tmp_path, frames=6)), realtime=True, clock=clock, sleep=clock.sleep) as source:
        assert source.live and source.frame_interval_s == pytest.approx(0.1)
        assert source.description.endswith("at its 10 fps")
        frames = iter(source)
        captured = [next(frames).captured for _ in range(3)]
        clock.now += 0.25  # the reader is busy
        captured += [f.captured for f in frames]
    assert len(captured) == 6
    assert np.diff(captured) == pytest.approx([0.1, 0.1, 0.25, 0.1, 0.1])


def test_realtime_needs_a_frame_rate(tmp_path: Path, photos_dir: Path) -> None:
    with pytest.raises(CameraError, match="--realtime is for videos"):
        open_source(str(photos_dir), realtime=True)
    with open_source(str(_clip(tmp_path)), realtime=True) as source:
        assert source.live
    with open_source("synthetic:15", realtime=True) as source:  # live already: nothing to pace
        assert source.frame_interval_s == pytest.approx(1 / 15)


def test_synthetic_paces_itself_like_a_camera() -> None:
    """20 ms apart; a frame read late does not make the next one come early (a sensor does not
    catch up): after a reader 50 ms late, the next frame is 20 ms after that one."""
    clock = ManualClock()
    source = Synthetic(height=48, width=64, fps=50, clock=clock, sleep=clock.sleep)
    frames = iter(source)
    captured = [next(frames).captured for _ in range(3)]
    clock.now += 0.05  # the reader is busy
    captured += [next(frames).captured for _ in range(2)]
    assert np.diff(captured) == pytest.approx([0.02, 0.02, 0.05, 0.02])
    assert source.frame_interval_s == pytest.approx(0.02)
    first, second = [f.image for _, f in zip(range(2), Synthetic(height=48, width=64, fps=0))]
    assert first.shape == (48, 64, 3) and first.dtype == np.uint8
    assert not np.array_equal(first, second)  # it moves


def test_missing_camera_is_named() -> None:
    with pytest.raises(CameraError, match="cannot open camera 97"):
        open_source("97")


def test_camera_that_dies_mid_stream_raises() -> None:
    """A camera that opened but stops returning frames is an error, not the end of the stream."""
    class Dying:
        def __init__(self) -> None:
            self.left = 2

        def read(self):
            self.left -= 1
            return (True, np.zeros((4, 4, 3), np.uint8)) if self.left >= 0 else (False, None)

        def release(self) -> None:
            pass

    camera = VideoCapture.__new__(VideoCapture)
    camera.target, camera.is_camera, camera.capture, camera._pace, camera.clock = 0, True, Dying(), None, time.monotonic
    frames = []
    with pytest.raises(CameraError, match="camera 0 stopped delivering frames after 2"):
        for frame in camera:
            frames.append(frame)
    assert len(frames) == 2


def test_bad_sources(tmp_path: Path) -> None:
    with pytest.raises(CameraError, match="no images"):
        open_source(str(tmp_path))
    with pytest.raises(CameraError, match="not 'synthetic', 'picam', a camera index"):
        open_source(str(tmp_path / "nothing-here"))
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png")
    with pytest.raises(CameraError, match="broken.png: not a readable image"):
        list(open_source(str(broken)))
