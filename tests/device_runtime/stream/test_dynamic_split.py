"""Dynamic splitting on a real shaped link: the rate estimate converges and the split follows a rate step.

The host runs in a network namespace behind a tbf-shaped veth (kernel rate limiting, as
on a link whose rate we choose); the device is this process. Those tests are skipped, with
the reason, where namespaces cannot be made (not root, no ``tc``); the split following a
rate step is also shown through :class:`DelayRelay`'s user-space rate limit on 127.0.0.1,
which any machine can run.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import shutil
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Awaitable, Callable, Collection, Iterator, TypeVar

import numpy as np
import pytest

from calibration import LatencyModel, RateEstimator, SplitTable, SplitTimings
from calibration.calibration_file import Calibration, FILENAME, save
from device_runtime.board._calibrate import calibration_for, manifest_sha256
from device_runtime.bundle import LOCAL, OFFLOAD, Bundle
from device_runtime.engine._runner import DeviceRunner
from device_runtime.link import HostClient
from device_runtime.hosts._host_link import HostLink
from device_runtime.hosts._link_meter import LinkMeter
from device_runtime.stream._camera import Synthetic
from device_runtime.stream._pipeline import Pipeline, PipelineConfig
from device_runtime.stream._policy import AutoPolicy, StaticPolicy
from device_runtime.stream._reason import TABLE, UPLOAD_CAP, Choice
from device_runtime.stream._results import FrameResult
from device_runtime.link import InferResult
from device_runtime.link import UploadTiming
from testbed import DelayRelay, EmulatedLink, unavailable_reason
from tests.calibration.test_timing import ManualClock
from testbed._namespace_host import running_host, serve_in
from tests.conftest import TEST_SPLITS, run_stream, start_host, until

needs_netns = pytest.mark.skipif(unavailable_reason() is not None, reason=f"no link emulation: {unavailable_reason()}")

T = TypeVar("T")
SPLIT = TEST_SPLITS[-1]  # features_14_conv_2: 31,360 bytes per frame
RATE_STEP_FRAMES = 400
#: The rate step's fast link: a Wi-Fi link's rate, not loopback's. Its probes (50 ms of bytes,
#: 125 KB) hold the frames behind one that crosses as the link drops for 2 s at 0.5 Mbit/s;
#: loopback's 1 MB probes held them 17 s, past their 10 s timeout (issue 28).
FAST_MBIT = 20.0


@pytest.fixture
def shaped_host(mobilenet_bundle: Path) -> Iterator[tuple[EmulatedLink, str]]:
    with EmulatedLink(rate_mbit=5.0) as link, serve_in(link, [mobilenet_bundle]) as address:
        yield link, address


@needs_netns
def test_rate_estimate_converges_on_a_shaped_link(mobilenet_bundle: Path, shaped_host) -> None:
    """Probes alone, then a pipelined stream with two batches in flight: both read ~5 Mbit/s."""
    link, address = shaped_host
    bundle = Bundle.load(mobilenet_bundle)

    async def probes(pipeline: Pipeline, client: HostClient) -> float:
        for _ in range(8):
            await pipeline.probe(client)
        return pipeline.meter.rate_bps

    from_probes = asyncio.run(_probing(bundle, address, probes))
    # tbf counts Ethernet/IP/TCP headers: goodput is at most 95.6 % of the configured rate.
    assert from_probes == pytest.approx(5e6, rel=0.15)

    meter = LinkMeter()
    runner = DeviceRunner(bundle, threads=1)
    host = _Address(address)
    results = run_stream(runner, "synthetic:0", SPLIT, host, frames=60, drop="none", meter=meter)
    assert all(r.where == "remote" for r in results)
    # 31 KB per frame at 5 Mbit/s is 50 ms: the link is the bottleneck and the stream keeps it busy.
    assert meter.rate_bps == pytest.approx(5e6, rel=0.2), meter.rate_bps


@needs_netns
@pytest.mark.parametrize(("rate_mbit", "payload_pings"), [(5.0, 1), (500.0, 2)])
def test_a_probe_lengthens_when_the_link_is_faster_than_it_can_measure(
    mobilenet_bundle: Path, rate_mbit: float, payload_pings: int
) -> None:
    """A 64 KB first probe measures 5 Mbit/s well (100 ms) but not 500 (1 ms, mostly fixed
    costs): there, and only there, a longer payload follows."""
    bundle = Bundle.load(mobilenet_bundle)

    async def probe_once(pipeline: Pipeline, client: HostClient) -> int:
        before = (await client.stats())["stats"]["requests"]["ping"]
        await pipeline.probe(client)
        return int((await client.stats())["stats"]["requests"]["ping"] - before)

    with EmulatedLink(rate_mbit=rate_mbit) as link, serve_in(link, [mobilenet_bundle]) as address:
        pings = asyncio.run(_probing(bundle, address, probe_once))
    assert pings == 1 + payload_pings


def test_after_a_slow_spell_the_first_probes_own_rate_calls_the_longer_one(mobilenet_bundle: Path, host) -> None:
    """The estimate still says 0.5 Mbit/s, the link (loopback) is fast again: the 16 KB probe
    comes back about as soon as a bare ping and barely moves the estimate, so its own rate,
    not the estimate, must call the 1 MB probe (how far that one moves the estimate depends
    on how long loopback takes to carry it here)."""
    bundle = Bundle.load(mobilenet_bundle)

    async def probe_once(pipeline: Pipeline, client: HostClient) -> tuple[int, float]:
        before = (await client.stats())["stats"]["requests"]["ping"]
        await pipeline.probe(client)
        return int((await client.stats())["stats"]["requests"]["ping"] - before), pipeline.meter.rate_bps

    meter = LinkMeter(RateEstimator(initial_bps=0.5e6))
    pings, rate = asyncio.run(_probing(bundle, f"{host.host}:{host.port}", probe_once, meter))
    assert pings == 3 and rate > 0.5e6


def test_a_probe_crossing_slowly_caps_the_estimate_as_an_overdue_upload_does(mobilenet_bundle: Path, host) -> None:
    """A 1 MB probe sized for a 500 Mbit/s estimate goes up a link that carries 1 Mbit/s (8 s):
    a frame sent meanwhile would wait behind it in the socket, so once it is overdue the
    estimate is capped by what it has not crossed, and nothing stays counted once it is given up."""
    bundle = Bundle.load(mobilenet_bundle)
    meter = LinkMeter(RateEstimator(initial_bps=500e6))

    async def crossing(pipeline: Pipeline, client: HostClient) -> tuple[float | None, float | None]:
        probing = asyncio.ensure_future(pipeline.probe(client))
        try:
            await until(lambda: (meter.rate_bps or math.inf) < 20e6, within=5.0, what="the probe capping the estimate")
            return meter.overdue(), meter.estimator.rate_bps
        finally:
            probing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probing

    async def go() -> tuple[float | None, float | None]:
        async with DelayRelay((host.host, host.port), delay_ms=0.0, rate_mbit=1.0) as relay:
            address, port = relay.address
            return await _probing(bundle, f"{address}:{port}", crossing, meter)

    bound, estimate = asyncio.run(go())
    assert bound is not None and bound < 20e6 and estimate == pytest.approx(500e6)  # capped, not yet learned
    assert meter.overdue() is None and meter.rate_bps == pytest.approx(500e6)  # the given-up probe holds nothing


async def _probing(
    bundle: Bundle, address: str, probe: Callable[[Pipeline, HostClient], Awaitable[T]], meter: LinkMeter | None = None
) -> T:
    """``probe(pipeline, client)`` with a local-only pipeline connected to the host at ``address``."""
    hosts = HostLink(bundle, address)
    assert await hosts.connect(), hosts.last_error
    try:
        pipeline = Pipeline(DeviceRunner(bundle, threads=1), StaticPolicy(LOCAL, bundle), hosts, meter=meter)
        return await probe(pipeline, hosts.client)
    finally:
        await hosts.close()


@needs_netns
def test_split_follows_a_rate_step_and_every_answer_stays_right(mobilenet_bundle: Path, tmp_path: Path) -> None:
    """The kernel's tbf shapes the link: 20, 0.5, then 20 Mbit/s again (see :func:`_follow_rate_step`)."""
    bundle, runner, reference = _rate_step_setup(mobilenet_bundle, tmp_path)

    async def go(link: EmulatedLink, address: str) -> tuple[list[FrameResult], dict[str, int], int]:
        loop = asyncio.get_running_loop()
        return await _follow_rate_step(bundle, runner, address, lambda rate: loop.run_in_executor(None, link.set_rate, rate))

    with EmulatedLink(rate_mbit=FAST_MBIT) as link, serve_in(link, [bundle.root]) as address:
        _check_rate_step(*asyncio.run(go(link, address)), reference)


def test_split_follows_a_rate_step_through_the_user_space_relay(mobilenet_bundle: Path, tmp_path: Path) -> None:
    """The same without root: a host on 127.0.0.1 behind :class:`DelayRelay`'s token bucket."""
    bundle, runner, reference = _rate_step_setup(mobilenet_bundle, tmp_path)
    hosts = start_host([bundle.root])
    host = next(hosts)

    async def go() -> tuple[list[FrameResult], dict[str, int], int]:
        async with DelayRelay((host.host, host.port), delay_ms=0.0, rate_mbit=FAST_MBIT) as relay:
            address, port = relay.address

            async def set_rate(rate_mbit: float | None) -> None:
                relay.set_rate(rate_mbit)

            return await _follow_rate_step(bundle, runner, f"{address}:{port}", set_rate)

    try:
        _check_rate_step(*asyncio.run(go()), reference)
    finally:
        next(hosts, None)


def _rate_step_setup(mobilenet_bundle: Path, tmp_path: Path) -> tuple[Bundle, DeviceRunner, dict[int, str | None]]:
    """A copy of the bundle with the hand-made calibration, a runner, and the full model's answers."""
    root = tmp_path / "bundle"
    shutil.copytree(mobilenet_bundle, root)
    bundle = Bundle.load(root)
    _calibration(bundle)
    runner = DeviceRunner(bundle, threads=1)
    reference = {r.index: r.label for r in run_stream(runner, "synthetic", LOCAL, frames=RATE_STEP_FRAMES, drop="none")}
    return bundle, runner, reference


class _TablePolicy(AutoPolicy):
    """The table's choice for the rate estimate, without the detour of an overdue upload.

    An upload out past its prediction plus 20 ms runs the next batch here (AutoPolicy): on a
    loaded 2-core machine the host's or this process's scheduling alone makes a fast link's
    31 KB reply that late now and then, and that frame ran locally in the middle of the fast
    phase (one run in four). The detour has its own test (``nothing_waits_behind``); this one
    is about the table following the estimate.
    """

    def choose(
        self, batch: int, rate_bps: float | None, available: Collection[str], link_busy: bool = False,
        deadline_ms: float | None = None, uncapped_bps: float | None = None,
    ) -> Choice:
        return super().choose(batch, rate_bps, available)


async def _follow_rate_step(
    bundle: Bundle, runner: DeviceRunner, address: str, set_rate: Callable[[float | None], Awaitable[object]]
) -> tuple[list[FrameResult], dict[str, int], int]:
    """A table whose boundary for SPLIT vs local is 1.3 Mbit/s, on a ``FAST_MBIT`` link: ~2 s in,
    ``set_rate`` drops the link to 0.5 Mbit/s; once the stream has run locally for a while, it
    brings the fast rate back.
    Returns the results, the indices of the frames at those two moments, and the switches."""
    hosts = HostLink(bundle, address, timeout=10.0)
    assert await hosts.connect(), hosts.last_error
    # No deadline: the host's CPU here is the board's, and deadlines are test_deadline.py's.
    config = PipelineConfig(drop="none", probe_every_s=0.5, request_timeout_s=10.0, deadline_ms=None)
    # The table is made by hand (local 200 ms); refining it with this machine's own times
    # would make local win at every rate (test_policy.py), so it is off here.
    policy = _TablePolicy(calibration_for(bundle), refine_every=None)
    pipeline = Pipeline(runner, policy, hosts, config)
    results: list[FrameResult] = []
    marks: dict[str, int] = {}
    try:
        with Synthetic(fps=30) as source:
            async for r in pipeline.run(source, frames=RATE_STEP_FRAMES):
                results.append(r)
                if len(results) == 60:
                    marks["down"] = r.index
                    await set_rate(0.5)
                if "down" in marks and "up" not in marks and r.split == LOCAL and len(results) > marks["down"] + 30:
                    marks["up"] = r.index  # local for a while: the link comes back
                    await set_rate(FAST_MBIT)
    finally:
        await hosts.close()
    return results, marks, policy.switches


def _check_rate_step(
    results: list[FrameResult], marks: dict[str, int], switches: int, reference: dict[int, str | None]
) -> None:
    """Offloading while fast, local after the drop, offloading again at the end; every frame answered right."""
    results.sort(key=lambda r: r.index)  # a live stream answers each frame as soon as it is known
    assert [r.index for r in results] == list(range(RATE_STEP_FRAMES))  # nothing lost, nothing dropped
    assert {r.index: r.label for r in results} == reference
    splits = [r.split for r in results]
    fast = results[marks["down"] - 10 : marks["down"]]
    assert [r.split for r in fast] == [SPLIT] * 10, [(r.index, r.split, r.error, r.rate_bps) for r in fast]
    assert LOCAL in splits[marks["down"] :]
    assert "up" in marks, "never moved to local after the rate dropped"
    assert splits[-1] == SPLIT, "did not go back to offloading when the link recovered"
    assert switches >= 2
    # Each table choice names its cell: the estimate lies in it, and the two cells meet at the boundary.
    tables = [r for r in results if r.reason.kind == TABLE]
    assert all(r.reason.lo_bps <= r.rate_bps < (r.reason.hi_bps or math.inf) for r in tables), [r.reason for r in tables]
    assert {r.split for r in tables} == {SPLIT, LOCAL}, sorted({(r.split, r.reason.kind) for r in results})
    edges = {r.reason.hi_bps for r in tables if r.split == LOCAL} | {r.reason.lo_bps for r in tables if r.split == SPLIT}
    assert len(edges) == 1 and edges.pop() == pytest.approx(1.32e6, rel=0.07)


class _Recording(Synthetic):
    """A recorded stream (a video file) played at its frame rate: answered in capture order."""

    live = False


@needs_netns
@pytest.mark.parametrize("source_kind", [Synthetic, _Recording])
def test_nothing_waits_behind_an_upload_the_link_slowed_under(
    mobilenet_bundle: Path, tmp_path: Path, source_kind: type[Synthetic]
) -> None:
    """Offloading frames at 10 fps (602 KB of float32, or the 150 KB uint8 crop of a bundle with
    its normalisation folded in), the link drops to where a frame takes 2.4 s (2 or 0.5 Mbit/s). The
    frames already sent take that long; the next ones must not queue behind them in the socket:
    an upload well past its predicted time caps the rate estimate and the board runs them itself
    at once. A live camera gets those answers before the slow remote ones ahead of them; a
    recording gets every answer in capture order."""
    root = tmp_path / "bundle"
    shutil.copytree(mobilenet_bundle, root)
    bundle = Bundle.load(root)
    runner = DeviceRunner(bundle, threads=1)
    sent = runner.payload(OFFLOAD, np.zeros((1, *bundle.manifest.model.input_shape), np.float32))[0].nbytes
    slowed_mbit = 2.0 * sent / 602_112  # a frame's upload takes 2.4 s whatever it carries
    # Offload above 24.7 Mbit/s for 602 KB (6.2 for the 150 KB crop).
    calibration = _calibration(bundle, SplitTimings(OFFLOAD, sent, {}, {1: 5.0}))
    reference = {r.index: r.label for r in run_stream(runner, "synthetic", LOCAL, frames=60, drop="none")}

    async def go(link: EmulatedLink, address: str):
        hosts = HostLink(bundle, address, timeout=10.0)
        assert await hosts.connect(), hosts.last_error
        config = PipelineConfig(request_timeout_s=15.0, deadline_ms=None)  # deadlines: see _follow_rate_step
        pipeline = Pipeline(runner, AutoPolicy(calibration, refine_every=None), hosts, config)
        results, arrival, step = [], [], None
        loop = asyncio.get_running_loop()
        try:
            with source_kind(fps=10) as source:
                async for r in pipeline.run(source, frames=60):
                    results.append(r)
                    arrival.append(r.index)
                    if len(results) == 20:
                        await loop.run_in_executor(None, link.set_rate, slowed_mbit)
                        step = time.monotonic()
        finally:
            await hosts.close()
        return results, arrival, step

    with EmulatedLink() as link, serve_in(link, [root]) as address:
        results, arrival, step = asyncio.run(go(link, address))
    answered = [r for r in results if not r.dropped]
    assert sorted(r.index for r in results) == list(range(60))  # every frame reported once
    assert all(r.label == reference[r.index] for r in answered)
    before = [r for r in answered if r.captured < step]
    after = [r for r in answered if r.captured >= step]
    assert sum(r.split == OFFLOAD for r in before[-10:]) >= 8, [r.split for r in before]  # offloading while fast
    # Nothing is sent behind an upload the board has seen overdue or crossing slowly: no frame after the
    # step that was chosen on a capped rate went remote. How many went before the board saw it depends on
    # the machine (3 with busy processes beside the suite, where this test allowed 2); this does not.
    capped = [r for r in after if r.reason.uncapped_bps is not None]
    assert capped, [r.reason for r in after]
    assert not [r for r in capped if r.where == "remote"], [
        (r.index, r.split, r.reason.kind, r.rate_bps, r.reason.uncapped_bps) for r in after]
    settled = [r for r in after if r.captured >= step + 0.5]
    assert settled and max(r.total_ms for r in settled) < 1000.0, [(r.split, r.total_ms) for r in settled]
    # Capped before any slow reply came (the first one takes 2.5 s): below what the frame's bytes in 0.3 s would need;
    # those frames say so, with the estimate the cap overrode.
    assert any(r.rate_bps < 8 * sent / 0.3 for r in after if r.captured < step + 2.0)
    assert any(r.reason.kind == UPLOAD_CAP and r.reason.uncapped_bps > r.rate_bps for r in after
               if r.captured < step + 2.0), [r.reason for r in after]
    slow = [r.index for r in answered if r.total_ms > 2000.0]  # sent as the link slowed
    assert slow
    if source_kind.live:
        assert arrival.index(slow[0]) > min(arrival.index(r.index) for r in settled)  # not held back
    else:
        assert arrival == list(range(60))


class _Address:
    """``run_stream`` wants host.host and host.port."""

    def __init__(self, address: str) -> None:
        self.host, _, port = address.rpartition(":")
        self.port = int(port)


def _calibration(
    bundle: Bundle, remote: SplitTimings = SplitTimings(SPLIT, 31360, {1: 5.0}, {1: 5.0}),
    local: SplitTimings = SplitTimings(LOCAL, 0, {1: 200.0}, {}),
) -> Calibration:
    """Local: 200 ms against one remote option, by default SPLIT: 5 + 5 ms of compute and
    31,360 bytes, which wins above 8 * 31360 / 0.19 s = 1.32 Mbit/s, local below (DSC Eq. 4
    against T_L)."""
    model = LatencyModel((local, remote), rtt_ms=0.0)
    calibration = Calibration(
        bundle_id=bundle.id, manifest_sha256=manifest_sha256(bundle),
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"), board={}, backend="onnx",
        precision="float32", threads=1, repeats=1, batches=(1,), link=None, model=model,
        table=SplitTable.build(model, (1,)),
    )
    save(calibration, bundle.root / FILENAME)
    return calibration


#: SPLIT against local at 15 ms: SPLIT wins above 8 * 31360 / 5 ms = 50 Mbit/s. Loopback carries
#: tens of Gbit/s; a board timing transfers by its own clock read 2-16 Mbit/s with its CPU busy (issue 14).
LOOPBACK_BOUNDARY_BPS = 50e6


def _loopback_calibration(mobilenet_bundle: Path, tmp_path: Path) -> tuple[Bundle, Calibration]:
    """A copy of the bundle whose table takes SPLIT above :data:`LOOPBACK_BOUNDARY_BPS`, local below."""
    root = tmp_path / "bundle"
    shutil.copytree(mobilenet_bundle, root)
    bundle = Bundle.load(root)
    local = SplitTimings(LOCAL, 0, {1: 15.0}, {})
    split = SplitTimings(SPLIT, 31360, {1: 5.0}, {1: 5.0})
    calibration = _calibration(bundle, split, local=local)
    assert calibration.table.lookup(1, LOOPBACK_BOUNDARY_BPS * 0.9) == LOCAL
    assert calibration.table.lookup(1, LOOPBACK_BOUNDARY_BPS * 1.2) == SPLIT
    return bundle, calibration


def _offloads_as_the_table_says(results: list[FrameResult]) -> None:
    """After the first 10 frames, 95 % take the split and the 5th percentile of the rate the
    policy decided with is above the table's boundary."""
    rates = sorted(r.rate_bps or 0.0 for r in results[10:])
    assert sum(r.split == SPLIT for r in results[10:]) >= 0.95 * (len(results) - 10), rates[:10]
    assert rates[len(rates) // 20] > LOOPBACK_BOUNDARY_BPS, rates[:10]  # the 5th percentile


class _Estimate(LinkMeter):
    """The estimate itself, without the caps of an overdue upload or one crossing slowly.

    With two batches in flight, a reply the host is late with (its process descheduled for
    100 ms by the machine's other work, as a loaded 2-core machine does now and then) makes the
    upload behind it overdue, and the pipeline decides with the bound that sets (4-8 Mbit/s):
    the host's scheduling, not the link's rate nor the estimate. Those caps have their own tests
    (``nothing_waits_behind``, tests/device_runtime/hosts/test_link_meter.py); this one is about
    the estimate a busy board keeps.
    """

    @property
    def rate_bps(self) -> float | None:
        return self.estimator.rate_bps


def test_auto_on_loopback_with_a_busy_board_offloads_as_the_table_says(mobilenet_bundle: Path, tmp_path: Path) -> None:
    """``split-host`` on this machine, the head run back to back (the board's CPU saturated by
    it, as the issue found it): the estimate stays well above the table's boundary, so the
    table's split is taken for the frames after the first probe, where a board timing its
    transfers by its own clock read 2-16 Mbit/s and ran 87 % of them locally. A stall of the
    board's own (its write of a request late by 12 ms) still reads slow now and then: the fast
    readings after it must bring the estimate back (the next test feeds it those figures)."""
    bundle, calibration = _loopback_calibration(mobilenet_bundle, tmp_path)
    runner = DeviceRunner(bundle, threads=1)

    async def go(address: str) -> list[FrameResult]:
        hosts = HostLink(bundle, address, timeout=10.0)
        assert await hosts.connect(), hosts.last_error
        config = PipelineConfig(drop="none", request_timeout_s=10.0, deadline_ms=None)
        pipeline = Pipeline(runner, _TablePolicy(calibration, refine_every=None), hosts, config, _Estimate())
        try:
            with Synthetic(fps=0) as source:  # as fast as the board goes: its CPU is never idle
                return [r async for r in pipeline.run(source, frames=120)]
        finally:
            await hosts.close()

    with _loopback_host(bundle.root) as address:
        results = asyncio.run(go(address))
    results.sort(key=lambda r: r.index)
    assert len(results) == 120 and not any(r.error for r in results)
    _offloads_as_the_table_says(results)


#: What a busy board read of a 31,360-byte upload on loopback (issue 28's runs, two busy processes
#: beside): the look right after the write found it acknowledged 0.16 ms after the send, the reply
#: 10 ms later with 2 ms of the host's; one request in four, the board's write itself was late by
#: 11.7 ms (its CPU taken), and the look with it: a reading of 21 Mbit/s, three units on the wire.
FAST_DONE_S, STALLED_DONE_S, ROUND_TRIP_S, HOST_MS = 0.00016, 0.0117, 0.012, 2.0


def test_a_busy_boards_stalls_do_not_hold_the_estimate_below_the_table(mobilenet_bundle: Path, tmp_path: Path) -> None:
    """The loopback run's figures fed to the meter on a clock the test moves: 120 frames, every
    4th one's upload stalled by the board, starting with one (CI's run: the estimate sat at
    30.8 Mbit/s frame after frame, 62 of 110 frames took the split). Weighed by their time on the
    wire alone, the fast readings after a stall (0.2 ms, 4 % of a unit) moved the estimate ~1 %
    each; a reading faster than the estimate proves it low, and weighs a unit."""
    _, calibration = _loopback_calibration(mobilenet_bundle, tmp_path)
    clock = ManualClock()
    meter = LinkMeter(RateEstimator(clock=clock), clock=clock)
    policy = _TablePolicy(calibration, refine_every=None)
    meter.observe_probe(0, 0.4)  # the first probe's, as the run read them: a bare ping, then 1 MB stamped
    meter.observe_probe(1_048_576, 0.94, UploadTiming(done_s=0.00054, min_rtt_s=7e-6, stamped=True))
    results = []
    for index in range(120):
        rate = meter.rate_bps
        split = policy.choose(1, rate, (LOCAL, SPLIT)).split
        results.append(FrameResult(index=index, name=f"frame {index}", label=None, probability=None, split=split, rate_bps=rate))
        if split == SPLIT:
            ticket, sent = meter.sending(31360), clock()
            done_s = STALLED_DONE_S if index % 4 == 0 else FAST_DONE_S
            clock.now += done_s + ROUND_TRIP_S
            upload = UploadTiming(done_s=done_s, min_rtt_s=3e-6)
            meter.settled(ticket)
            meter.observe_reply(31360, InferResult(np.zeros(1), HOST_MS, (clock() - sent) * 1000.0, 0.0, sent=sent,
                                                   received=clock(), upload=upload))
        clock.now += 0.05  # the next frame's head
    _offloads_as_the_table_says(results)


@contextlib.contextmanager
def _loopback_host(bundle_root: Path) -> Iterator[str]:
    """``split-host serve`` in a process of its own on 127.0.0.1 (not a thread of this one:
    the board's GIL is the board's)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "host_runtime.cli", "serve", str(bundle_root), "--interface", "127.0.0.1",
         "--port", str(port), "--no-zeroconf", "--workers", "1", "--threads", "1"],
        cwd=Path(__file__).resolve().parents[3], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    with running_host(process, "127.0.0.1", port) as address:
        yield address
