"""Each frame's waits (the board's queue, an in-flight slot, the host's queue) apart from its stages,
as the report needs them to compare the stages with the latency model."""

from __future__ import annotations

from pathlib import Path

from device_runtime.bundle import Bundle
from device_runtime.engine._runner import DeviceRunner
from tests.conftest import TEST_SPLITS, run_stream

SPLIT = TEST_SPLITS[-1]
#: perf_counter (the stage times) and monotonic (capture, the waits) are read at different instants.
SLACK_MS = 1.0


def test_frames_record_their_waits_apart_from_their_stages(mobilenet_bundle: Path, host) -> None:
    bundle = Bundle.load(mobilenet_bundle)
    # No deadline: on a busy machine the live source's 33 ms could send a batch back to run here.
    results = run_stream(
        DeviceRunner(bundle, threads=1), "synthetic", SPLIT, host, frames=8, batch=4, drop="none", deadline_ms=None
    )
    assert [r.index for r in results] == list(range(8)) and all(r.where == "remote" for r in results)
    for r in results:
        assert min(r.queue_ms, r.slot_ms, r.host_queue_ms) >= 0.0
        # Stages and waits never add up to more than the frame took from capture to answer.
        parts = r.preprocess_ms + r.head_ms + r.transfer_ms + r.tail_ms + r.waits_ms
        assert parts <= r.total_ms + SLACK_MS, r
    for first, last in ((results[0], results[3]), (results[4], results[7])):
        # A batch's first frame waited for the other three to be captured; its head started for all at once.
        assert first.queue_ms >= last.queue_ms
