"""Measured times: the median of repeats, and running medians that refine the model's head times."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from calibration import CalibrationError, RunningTimes, measure_ms
from calibration.timing import MIN_SAMPLES, WINDOW
from splitedge.words import LOCAL
from tests.calibration.models import corners


class ManualClock:
    """A clock only the test moves (seconds): ``sleep`` advances it, and so do the calls it times."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _taking(clock: ManualClock, durations: list[float], starts: list[float]) -> Callable[[], None]:
    """A call that starts at ``clock``'s time and takes the next of ``durations`` on it."""
    left = iter(durations)

    def call() -> None:
        starts.append(clock())
        clock.now += next(left)

    return call


def test_measure_ms_warms_up_then_takes_the_median() -> None:
    clock, starts = ManualClock(), []
    # 2 warm-up calls (slow: cold caches), then one 50 ms stall among 2 ms runs
    ms = measure_ms(_taking(clock, [0.5, 0.5, 0.002, 0.002, 0.05], starts), repeats=3, warmup=2, clock=clock,
                    sleep=clock.sleep)
    assert len(starts) == 5
    assert ms == pytest.approx(2.0)  # neither the warm-up nor the stall moves the median


def test_measure_ms_paces_the_runs_as_a_camera_would() -> None:
    clock, starts = ManualClock(), []
    durations = [0.0] * 3 + [0.01, 0.25, 0.01, 0.01]  # warm-up, then one run longer than a frame
    ms = measure_ms(_taking(clock, durations, starts), repeats=4, warmup=3, fps=10, clock=clock, sleep=clock.sleep)
    # 100 ms apart, the timed ones too; after the 250 ms run the next starts at once.
    assert np.diff(starts) == pytest.approx([0.1, 0.1, 0.1, 0.1, 0.25, 0.1])
    assert ms == pytest.approx(10.0)


def test_measure_ms_back_to_back_by_default_and_refuses_a_negative_rate() -> None:
    clock, starts = ManualClock(), []
    measure_ms(_taking(clock, [0.003] * 5, starts), repeats=5, warmup=0, clock=clock, sleep=clock.sleep)
    assert np.diff(starts) == pytest.approx([0.003] * 4) and clock.slept == []
    with pytest.raises(CalibrationError, match=r"fps: expected a finite number >= 0, got -1"):
        measure_ms(lambda: None, repeats=1, fps=-1)


def test_running_median_over_a_bounded_window() -> None:
    times = RunningTimes()
    assert times.median("mid", 1) is None
    for _ in range(WINDOW):
        times.observe("mid", 1, 100.0)
    for _ in range(WINDOW):
        times.observe("mid", 1, 10.0)  # the board cooled down: the old samples leave the window
    assert times.median("mid", 1) == 10.0


def test_apply_replaces_head_times_only_with_enough_samples() -> None:
    model = corners()
    times = RunningTimes()
    for _ in range(MIN_SAMPLES - 1):
        times.observe(LOCAL, 1, 80.0)  # throttled board
    assert times.apply(model) == model
    times.observe(LOCAL, 1, 80.0)
    for _ in range(MIN_SAMPLES):
        times.observe("mid", 4, 30.0)  # a batch size calibration did not measure
        times.observe("unknown-split", 1, 1.0)
    refined = times.apply(model)
    assert refined.timings(LOCAL).head_ms == {1: 80.0}
    assert refined.timings("mid").head_ms == {1: 10.0, 4: 30.0}
    assert model.timings(LOCAL).head_ms == {1: 50.0}  # the original is untouched


def test_a_slower_head_at_run_time_moves_the_eq6_optimum() -> None:
    # At 2e7 mid takes 10 + 8 + 3 + 5 = 26 < LOCAL's 50; with its head at 40 ms it takes 56 > 50.
    model = corners()
    times = RunningTimes()
    for _ in range(MIN_SAMPLES):
        times.observe("mid", 1, 40.0)
    assert (model.best(1, 2e7), times.apply(model).best(1, 2e7)) == ("mid", LOCAL)


def test_negative_times_are_refused() -> None:
    with pytest.raises(ValueError, match="ms: expected a finite number >= 0"):
        RunningTimes().observe("mid", 1, -1.0)
