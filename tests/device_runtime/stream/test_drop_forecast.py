"""The run's forecast of the frames a camera faster than the board loses (issue 29.3), against the
drops of a real pipeline whose head is held for a known number of camera frames.

No wall clock: the camera delivers a frame only when the held head lets it, so "the head takes K
frame intervals" is the test's to say, not the machine's.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from calibration import LatencyModel, SplitTable, SplitTimings, Spread
from calibration.calibration_file import Calibration, Preprocessing, save
from device_runtime.board._calibrate import manifest_sha256, precision_of
from device_runtime.bundle import LOCAL, Bundle
from device_runtime.cli import main
from device_runtime.engine._runner import DeviceRunner
from device_runtime._run import drop_forecast
from device_runtime.stream._camera import Frame, FrameSource
from device_runtime.stream._pipeline import Pipeline, PipelineConfig
from device_runtime.stream._policy import StaticPolicy

FPS = 10.0  # the camera's: a frame every 100 ms
K = 3  # frame intervals the board's preprocessing and head take: it answers 1 frame in 3
ROUNDS = 10
FRAMES = 1 + K * ROUNDS


class LockstepCamera(FrameSource):
    """A live camera at :data:`FPS` whose frames come only as fast as :meth:`hold` lets them:
    frame ``j`` is handed over once ``j`` frames are allowed, and :meth:`hold` waits until the
    pipeline has queued every allowed frame (it asked for the next), as a real camera would have
    by then."""

    live = True
    frame_interval_s = 1.0 / FPS
    description = f"lockstep camera at {FPS:g} fps"

    def __init__(self, frames: int) -> None:
        self.frames, self.allowed, self.asked = frames, 1, 0
        self.changed = threading.Condition()

    def __iter__(self) -> Iterator[Frame]:
        image = np.random.default_rng(0).integers(0, 256, (60, 80, 3), dtype=np.uint8)
        for index in range(self.frames):
            with self.changed:
                self.asked = index  # frames before it are in the queue (or dropped from it)
                self.changed.notify_all()
                assert self.changed.wait_for(lambda: index < self.allowed, 30), "the head never let the camera on"
            yield Frame(index, f"lockstep#{index}", image, 0.0)
        with self.changed:
            self.asked = self.frames
            self.changed.notify_all()

    def hold(self) -> None:
        """The head's time, in camera frames: :data:`K` frames come while it runs."""
        with self.changed:
            self.allowed += K
            self.changed.notify_all()
            assert self.changed.wait_for(lambda: self.asked >= min(self.allowed, self.frames), 30), "camera stalled"


def calibrated(preprocess_ms: float | None, head_ms: float) -> Calibration:
    """A board calibrated at ``preprocess_ms`` a frame (None: before it was timed) and a local head
    of ``head_ms``, without a host."""
    model = LatencyModel((SplitTimings(LOCAL, 0, {1: head_ms}, {}),), rtt_ms=0.0, preprocess_ms=preprocess_ms)
    timed = None if preprocess_ms is None else Preprocessing("fast", 80, 60, Spread(preprocess_ms, preprocess_ms,
                                                                                       preprocess_ms))
    return Calibration(
        bundle_id="b", manifest_sha256="ab" * 32, created="2025-05-01T12:00:00+00:00", board={}, backend="onnx",
        precision="float32", threads=1, repeats=1, batches=(1,), link=None, model=model,
        table=SplitTable.build(model, [1]), preprocess=timed,
    )


def test_the_forecast_is_the_drop_of_a_camera_faster_than_a_held_head(mobilenet_bundle: Path) -> None:
    """Preprocessing and head take K = 3 frame intervals as calibrated (120 + 180 ms on one
    thread, at 10 fps): the run says 67 % will be dropped, and a pipeline whose head is held for
    3 frames drops that share, but for the first frame, answered at once."""
    calibration = calibrated(preprocess_ms=120.0, head_ms=K * 1000.0 / FPS - 120.0)
    camera = LockstepCamera(FRAMES)
    line = drop_forecast(calibration, LOCAL, 1, camera)
    assert line == ("this board answers about 3.3 fps of this 10 fps camera; 67 % of frames will be dropped "
                    "(local, batch 1: board compute 300 ms a frame (preprocess 120 + head 180) against a 100 ms "
                    "frame interval, as calibrated)")

    bundle = Bundle.load(mobilenet_bundle, roles=("full",))
    runner = DeviceRunner(bundle, threads=1)
    run_full = runner.run_full

    def held_head(x: np.ndarray) -> tuple[np.ndarray, float]:
        camera.hold()
        return run_full(x)

    runner.run_full = held_head  # type: ignore[method-assign]

    async def go():
        pipeline = Pipeline(runner, StaticPolicy(LOCAL, bundle), config=PipelineConfig())  # live: newest wins
        return [r async for r in pipeline.run(camera)], pipeline.stats

    results, stats = asyncio.run(go())
    assert stats.frames == FRAMES and sorted(r.index for r in results if not r.dropped) == list(range(0, FRAMES, K))
    predicted = 1.0 - 1.0 / K
    assert stats.drop_rate == pytest.approx(predicted, abs=1.0 / FRAMES)  # 20 of 31: the first frame waits for none


def test_a_board_that_keeps_up_forecasts_nothing() -> None:
    # 30 + 60 ms a frame: 11 fps from a 10 fps camera
    assert drop_forecast(calibrated(30.0, 60.0), LOCAL, 1, LockstepCamera(1)) is None


def test_without_a_frame_rate_or_the_splits_times_there_is_no_forecast() -> None:
    recorded = LockstepCamera(1)
    recorded.live = False  # a file read as fast as the board reads it: nothing is dropped
    assert drop_forecast(calibrated(120.0, 500.0), LOCAL, 1, recorded) is None
    assert drop_forecast(calibrated(120.0, 500.0), "features_7", 1, LockstepCamera(1)) is None


def test_a_calibration_without_preprocessing_says_so() -> None:
    line = drop_forecast(calibrated(None, 250.0), LOCAL, 1, LockstepCamera(1))
    assert line is not None and line.startswith("this board answers about 4 fps of this 10 fps camera; 60 % of "
                                                "frames will be dropped (local, batch 1: board compute 250 ms a frame "
                                                "(preprocess 0 + head 250)")
    assert "preprocessing is not in this calibration (counted as 0, so more will be dropped)" in line


def test_a_camera_giving_another_frame_size_than_the_calibrated_one_says_so() -> None:
    camera = LockstepCamera(1)
    camera.got = (341, 256)  # asked for the model's size (issue 29.2); preprocessing was timed on 80x60
    line = drop_forecast(calibrated(120.0, 500.0), LOCAL, 1, camera)
    assert line is not None and line.endswith(
        "as calibrated; preprocessing timed on 80x60 frames, this camera gives 341x256: calibrate --frame 341x256)")
    camera.got = (80, 60)
    assert "calibrate --frame" not in drop_forecast(calibrated(120.0, 500.0), LOCAL, 1, camera)


def test_the_run_says_it_at_start(mobilenet_bundle: Path, tmp_path: Path, capsys) -> None:
    """``split-device run`` with a fixed split and a calibration of what it runs: a 50 fps
    camera against 10 + 190 ms a frame, 5 fps answered, 90 % dropped."""
    root = tmp_path / "bundle"
    shutil.copytree(mobilenet_bundle, root)
    bundle = Bundle.load(root, roles=("full",))
    runner = DeviceRunner(bundle, threads=1)
    own = calibrated(10.0, 190.0)
    fields = {name: getattr(own, name) for name in own.__dataclass_fields__}
    fields.update(bundle_id=bundle.id, manifest_sha256=manifest_sha256(bundle), backend=runner.backend,
                  precision=precision_of(runner))
    save(Calibration(**fields), root / "calibration.json")
    assert main(["run", str(root), "--camera", "synthetic:50", "--split", "local", "--frames", "2",
                 "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert ("this board answers about 5 fps of this 50 fps camera; 90 % of frames will be dropped (local, batch 1: "
            "board compute 200 ms a frame (preprocess 10 + head 190) against a 20 ms frame interval, as calibrated)") in out
