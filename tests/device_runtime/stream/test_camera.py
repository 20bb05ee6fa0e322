"""Frame sources: folders, video files, synthetic timing, and the errors of dead or missing cameras."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from device_runtime.stream.camera import IMAGE_SUFFIXES, Synthetic, open_source
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


def test_video_file(tmp_path: Path) -> None:
    path = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10, (64, 48))
    for i in range(5):
        writer.write(np.full((48, 64, 3), i * 40, np.uint8))
    writer.release()
    with open_source(str(path)) as source:
        frames = list(source)
    assert len(frames) == 5 and frames[0].image.shape == (48, 64, 3)
    assert frames[0].name == "clip.avi#0"


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
    from device_runtime.stream.camera import VideoCapture

    class Dying:
        def __init__(self) -> None:
            self.left = 2

        def read(self):
            self.left -= 1
            return (True, np.zeros((4, 4, 3), np.uint8)) if self.left >= 0 else (False, None)

        def release(self) -> None:
            pass

    camera = VideoCapture.__new__(VideoCapture)
    camera.target, camera.is_camera, camera.capture = 0, True, Dying()
    frames = []
    with pytest.raises(CameraError, match="camera 0 stopped delivering frames after 2"):
        for frame in camera:
            frames.append(frame)
    assert len(frames) == 2


def test_bad_sources(tmp_path: Path) -> None:
    with pytest.raises(CameraError, match="no images"):
        open_source(str(tmp_path))
    with pytest.raises(CameraError, match="not 'synthetic', a camera index"):
        open_source(str(tmp_path / "nothing-here"))
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png")
    with pytest.raises(CameraError, match="broken.png: not a readable image"):
        list(open_source(str(broken)))
