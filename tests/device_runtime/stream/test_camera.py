"""Frame sources: folders, video files (replayed in real time when asked), synthetic timing, an
OpenCV camera asked for the model's frame size, and the errors of dead or missing cameras. The
Pi camera's are in test_picamera.py."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from device_runtime.stream._camera import IMAGE_SUFFIXES, Synthetic, VideoCapture, model_size, open_source
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


def test_a_paced_video_decodes_each_frame_just_before_it_is_due(tmp_path: Path) -> None:
    """Decoding the next frame as soon as one is handed over would share a one-core board with that
    frame's preprocessing and head (it held frames ~1 ms in the board's queue). Each frame is
    decoded just ahead of its time instead, twice its recent decoding plus 1 ms, and is still
    ready when due."""
    clock = ManualClock(0.0)
    reads: list[float] = []
    with VideoCapture(str(_clip(tmp_path, frames=4)), realtime=True, clock=clock, sleep=clock.sleep) as source:
        real = source.capture

        class Decoding:  # each read takes 3 ms of the clock
            def read(self):
                reads.append(clock.now)
                clock.now += 0.003
                return real.read()

            def release(self) -> None:
                real.release()

        source.capture = Decoding()
        captured = [frame.captured for frame in source]
    assert captured == pytest.approx([0.003, 0.103, 0.203, 0.303])  # on time, 100 ms apart
    # The first as soon as asked; each next one 2 x 3 + 1 = 7 ms before it is due (the last read finds the end).
    assert reads == pytest.approx([0.0, 0.096, 0.196, 0.296, 0.396])


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


class Webcam:
    """Like ``cv2.VideoCapture`` on a V4L2 webcam under OpenCV 4: a new size applies once both width
    and height were set, and the driver takes the mode nearest to it by uvcvideo's measure (the
    area the two do not share), which may be smaller. ``honours=False``: a camera whose driver
    ignores sizes (``set`` says False); ``rounds_down``: one that takes the largest mode within
    the size asked."""

    MODES = ((160, 120), (320, 240), (352, 288), (640, 480), (1280, 720))

    def __init__(
        self, target: int, honours: bool = True, modes: tuple[tuple[int, int], ...] = MODES, rounds_down: bool = False,
    ) -> None:
        self.honours, self.modes, self.rounds_down = honours, modes, rounds_down
        self.size = (640, 480)
        self.pending: dict[int, int] = {}
        self.asked: list[tuple[int, int]] = []

    def isOpened(self) -> bool:
        return True

    def get(self, prop: int) -> float:
        return {cv2.CAP_PROP_FRAME_WIDTH: self.size[0], cv2.CAP_PROP_FRAME_HEIGHT: self.size[1],
                cv2.CAP_PROP_FPS: 30.0}.get(prop, 0.0)

    def set(self, prop: int, value: float) -> bool:
        if not self.honours or prop not in (cv2.CAP_PROP_FRAME_WIDTH, cv2.CAP_PROP_FRAME_HEIGHT):
            return False
        self.pending[prop] = int(value)
        if len(self.pending) == 2:
            w, h = self.pending.pop(cv2.CAP_PROP_FRAME_WIDTH), self.pending.pop(cv2.CAP_PROP_FRAME_HEIGHT)
            self.asked.append((w, h))
            within = [m for m in self.modes if m[0] <= w and m[1] <= h] or [min(self.modes)]
            self.size = max(within) if self.rounds_down else \
                min(self.modes, key=lambda m: m[0] * m[1] + w * h - 2 * min(m[0], w) * min(m[1], h))
        return True

    def read(self) -> tuple[bool, np.ndarray]:
        return True, np.zeros((self.size[1], self.size[0], 3), np.uint8)

    def release(self) -> None:
        pass


def _webcam(monkeypatch: pytest.MonkeyPatch, **kwargs: object) -> list[Webcam]:
    """cv2.VideoCapture opening :class:`Webcam` (made with ``kwargs``); those opened, in order."""
    opened: list[Webcam] = []

    def open_webcam(target: int) -> Webcam:
        opened.append(Webcam(target, **kwargs))
        return opened[-1]

    monkeypatch.setattr(cv2, "VideoCapture", open_webcam)
    return opened


def test_model_size_keeps_the_aspect_with_the_models_shorter_side() -> None:
    """Truncated as torchvision truncates its resize, so a frame this size is not scaled again."""
    assert model_size(640, 480, 256) == (341, 256) and model_size(480, 640, 256) == (256, 341)
    assert model_size(1280, 720, 232) == (412, 232) and model_size(300, 300, 256) == (256, 256)


def test_an_opencv_camera_is_asked_for_the_smallest_mode_at_or_above_the_models_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """341x256 asked, the driver's nearest is 320x240, too small: asked a quarter larger, it gives
    352x288, the smallest mode at or above, and its frames come at that size."""
    opened = _webcam(monkeypatch)
    with open_source("0", resize=256) as source:
        frame = next(iter(source))
    assert opened[0].asked == [(341, 256), (426, 320)]
    assert (source.asked, source.got) == ((341, 256), (352, 288)) and frame.image.shape == (288, 352, 3)
    assert source.negotiation() == ("asked 341x256 (the model's resize), got 352x288: "
                                    "the board shrinks each frame to a 256-pixel side")


def test_an_opencv_camera_with_the_models_size_needs_no_scaling(monkeypatch: pytest.MonkeyPatch) -> None:
    _webcam(monkeypatch, modes=Webcam.MODES + ((340, 256),))
    with open_source("0", resize=256) as source:
        assert source.got == (340, 256) and next(iter(source)).image.shape == (256, 340, 3)
    assert source.negotiation() == "asked 341x256 (the model's resize), got 340x256: no scaling before the crop"


def test_an_opencv_camera_with_no_mode_between_goes_back_to_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver rounding down, modes 320x240 and 640x480: every size asked below 640x480 gets
    320x240, which the board would enlarge, so the camera is put back in the mode it opened in."""
    opened = _webcam(monkeypatch, modes=((320, 240), (640, 480)), rounds_down=True)
    with open_source("0", resize=256) as source:
        assert next(iter(source)).image.shape == (480, 640, 3)
    assert opened[0].asked == [(341, 256), (426, 320), (533, 400), (640, 480)] and source.got == (640, 480)


def test_an_opencv_camera_that_ignores_the_size_keeps_working(monkeypatch: pytest.MonkeyPatch) -> None:
    _webcam(monkeypatch, honours=False)
    with open_source("0", resize=256) as source:
        frames = [f for _, f in zip(range(3), source)]
    assert all(f.image.shape == (480, 640, 3) for f in frames) and source.got == (640, 480)
    assert source.negotiation() == ("asked 341x256 (the model's resize), got 640x480: "
                                    "the board shrinks each frame to a 256-pixel side")


def test_files_folders_and_synthetic_frames_are_not_asked_for_a_size(tmp_path: Path, photos_dir: Path) -> None:
    with open_source(str(_clip(tmp_path)), resize=256) as video:
        assert next(iter(video)).image.shape == (48, 64, 3) and video.negotiation() is None
    with open_source(str(photos_dir), resize=256) as folder:
        coffee = next(f for f in folder if f.name == "coffee.png")
    assert coffee.image.shape == (400, 600, 3) and folder.negotiation() is None
    with open_source("synthetic:0", resize=256) as synthetic:
        assert next(iter(synthetic)).image.shape == (480, 640, 3) and synthetic.negotiation() is None
