"""Measured times: the median of repeats, and running medians that refine the model's head times."""

from __future__ import annotations

import time

import numpy as np
import pytest

from calibration import CalibrationError, RunningTimes, measure_ms
from calibration.timing import MIN_SAMPLES, WINDOW
from splitedge.words import LOCAL
from tests.calibration.models import corners


def test_measure_ms_warms_up_then_takes_the_median() -> None:
    calls = []
    delays = iter([0.0] * 2 + [0.002, 0.002, 0.05])  # 2 warm-up calls, then one 50 ms stall

    def fn() -> None:
        calls.append(1)
        time.sleep(next(delays))

    ms = measure_ms(fn, repeats=3, warmup=2)
    assert len(calls) == 5
    assert 2.0 <= ms < 40.0  # the stall does not move the median


def test_measure_ms_paces_the_runs_as_a_camera_would() -> None:
    starts: list[float] = []
    durations = iter([0.0] * 3 + [0.0, 0.25, 0.0, 0.0])  # warm-up, then one run longer than a frame

    def fn() -> None:
        starts.append(time.perf_counter())
        time.sleep(next(durations))

    measure_ms(fn, repeats=4, warmup=3, fps=10)
    gaps = np.diff(starts)
    # 100 ms apart, the timed ones too; after the 250 ms run the next starts at once.
    assert all(0.099 <= g < 0.16 for i, g in enumerate(gaps) if i != 4), gaps
    assert 0.25 <= gaps[4] < 0.31, gaps


def test_measure_ms_back_to_back_by_default_and_refuses_a_negative_rate() -> None:
    starts: list[float] = []
    measure_ms(lambda: starts.append(time.perf_counter()), repeats=5, warmup=0)
    assert max(np.diff(starts)) < 0.01
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
