"""The Pi camera source against a stand-in Picamera2 (``fake_picamera2/``) with the real one's
interface and timing: RGB frames at the requested size with one copy, frames at the model's
size from the ISP's lores stream, sensor timestamps as capture times, pacing, a clean stop,
and the errors of a missing or dead camera."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Iterator

import numpy as np
import pytest

from device_runtime import cli as device_cli
from device_runtime import _run as device_run
from device_runtime.board._detect import DetectedBoard
from device_runtime.stream._camera import open_source
from device_runtime.stream._picamera import FORMAT, LORES_FORMAT, PiCamera, open_picamera, pi_camera_absent
from splitedge.errors import CameraError
from tests.calibration.test_timing import ManualClock

STAND_IN = Path(__file__).parent / "fake_picamera2"


@pytest.fixture
def picamera2(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The stand-in as ``picamera2``, on a clock the test drives, fresh for each test."""
    monkeypatch.syspath_prepend(str(STAND_IN))
    monkeypatch.delitem(sys.modules, "picamera2", raising=False)
    import picamera2

    assert Path(picamera2.__file__).is_relative_to(STAND_IN)
    picamera2.reset()
    clock = ManualClock()
    picamera2.use_clock(clock, clock.sleep)
    picamera2.clock = clock
    yield picamera2
    monkeypatch.delitem(sys.modules, "picamera2", raising=False)


def _camera(picamera2: ModuleType) -> object:
    (camera,) = picamera2.OPENED
    return camera


def test_frames_are_rgb_at_the_requested_size_in_one_copy(picamera2: ModuleType) -> None:
    """100x60: rows of 300 bytes padded to 320 in the DMA buffer. The frame is a view of the one
    copy ``make_buffer`` made, stepping over the padding, with red, green and blue where the
    sensor saw them."""
    with PiCamera(size=(100, 60), fps=30) as source:
        frame = next(iter(source))
        camera = _camera(picamera2)
        assert camera.camera_config["main"]["format"] == FORMAT and camera.camera_config["main"]["stride"] == 320
    assert frame.image.shape == (60, 100, 3) and frame.image.dtype == np.uint8
    np.testing.assert_array_equal(frame.image, picamera2.stripes(0, 60, 100))  # RGB, not BGR; no padding bytes
    assert tuple(frame.image[30, 10]) == (255, 0, 0) and tuple(frame.image[30, 90]) == (0, 0, 255)
    (buffer,) = camera.buffers_made
    assert np.shares_memory(frame.image, buffer)  # no copy after make_buffer's
    assert frame.name == "picam:0#0" and source.description == "Pi camera 0 (imx708) 100x60 at 30 fps"


def test_the_byte_order_the_stand_in_keeps_is_picamera2s(picamera2: ModuleType) -> None:
    """What the test above relies on: RGB888 is [B, G, R] in memory, BGR888 [R, G, B]."""
    camera = picamera2.Picamera2(0)
    for fmt, red in (("RGB888", (0, 0, 255)), ("BGR888", (255, 0, 0)), ("XBGR8888", (255, 0, 0, 255))):
        camera.configure(camera.create_video_configuration(main={"size": (64, 48), "format": fmt}))
        camera.start()
        assert tuple(camera.capture_array("main", wait=1.0)[0, 0]) == red
        camera.stop()
    camera.close()


def _near_stripes(image: np.ndarray) -> None:
    """Red, green and blue thirds, as the sensor saw them, after YUV420's round trip: exact away
    from the edges, where chroma shared by two columns blurs them."""
    width = image.shape[1]
    for third, colour in enumerate(((255, 0, 0), (0, 255, 0), (0, 0, 255))):
        middle = image[:, third * width // 3 + 4 : (third + 1) * width // 3 - 4].astype(int)
        assert np.abs(middle - colour).max() <= 2, f"third {third}"


def test_frames_at_the_models_size_come_from_the_isps_lores_stream(
    picamera2: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model resizing to 256: the 640x480 camera is asked for 341x256 on its lores stream
    (main's aspect; YUV420, main YUV420 too since nothing reads it); Picamera2 aligns it to
    340x256, and its frames come RGB at that size, padding (a 384-byte stride) stepped over."""
    pytest.importorskip("cv2", reason="the lores stream's YUV420 is made RGB by OpenCV")
    with PiCamera(size=(640, 480), fps=30, resize=256) as source:
        frames = [f for _, f in zip(range(2), source)]
        config = _camera(picamera2).camera_config
    assert config["main"]["size"] == (640, 480) and config["main"]["format"] == LORES_FORMAT
    lores = config["lores"]
    assert (lores["size"], lores["format"], lores["stride"]) == ((340, 256), "YUV420", 384)
    assert (source.asked, source.got) == ((341, 256), (340, 256))
    assert source.negotiation() == "asked 341x256 (the model's resize), got 340x256: no scaling before the crop"
    assert source.description == "Pi camera 0 (imx708) 340x256 at 30 fps (the ISP's lores stream; main 640x480)"
    for frame in frames:
        assert frame.image.shape == (256, 340, 3) and frame.image.dtype == np.uint8
        _near_stripes(frame.image)
    (buffer, _) = _camera(picamera2).buffers_made
    assert buffer.size == 384 * 256 * 3 // 2  # what came out of the DMA buffer: the lores stream, not main


def test_a_model_size_larger_than_main_is_main_enlarged_by_the_board(picamera2: ModuleType) -> None:
    """Picamera2 refuses a lores larger than main: a 320x240 camera for a 256 model gives its main
    frames, and the run says the board enlarges them."""
    with PiCamera(size=(320, 240), resize=256) as source:
        frame = next(iter(source))
        assert _camera(picamera2).camera_config["lores"] is None
    assert frame.image.shape == (240, 320, 3) and source.got == (320, 240)
    assert source.negotiation() == ("asked 341x256 (the model's resize), got 320x240: "
                                    "the board enlarges each frame to a 256-pixel side")
    with PiCamera(size=(640, 480)) as source:  # no model size: nothing asked, nothing said
        assert source.asked is None and source.negotiation() is None


def test_the_stand_in_configures_lores_as_picamera2_does(picamera2: ModuleType) -> None:
    """What the tests above rely on, as Picamera2's create_video_configuration, align_configuration
    and check_camera_config have it: lores YUV420 at main's size unless given, sizes aligned down
    to even (optimal alignment: YUV420 widths to 64 on the Pi 4), no larger than main, YUV only;
    capture_array("lores") the Y, U and V rows at the stride, as OpenCV's I420 takes them."""
    cv2 = pytest.importorskip("cv2", reason="the stand-in makes YUV420 with OpenCV")
    camera = picamera2.Picamera2(0)
    config = camera.create_video_configuration(main={"size": (641, 481), "format": FORMAT}, lores={})
    assert config["main"]["size"] == (640, 480) and config["lores"] == {"format": "YUV420", "size": (640, 480),
                                                                       "preserve_ar": False}
    config = camera.create_video_configuration(main={"size": (640, 480)}, lores={"size": (341, 257)})
    assert config["lores"]["size"] == (340, 256)
    camera.align_configuration(config)
    assert config["lores"]["size"] == (320, 256) and config["main"]["size"] == (640, 480)
    with pytest.raises(ValueError, match="Bad key 'colour'"):
        camera.create_video_configuration(lores={"colour": "red"})
    for lores, refused in (({"size": (660, 480)}, "may not exceed main"), ({"format": "RGB888"}, "must be YUV")):
        with pytest.raises(RuntimeError, match=refused):
            camera.configure(camera.create_video_configuration(main={"size": (640, 480)}, lores=lores))
    camera.configure(camera.create_video_configuration(main={"size": (640, 480)}, lores={"size": (100, 60)}))
    camera.start()
    planes = camera.capture_array("lores", wait=1.0)
    assert planes.shape == (90, 128)  # 60 rows of Y, then U and V, at a 128-byte stride
    _near_stripes(cv2.cvtColor(planes, cv2.COLOR_YUV2RGB_I420)[:, :100])
    request = camera.capture_request(wait=1.0)
    request.release()
    camera.stop()
    camera.configure(camera.create_video_configuration(main={"size": (64, 48), "format": FORMAT}))
    camera.start()
    request = camera.capture_request(wait=1.0)
    with pytest.raises(RuntimeError, match="Stream 'lores' is not defined"):
        request.make_buffer("lores")
    request.release()
    camera.close()


def test_capture_times_are_the_sensors_and_the_pace_its_own(picamera2: ModuleType) -> None:
    """50 fps: frames exposed 20 ms apart, each handed over one frame later. A reader 50 ms late
    gets the newest completed frame at once, stamped when it was exposed, not when it was read."""
    clock = picamera2.clock
    with PiCamera(size=(64, 48), fps=50) as source:
        frames = iter(source)
        start = clock.now
        captured, read = [], []
        for late in (0.0, 0.0, 0.0, 0.05, 0.0):
            clock.now += late  # the reader is busy
            captured.append(next(frames).captured)
            read.append(clock.now)
    assert np.array(captured) - start == pytest.approx([0.0, 0.02, 0.04, 0.08, 0.10])
    assert np.array(read) - start == pytest.approx([0.02, 0.04, 0.06, 0.11, 0.12])
    assert source.frame_interval_s == pytest.approx(0.02) and source.live


def test_the_camera_is_stopped_and_closed_on_exit_and_on_an_exception(picamera2: ModuleType) -> None:
    with PiCamera(size=(64, 48)) as source:
        next(iter(source))
    first = _camera(picamera2)
    assert not first.started and not first.is_open and first.held == 0  # every request released
    with pytest.raises(ValueError, match="the head failed"):
        with PiCamera(size=(64, 48)) as source:
            for _ in source:
                raise ValueError("the head failed")
    second = picamera2.OPENED[-1]
    assert second is not first and not second.started and not second.is_open
    source.close()  # twice is harmless


def test_requests_are_released_at_once_or_the_camera_stalls(picamera2: ModuleType) -> None:
    """Two buffers: one held request stalls the stand-in, as a starved camera stalls. Frames
    keep coming because each request goes back before the frame is handed on."""
    with PiCamera(size=(64, 48), fps=30, buffer_count=2) as source:
        frames = [f for _, f in zip(range(5), source)]
    assert len(frames) == 5 and _camera(picamera2).held == 0
    camera = picamera2.Picamera2(0)
    camera.configure(camera.create_video_configuration(main={"size": (64, 48), "format": FORMAT}, buffer_count=2))
    camera.start()
    camera.capture_request(wait=1.0)  # held, never released
    with pytest.raises(TimeoutError):
        camera.capture_request(wait=1.0)
    with pytest.raises(AssertionError, match="waits for ever"):
        camera.stop()  # queued behind the capture that timed out
    camera.cancel_all_and_flush()
    camera.close()


def test_a_dead_camera_is_an_error_not_a_hang(picamera2: ModuleType) -> None:
    """The camera goes silent after 3 frames: the fourth is waited for ``timeout_s``, then the
    stream ends with a CameraError saying so, and the camera still stops (its timed-out
    capture job cleared first, or Picamera2's stop would wait behind it)."""
    picamera2.DIE_AFTER = 3
    clock = picamera2.clock
    frames = []
    dead = r"Pi camera 0 stopped delivering frames after 3 \(TimeoutError: no frame in 1.5 s\)"
    with pytest.raises(CameraError, match=dead):
        with PiCamera(size=(64, 48), fps=10, timeout_s=1.5) as source:
            for frame in source:
                frames.append(frame)
    assert len(frames) == 3
    assert clock.slept[-1] == pytest.approx(1.5)  # waited as long as it was told, no longer
    assert not _camera(picamera2).is_open


def test_a_missing_picamera2_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "picamera2", None)  # import picamera2 raises ImportError
    with pytest.raises(CameraError, match=r"sudo apt install python3-picamera2.*--system-site-packages"):
        open_source("picam")
    assert "sudo apt install python3-picamera2" in (pi_camera_absent() or "")


def test_no_camera_module_and_bad_configurations(picamera2: ModuleType) -> None:
    picamera2.CAMERAS.clear()
    assert pi_camera_absent() == "libcamera lists no camera module"
    with pytest.raises(CameraError, match="libcamera lists 0 camera module"):
        PiCamera()
    picamera2.reset()
    assert pi_camera_absent() is None
    with pytest.raises(CameraError, match="lists 1 camera module"):
        open_source("picam1")
    picamera2.FORMATS.discard(FORMAT)  # a camera that cannot give this format
    with pytest.raises(CameraError, match=f"Pi camera 0 \\(imx708\\): .*no {FORMAT} output"):
        PiCamera()
    assert not picamera2.OPENED[-1].is_open  # freed on the way out
    picamera2.reset()
    with PiCamera(size=(101, 61)) as source:  # Picamera2 aligns a size down to even, as libcamera needs
        assert (source.width, source.height) == (100, 60)
    camera = picamera2.Picamera2(0)
    with pytest.raises(RuntimeError, match="width and height should be even"):  # unless told otherwise
        camera.configure(camera.create_video_configuration() | {"main": {"size": (101, 60), "format": FORMAT}})
    camera.close()
    with pytest.raises(CameraError, match="frame rate must be above 0"):
        PiCamera(fps=0)


@pytest.mark.parametrize(
    ("spec", "camera", "size", "fps"),
    [
        ("picam", 0, (640, 480), 30.0),
        ("picam:1280x720", 0, (1280, 720), 30.0),
        ("picam@15", 0, (640, 480), 15.0),
        ("picam1:320x240@7.5", 1, (320, 240), 7.5),
    ],
)
def test_picam_specs(picamera2: ModuleType, spec: str, camera: int, size: tuple[int, int], fps: float) -> None:
    picamera2.CAMERAS.append(dict(picamera2.IMX708))
    with open_picamera(spec) as source:
        assert (source.number, (source.width, source.height), source.fps) == (camera, size, fps)


def test_bad_picam_specs(picamera2: ModuleType) -> None:
    for spec in ("picam:640", "picam@", "picamera", "picam:640x480@fast"):
        with pytest.raises(CameraError, match=r"expected picam\[N\]\[:WIDTHxHEIGHT\]\[@FPS\]"):
            open_source(spec)


def _board(model: str | None) -> DetectedBoard:
    return DetectedBoard(profile=None, model=model, architecture="aarch64", cores=4, memory_bytes=None, python="3.11")


def test_split_device_run_chooses_the_pi_camera_on_a_pi_with_one(
    picamera2: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--camera auto`` (the default): picam on a Raspberry Pi whose libcamera lists a camera
    module; OpenCV camera 0 anywhere else, with the reason; a named source as it is."""
    pi = _board("Raspberry Pi 4 Model B Rev 1.5")
    assert device_cli.build_parser().parse_args(["run", "bundle/"]).camera == "auto"
    assert device_run._camera("auto", pi) == ("picam", " (auto: a Raspberry Pi with a camera module)")
    assert device_run._camera("auto", _board(None)) == ("0", " (auto: not a Raspberry Pi, so OpenCV camera 0)")
    assert device_run._camera("clip.mp4", pi) == ("clip.mp4", "")
    picamera2.CAMERAS.clear()
    no_module = " (auto: OpenCV camera 0, no Pi camera: libcamera lists no camera module)"
    assert device_run._camera("auto", pi) == ("0", no_module)
    monkeypatch.setitem(sys.modules, "picamera2", None)
    spec, why = device_run._camera("auto", pi)
    assert spec == "0" and "sudo apt install python3-picamera2" in why


def test_split_device_run_streams_from_the_pi_camera(
    picamera2: ModuleType, mobilenet_bundle: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The whole command on the stand-in, on the real clock: frames answered, the camera said, and
    the camera stopped and closed at the end."""
    picamera2.use_clock(time.monotonic, time.sleep)
    assert device_cli.main(["run", str(mobilenet_bundle), "--camera", "picam:320x240@30", "--split", "local",
                            "--frames", "4", "--threads", "1", "--drop", "none"]) == 0
    out = capsys.readouterr().out
    assert "camera: Pi camera 0 (imx708) 320x240 at 30 fps\n" in out and "4 frames: 0 dropped" in out
    assert "camera: asked 341x256 (the model's resize), got 320x240: the board enlarges" in out
    camera = _camera(picamera2)
    assert not camera.started and not camera.is_open


def test_split_device_run_asks_the_pi_camera_for_the_models_size(
    picamera2: ModuleType, mobilenet_bundle: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The bundle's resize (256) reaches the camera: the run says what it asked for and got, and the
    frames the pipeline reads are the lores stream's, RGB at 340x256."""
    pytest.importorskip("cv2", reason="the lores stream's YUV420 is made RGB by OpenCV")
    picamera2.use_clock(time.monotonic, time.sleep)
    images: list[np.ndarray] = []
    made = PiCamera._image

    def seen(source: PiCamera, buffer: np.ndarray) -> np.ndarray:
        images.append(made(source, buffer))
        return images[-1]

    monkeypatch.setattr(PiCamera, "_image", seen)
    assert device_cli.main(["run", str(mobilenet_bundle), "--camera", "picam", "--split", "local",
                            "--frames", "3", "--threads", "1", "--drop", "none"]) == 0
    out = capsys.readouterr().out
    assert "camera: asked 341x256 (the model's resize), got 340x256: no scaling before the crop\n" in out
    assert "3 frames: 0 dropped" in out
    assert len(images) >= 3 and all(i.shape == (256, 340, 3) for i in images)
    _near_stripes(images[0])


def test_a_camera_auto_could_not_open_says_why_auto_took_it(
    picamera2: ModuleType, mobilenet_bundle: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Pi without a camera module and without a webcam: the error names camera 0 and why."""
    picamera2.CAMERAS.clear()
    monkeypatch.setattr(device_run, "detect_board", lambda: _board("Raspberry Pi 5 Model B Rev 1.0"))
    monkeypatch.setattr(device_run, "open_source", _no_camera_0)
    assert device_cli.main(["run", str(mobilenet_bundle), "--split", "local", "--frames", "1", "--threads", "1"]) == 2
    assert ("cannot open camera 0 (auto: OpenCV camera 0, no Pi camera: libcamera lists no camera module)"
            in capsys.readouterr().err)


def _no_camera_0(spec: str, loop: bool = False, realtime: bool = False, resize: int | None = None) -> None:
    assert spec == "0"
    raise CameraError("cannot open camera 0")
