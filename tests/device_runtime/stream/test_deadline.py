"""Each frame's deadline comes from its budget (the camera's frame interval), not from the
connection's timeout: a host whose queue would make a frame late says so, and the frame is
answered here instead, nothing lost."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

import host_runtime._batcher
from device_runtime import cli as device_cli
from device_runtime.bundle import LOCAL, Bundle
from device_runtime.engine._runner import DeviceRunner
from device_runtime.hosts._host_link import HostLink
from device_runtime.stream._camera import FrameSource, Synthetic, open_source
from device_runtime.stream._pipeline import Pipeline, PipelineConfig
from device_runtime.stream._policy import StaticPolicy
from device_runtime.stream._results import FrameResult
from tests.conftest import TEST_SPLITS, RunningHost, run_stream, start_host

SPLIT = TEST_SPLITS[-1]


def budgets_ms(host: RunningHost) -> list[float]:
    """Record, on the host, the budget (ms from its arrival; inf for none) of every infer request admitted or refused."""
    seen: list[float] = []
    submit = host.server.batcher.submit

    def recording(key, backend, tensor, received: float, deadline: float | None, done, *rest):
        seen.append(float("inf") if deadline is None else (deadline - received) * 1000.0)
        return submit(key, backend, tensor, received, deadline, done, *rest)

    host.server.batcher.submit = recording
    return seen


@pytest.mark.parametrize(
    ("config", "source", "expected_ms"),
    [
        (PipelineConfig(drop="none"), lambda: Synthetic(fps=20), 50.0),  # the camera's frame interval
        (PipelineConfig(drop="none", deadline_ms=80.0), lambda: Synthetic(fps=20), 80.0),  # as asked
        (PipelineConfig(drop="none"), lambda: open_source("synthetic:0"), float("inf")),  # no pace: none
        (PipelineConfig(drop="none", deadline_ms=None), lambda: Synthetic(fps=20), float("inf")),  # none
    ],
)
def test_a_frame_carries_the_deadline_of_its_budget_not_the_timeout(
    mobilenet_bundle: Path, host: RunningHost, config: PipelineConfig, source: Callable[[], FrameSource],
    expected_ms: float,
) -> None:
    seen = budgets_ms(host)
    bundle = Bundle.load(mobilenet_bundle)
    results, _ = _stream(bundle, host, dataclasses.replace(config, request_timeout_s=7.0), source, frames=4)
    assert all(r.where == "remote" for r in results), [r.error for r in results]
    assert seen == pytest.approx([expected_ms] * 4)


def test_split_device_run_keeps_its_timeout_for_the_connection(
    mobilenet_bundle: Path, host: RunningHost, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--timeout 7`` bounds finding the host and its silence; a 20 frames/s camera's frames carry 50 ms."""
    seen = budgets_ms(host)
    assert device_cli.main(["run", str(mobilenet_bundle), "--camera", "synthetic:20", "--host", f"{host.host}:{host.port}",
                            "--split", SPLIT, "--frames", "3", "--drop", "none", "--timeout", "7", "--verbose"]) == 0
    assert capsys.readouterr().out.count(f"split={SPLIT}") == 3
    assert seen == pytest.approx([50.0] * 3)


def test_split_device_run_deadline_ms_0_sends_no_deadline(
    mobilenet_bundle: Path, host: RunningHost, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--deadline-ms 0`` is none end to end: a 20 frames/s camera's frames reach the host with no
    ``deadline_ms`` at all (a 0 there would be a budget spent, each frame refused), and all are answered there."""
    seen = budgets_ms(host)
    assert device_cli.main(["run", str(mobilenet_bundle), "--camera", "synthetic:20", "--host", f"{host.host}:{host.port}",
                            "--split", SPLIT, "--frames", "3", "--drop", "none", "--deadline-ms", "0", "--verbose"]) == 0
    assert capsys.readouterr().out.count(f"split={SPLIT}") == 3
    assert seen == [float("inf")] * 3
    assert device_cli.main(["run", str(mobilenet_bundle), "--camera", "synthetic:20", "--host", f"{host.host}:{host.port}",
                            "--split", SPLIT, "--frames", "2", "--drop", "none", "--deadline-ms", "120"]) == 0
    assert seen[3:] == pytest.approx([120.0] * 2)


@pytest.fixture
def slow_host(mobilenet_bundle: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunningHost]:
    """One worker whose every tail run takes 300 ms: a host whose queue makes frames late."""
    run_batch = host_runtime._batcher.run_batch

    def slow(*args, **kwargs):
        time.sleep(0.3)
        return run_batch(*args, **kwargs)

    monkeypatch.setattr(host_runtime._batcher, "run_batch", slow)
    yield from start_host([mobilenet_bundle], workers=1)


def test_a_host_that_would_answer_late_says_so_and_the_frame_runs_here(
    mobilenet_bundle: Path, slow_host: RunningHost
) -> None:
    """At 20 frames/s (a 50 ms budget): the first frame is admitted (the host has no estimate
    yet) and answered late; the one queued behind it expires in the queue, and once the host
    knows its 300 ms the next ones are refused on arrival. Each of those is answered here with
    the full model, the same answer, and the host is not taken for lost."""
    bundle = Bundle.load(mobilenet_bundle)
    runner = DeviceRunner(bundle, threads=1)
    reference = {r.index: r.label for r in run_stream(runner, "synthetic", LOCAL, frames=8, drop="none")}
    results, losses = _stream(bundle, slow_host, PipelineConfig(drop="none"), lambda: Synthetic(fps=20), frames=8,
                              runner=runner)
    results.sort(key=lambda r: r.index)
    assert [r.index for r in results] == list(range(8))  # nothing lost
    assert {r.index: r.label for r in results} == reference
    late = [r for r in results if r.error]
    assert len(late) >= 6, [(r.index, r.where, r.error) for r in results]
    assert all("deadline_exceeded" in r.error and r.where == "local" for r in late), [r.error for r in late]
    assert losses == 0


class _SlowBoard(StaticPolicy):
    """The fixed split, on a board whose own full model would take ``local_ms``."""

    def __init__(self, bundle: Bundle, local_ms: float) -> None:
        super().__init__(SPLIT, bundle)
        self.local_ms = local_ms

    def alternative(self, batch: int) -> tuple[str, float] | None:
        return LOCAL, self.local_ms * batch


def test_a_host_slower_than_the_deadline_still_answers_a_board_that_would_be_slower_still(
    mobilenet_bundle: Path, slow_host: RunningHost
) -> None:
    """The same 300 ms host and 50 ms budget, from a board whose full model would take 5 s: every
    request carries that alternative, so the host answers each one late rather than refusing it
    and sending the board to an answer 16 times later (issue 43); nothing is refused or lost."""
    bundle = Bundle.load(mobilenet_bundle)
    results, losses = _stream(bundle, slow_host, PipelineConfig(drop="none"), lambda: Synthetic(fps=20), frames=4,
                              policy=_SlowBoard(bundle, 5000.0))
    assert sorted(r.index for r in results) == list(range(4))
    assert [(r.where, r.error) for r in results] == [("remote", None)] * 4
    assert losses == 0


def _stream(bundle: Bundle, host: RunningHost, config: PipelineConfig, source: Callable[[], FrameSource], frames: int,
            runner: DeviceRunner | None = None, policy: StaticPolicy | None = None) -> tuple[list[FrameResult], int]:
    """The results of a pipeline with the fixed split ``SPLIT`` (or ``policy``) against ``host``, and the host
    link's losses."""
    runner = runner or DeviceRunner(bundle, threads=1)

    async def go():
        hosts = HostLink(bundle, f"{host.host}:{host.port}", timeout=7.0)
        assert await hosts.connect(), hosts.last_error
        try:
            pipeline = Pipeline(runner, policy or StaticPolicy(SPLIT, bundle), hosts, config)
            with source() as frames_source:
                return [r async for r in pipeline.run(frames_source, frames=frames)], hosts.losses
        finally:
            await hosts.close()

    return asyncio.run(go())
