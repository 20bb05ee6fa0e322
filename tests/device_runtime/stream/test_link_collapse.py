"""A refused upload on a collapsed link keeps the stream off the link until a probe shows it back
(issue 43, point 4).

The field trial: the link collapsed to 0.5 Mbit/s under 150 KB frames; the estimate stayed at
49 Mbit/s underneath, and each time an upload's cap lifted the board sent the next frame into the
collapsed link (3.3 s, 2.9 s). Here the board's engine, the host and the link are stand-ins and
the meter's clock is the test's: the upload holds the link 2.4 s by that clock, not by the wall's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import datetime, timezone
from types import SimpleNamespace

import numpy as np
import pytest

from calibration import LatencyModel, RateEstimator, SplitTable, SplitTimings
from calibration.calibration_file import Calibration
from device_runtime.bundle import LOCAL
from device_runtime.hosts import LinkMeter
from device_runtime.stream._camera import Frame, FrameSource
from device_runtime.stream._pipeline import Pipeline, PipelineConfig
from device_runtime.stream._policy import AutoPolicy
from device_runtime.stream._reason import UPLOAD_CAP
from device_runtime.stream._results import FrameResult
from device_runtime.link import Credentials
from device_runtime.wire import ErrorCode
from device_runtime.link import Probe
from splitedge.errors import RemoteError
from tests.calibration.test_timing import ManualClock

CUT = "cut"
FRAME = 150_000  # the trial's cut
FAST, COLLAPSED = 49e6, 0.5e6
PING_MS = 1.0


def _calibration() -> Calibration:
    """CUT (150 KB, 5 ms head and tail) against local at 100 ms: CUT at 49 Mbit/s (35 ms), local at
    0.5 Mbit/s (2.4 s)."""
    model = LatencyModel((SplitTimings(LOCAL, 0, {1: 100.0}, {}), SplitTimings(CUT, FRAME, {1: 5.0}, {1: 5.0})), 0.0)
    return Calibration(
        bundle_id="b", manifest_sha256="0" * 64, created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        board={}, backend="onnx", precision="float32", threads=1, repeats=1, batches=(1,), link=None, model=model,
        table=SplitTable.build(model, (1,)),
    )


class _Runner:
    """The board's engine: instant, and a 150 KB cut."""

    bundle = SimpleNamespace(id="b")
    labels = ["a", "b"]

    def preprocess(self, image: np.ndarray) -> np.ndarray:
        return np.zeros((1, 2), np.float32)

    def run_full(self, x: np.ndarray) -> tuple[np.ndarray, float]:
        return np.zeros((len(x), 2), np.float32), 1.0

    def board_part(self, split: str, x: np.ndarray) -> tuple[tuple[np.ndarray, dict[str, float]], float]:
        return self.payload(split, x), 1.0

    def payload(self, split: str, cut: np.ndarray) -> tuple[np.ndarray, dict[str, float]]:
        return np.zeros(FRAME, np.uint8), {}

    def option(self, split: str) -> tuple[str, None]:
        return split, None


class _Host:
    """A host behind a link, on the meter's clock: probes cross at ``probe_bps``; an upload holds the
    link for its bytes at ``upload_bps`` (the link collapsed under it) and is then refused."""

    address = "10.0.0.2:7000"

    def __init__(self, clock: ManualClock) -> None:
        self.clock, self.probe_bps, self.upload_bps, self.uploads = clock, FAST, COLLAPSED, 0

    def crossing(self) -> tuple[float, float] | None:
        return None  # no TCP_INFO here: the meter has only its own timing

    async def ping(self, payload_bytes: int = 0, timeout: float = 5.0) -> float:
        return (await self.probe(payload_bytes, timeout)).round_trip_ms

    async def probe(self, payload_bytes: int = 0, timeout: float = 5.0) -> Probe:
        return Probe(payload_bytes, PING_MS + 8e3 * payload_bytes / self.probe_bps)

    async def infer(self, bundle: str, split: str, tensor: np.ndarray, *args: object, **kwargs: object) -> object:
        self.uploads += 1
        self.clock.now += 8 * tensor.nbytes / self.upload_bps
        raise RemoteError(ErrorCode.OVERLOADED, "the host's queue filled while the frame crossed")


class _Link:
    """The connected host (a :class:`~device_runtime.hosts.HostLink`'s face to the pipeline)."""

    credentials = Credentials()

    def __init__(self, client: _Host) -> None:
        self.client = client

    def served(self) -> frozenset[str]:
        return frozenset((CUT,))

    async def lost(self, client: _Host, error: Exception) -> None:
        raise AssertionError(f"a refusal does not lose the host: {error}")


class _Frames(FrameSource):
    """``count`` recorded frames: the stream takes them as fast as it can."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __iter__(self) -> Iterator[Frame]:
        for index in range(self.count):
            yield Frame(index, f"f{index}", np.zeros((2, 2, 3), np.uint8), 0.0)


@pytest.fixture
def stream() -> tuple[Pipeline, _Host]:
    clock = ManualClock()
    host = _Host(clock)
    meter = LinkMeter(RateEstimator(clock=clock), clock=clock)
    config = PipelineConfig(probe_every_s=3600.0)  # no idle probe during the run: the test probes
    return Pipeline(_Runner(), AutoPolicy(_calibration()), _Link(host), config, meter), host


def _run(pipeline: Pipeline, frames: int) -> list[FrameResult]:
    async def go() -> list[FrameResult]:
        return sorted([r async for r in pipeline.run(_Frames(frames))], key=lambda r: r.index)
    return asyncio.run(go())


def test_after_a_refused_upload_on_a_collapsed_link_nothing_more_is_offloaded(stream: tuple[Pipeline, _Host]) -> None:
    """The first probe finds 49 Mbit/s and the first frame goes remote; the link collapses to
    0.5 Mbit/s under it, and the host refuses it after 2.4 s. Every frame after it runs here at
    once, and the estimate is the collapsed link's, not 49 Mbit/s under a cap that lifted with the
    upload; the idle prober is due to probe."""
    pipeline, host = stream
    results = _run(pipeline, 6)
    assert host.uploads == 1
    assert results[0].attempted == CUT and "overloaded" in (results[0].error or "")
    assert all(r.split == LOCAL and r.attempted is None and r.reason.kind == UPLOAD_CAP for r in results[1:])
    assert pipeline.meter.estimator.rate_bps <= COLLAPSED * 1.01
    assert pipeline.meter.stale(pipeline.config.probe_every_s)


def test_a_probe_that_shows_the_link_back_lets_the_stream_offload_again(stream: tuple[Pipeline, _Host]) -> None:
    """The policy's hysteresis would hold the remote split two more frames after the collapse: the
    link counts as busy instead, so local is taken at once and kept until a probe measures the link."""
    pipeline, host = stream
    meter, policy = pipeline.meter, pipeline.policy

    def choose() -> str:
        return policy.choose(1, meter.rate_bps, pipeline.available(), link_busy=meter.overdue() is not None,
                             uncapped_bps=meter.estimator.rate_bps).split

    asyncio.run(pipeline.probe(host))
    assert choose() == CUT
    ticket = meter.sending(FRAME)
    host.clock.now += 8 * FRAME / COLLAPSED
    meter.failed(ticket, RemoteError(ErrorCode.OVERLOADED, "late"))
    meter.settled(ticket)
    host.clock.now += 10.0
    assert [choose() for _ in range(5)] == [LOCAL] * 5
    asyncio.run(pipeline.probe(host))  # the link is back: 49 Mbit/s
    assert meter.rate_bps == pytest.approx(FAST) and meter.overdue() is None
    assert CUT in [choose() for _ in range(3)]  # past the hysteresis's hold on local
