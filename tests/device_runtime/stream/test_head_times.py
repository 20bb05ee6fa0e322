"""What ``--split auto`` decides with: the head times it records (at the start and at each
refinement, from the frame it made it), and a run given those decides as the recorded one did.

No clock here: head times are fed, and "the same point of the stream" is a frame index.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import pytest

from calibration import LatencyModel, SplitTable, SplitTimings
from calibration.calibration_file import Calibration
from device_runtime.bundle import LOCAL, Bundle
from device_runtime.engine._runner import DeviceRunner
from device_runtime.stream import HeadTimes
from device_runtime.stream.trace import HEAD_TIMES, TraceWriter, read_head_times
from device_runtime.stream._camera import open_source
from device_runtime.stream._pipeline import Pipeline, PipelineConfig
from device_runtime.stream._policy import CALIBRATED, RECORDED, REFINED_TIMES, AutoPolicy, StaticPolicy
from splitedge.errors import SplitEdgeError

CUT = "cut"
BOTH = {LOCAL, CUT}
#: The link a "trial" saw, frame by frame: slow (local wins), then fast, three times over.
RATES = ([1e5] * 12 + [1e8] * 12) * 3


def _calibration(local_ms: float = 200.0) -> Calibration:
    """Local at ``local_ms`` against CUT (10,000 bytes, a 5 ms head, a 5 ms tail): CUT wins above
    about 0.42 Mbit/s as calibrated; at 100 Mbit/s (10.8 ms) local wins once it times under that."""
    model = LatencyModel((SplitTimings(LOCAL, 0, {1: local_ms}, {}), SplitTimings(CUT, 10_000, {1: 5.0}, {1: 5.0})),
                         0.0)
    return Calibration(
        bundle_id="b", manifest_sha256="0" * 64, created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        board={}, backend="onnx", precision="float32", threads=1, repeats=1, batches=(1,), link=None, model=model,
        table=SplitTable.build(model, (1,)),
    )


def _stream(
    policy: AutoPolicy, local_ms: Callable[[int], float], cut_ms: float, rates: list[float] = RATES,
) -> list[str]:
    """What a pipeline does for each frame (batch 1): where it is, the choice, the head's time
    (local's as ``local_ms`` of the frame's index)."""
    splits = []
    for index, rate in enumerate(rates):
        policy.observe_batch(index)
        split = policy.choose(1, rate, BOTH).split
        policy.observe_head(split, 1, local_ms(index) if split == LOCAL else cut_ms)
        splits.append(split)
    return splits


def _throttled(index: int) -> float:
    """A board's full model at 8 ms that throttles to 300 ms from frame 30 on."""
    return 8.0 if index < 30 else 300.0


def test_the_policy_says_what_it_starts_with_and_each_refinement_with_its_frame() -> None:
    """The calibrated head times first (no frame: from the start); after ``refine_every`` heads,
    the running medians, the frame whose head completed them, and the rebuilt table's edges."""
    calibration = _calibration()
    policy = AutoPolicy(calibration, min_hold=1, refine_every=8)
    heard: list[HeadTimes] = []
    policy.watch(heard.append)
    tails = {t.split: dict(t.tail_ms) for t in calibration.model.splits}
    assert heard == [HeadTimes(CALIBRATED, None, 0, {LOCAL: {1: 200.0}, CUT: {1: 5.0}},
                               {1: tuple(calibration.table.boundaries(1))}, tails)]
    _stream(policy, local_ms=lambda _: 8.0, cut_ms=6.0, rates=[1e5] * 8)  # slow: local, timed at 8 ms
    assert len(heard) == 2
    refined = heard[1]
    assert (refined.source, refined.index, refined.observed) == (REFINED_TIMES, 7, 8)
    # CUT not run: its calibrated 5 ms at the board's speed now, local's 8 / 200 of calibrated
    assert refined.head_ms == {LOCAL: {1: 8.0}, CUT: {1: pytest.approx(0.2)}}
    model = refined.applied_to(calibration.model)
    assert refined.edges == {1: tuple(calibration.table.for_model(model).boundaries(1))}
    assert refined.edges != heard[0].edges and policy.head_times == refined
    assert policy.choose(1, 1e8, BOTH).split == CUT  # 0.2 + 0.8 + 5 = 6 ms beats local's 8 at 100 Mbit/s


def test_recorded_head_times_are_taken_up_at_the_same_frames_and_decide_alike(tmp_path: Path) -> None:
    """A "trial" whose board times local at 8 ms (it goes local on the fast link once refined),
    then throttles (back to CUT there), is traced; a board ten times slower (80 ms: it would
    offload on the fast link throughout) given the trace's head times takes up each at the frame
    the trial did and chooses every frame as the trial did, while one that measures its own does not."""
    trial = AutoPolicy(_calibration(), min_hold=1, refine_every=8, refine_min_s=0.0)
    trace = tmp_path / "trial.jsonl"
    with TraceWriter(trace, {"bundle_id": "b", "policy": "auto"}) as writer:
        trial.watch(writer.head_times)
        trial_splits = _stream(trial, local_ms=_throttled, cut_ms=6.0)
    fast = [split for split, rate in zip(trial_splits, RATES) if rate == 1e8]
    assert LOCAL in fast and CUT in fast  # the trial's refinements moved its choice on the fast link both ways
    run, recorded = read_head_times(trace)
    assert run["policy"] == "auto" and len(recorded) > 2
    assert [r.source for r in recorded] == [CALIBRATED] + [REFINED_TIMES] * (len(recorded) - 1)

    replay = AutoPolicy(_calibration(), min_hold=1, refine_every=8, recorded=recorded, refine_min_s=0.0)
    heard: list[HeadTimes] = []
    replay.watch(heard.append)
    assert replay.replaying and _stream(replay, local_ms=lambda _: 80.0, cut_ms=60.0) == trial_splits
    last = len(RATES) - 1  # a refinement after the last frame's head chose nothing
    assert [(h.source, h.index, h.observed, h.head_ms, h.edges) for h in heard] == [
        (RECORDED, r.index, r.observed, r.head_ms, r.edges) for r in recorded if r.index is None or r.index < last]
    assert replay.running.median(LOCAL, 1) is None  # it timed nothing of its own

    own = AutoPolicy(_calibration(), min_hold=1, refine_every=8, refine_min_s=0.0)
    assert _stream(own, local_ms=lambda _: 80.0, cut_ms=60.0) != trial_splits


def test_a_recorded_refinement_waits_for_a_batch_past_its_frame() -> None:
    """Taken up before choosing for the first batch whose last frame comes after the recorded one,
    however many heads this board has run by then (offloaded frames run none)."""
    calibration = _calibration()
    fast_local = HeadTimes(REFINED_TIMES, 5, 8, {LOCAL: {1: 8.0}, CUT: {1: 5.0}}, {})
    policy = AutoPolicy(calibration, min_hold=1, recorded=[fast_local])
    assert policy.head_times.source == CALIBRATED  # no recorded start: the calibration's
    for last in (1, 3, 5):  # batches of two, the last ending at the recorded frame
        policy.observe_batch(last)
        assert policy.choose(2, 1e8, BOTH).split == CUT
    policy.observe_batch(7)
    assert policy.choose(2, 1e8, BOTH).split == LOCAL and policy.head_times.index == 5


def test_a_recorded_start_replaces_the_calibrated_head_times() -> None:
    start = HeadTimes(CALIBRATED, None, 0, {LOCAL: {1: 8.0}, CUT: {1: 5.0}, "gone": {1: 1.0}}, {})
    policy = AutoPolicy(_calibration(), min_hold=1, recorded=[start])
    assert policy.head_times.source == RECORDED and policy.head_times.head_ms == {LOCAL: {1: 8.0}, CUT: {1: 5.0}}
    assert policy.choose(1, 1e8, BOTH).split == LOCAL


def test_head_times_read_back_as_written_and_a_trace_without_them_says_so(tmp_path: Path) -> None:
    calibration = _calibration()
    times = HeadTimes.of(REFINED_TIMES, 41, 32, calibration.model, calibration.table)
    path = tmp_path / "run.jsonl"
    with TraceWriter(path, {"policy": "auto"}) as writer:
        writer.head_times(times)
    with path.open("a") as file:
        file.write('{"type": "frame", "ind')  # a run that lost power mid-line
    record = json.loads(path.read_text().splitlines()[1])
    assert record["type"] == HEAD_TIMES and record["index"] == 41 and record["head_ms"][LOCAL] == {"1": 200.0}
    assert read_head_times(path)[1] == [times]
    bare = tmp_path / "fixed.jsonl"
    TraceWriter(bare, {"policy": "cut"}).close()
    with pytest.raises(SplitEdgeError, match="no head_times records.*--split cut"):
        read_head_times(bare)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(path.read_text().splitlines()[0] + '\n{"type": "head_times", "source": "guessed", "head_ms": {}}\n')
    with pytest.raises(SplitEdgeError, match="bad.jsonl:2 source"):
        read_head_times(bad)


class _Where(StaticPolicy):
    """A fixed split that notes where the stream told it it was, and when it chose."""

    def __init__(self, bundle: Bundle) -> None:
        super().__init__(LOCAL, bundle)
        self.calls: list[tuple[str, int | None]] = []

    def observe_batch(self, last: int) -> None:
        self.calls.append(("at", last))

    def choose(self, *args, **kwargs):
        self.calls.append(("choose", None))
        return super().choose(*args, **kwargs)


def test_the_pipeline_says_where_each_batch_ends_before_choosing_for_it(mobilenet_bundle: Path,
                                                                           photos_dir: Path) -> None:
    bundle = Bundle.load(mobilenet_bundle, roles=("full",))
    policy = _Where(bundle)

    async def go() -> list[int]:
        pipeline = Pipeline(DeviceRunner(bundle, threads=1), policy, config=PipelineConfig(batch=2, drop="none"))
        return [r.index async for r in pipeline.run(open_source(str(photos_dir), loop=True), frames=6)]

    assert asyncio.run(go()) == list(range(6))
    assert policy.calls == [("at", 1), ("choose", None), ("at", 3), ("choose", None), ("at", 5), ("choose", None)]
