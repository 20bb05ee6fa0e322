"""Measured times: the median of repeats, round robin over options with their spread, and running
medians that refine the model's head times."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from calibration import CalibrationError, RunningTimes, Spread, measure_ms, measure_round_robin
from calibration._timing import FRESH, MIN_SAMPLES, WIDE_MIN_MS, WIDE_RATIO, WINDOW, widest
from splitedge._words import LOCAL, OFFLOAD
from tests.calibration.models import corners, preprocessed


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


class Board:
    """Options that take a fixed time each on a clock the test drives, except during a slow spell
    (another program on the board) when every run takes ``slowdown`` times as long; records the
    order of the calls and which of them the spell hit."""

    def __init__(self, clock: ManualClock, durations: dict[str, float], spell: tuple[float, float] = (0.0, 0.0),
                 slowdown: float = 4.0) -> None:
        self.clock, self.durations, self.spell, self.slowdown = clock, durations, spell, slowdown
        self.order: list[str] = []
        self.slowed: list[str] = []

    def calls(self) -> dict[str, Callable[[], None]]:
        return {name: (lambda name=name: self.run(name)) for name in self.durations}

    def run(self, name: str) -> None:
        self.order.append(name)
        slow = self.spell[0] <= self.clock() < self.spell[1]
        if slow:
            self.slowed.append(name)
        self.clock.now += self.durations[name] * (self.slowdown if slow else 1.0)


def test_round_robin_cycles_through_every_option_each_repeat() -> None:
    clock = ManualClock()
    board = Board(clock, {"a": 0.001, "b": 0.002, "c": 0.003})
    cycles: list[int] = []
    samples = measure_round_robin(board.calls(), repeats=3, warmup=1, clock=clock, sleep=clock.sleep,
                                  on_cycle=cycles.append)
    # One warm-up cycle, then three timed ones; each cycle starts one option later than the last,
    # so no option always runs right after the same other one.
    assert board.order == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]
    assert cycles == [1, 2, 3]
    assert samples == {"a": pytest.approx([1.0] * 3), "b": pytest.approx([2.0] * 3), "c": pytest.approx([3.0] * 3)}


def test_a_slow_spell_lands_on_every_option_not_on_one() -> None:
    options = {f"split{i}": 0.010 for i in range(4)}  # four options of 10 ms, 20 repeats: 0.8 s in all
    spell = (100.2, 100.7)  # half a second of a busy board, in the middle of the run
    clock = ManualClock()
    board = Board(clock, options, spell)
    samples = measure_round_robin(board.calls(), repeats=20, warmup=0, clock=clock, sleep=clock.sleep)
    hits = {name: board.slowed.count(name) for name in options}
    assert max(hits.values()) - min(hits.values()) <= 1 and min(hits.values()) >= 1  # shared out
    for name in options:
        spread = Spread.of(samples[name])
        assert spread.p50 == pytest.approx(10.0)  # every median as on a quiet board
        assert spread.p90 > spread.p10  # and the spell is visible in every spread
    # Timed one option after the other (20 repeats each), the same spell lands on one option and
    # makes it look 4x slower than it is: the table would never choose it.
    clock = ManualClock()
    board = Board(clock, options, spell)
    medians = {name: measure_ms(call, 20, warmup=0, clock=clock, sleep=clock.sleep)
               for name, call in board.calls().items()}
    assert set(board.slowed) == {"split1"}
    assert medians["split1"] == pytest.approx(40.0) and medians["split0"] == pytest.approx(10.0)


def test_round_robin_paces_every_call_as_a_camera_would() -> None:
    clock, starts = ManualClock(), []
    calls = {name: (lambda: (starts.append(clock()), setattr(clock, "now", clock.now + 0.01))) for name in "ab"}
    measure_round_robin(calls, repeats=2, warmup=1, fps=10, clock=clock, sleep=clock.sleep)
    assert np.diff(starts) == pytest.approx([0.1] * 5)


def test_round_robin_refuses_nothing_to_time() -> None:
    with pytest.raises(CalibrationError, match="nothing to time"):
        measure_round_robin({}, repeats=3)


def test_spread_is_p10_median_p90() -> None:
    spread = Spread.of([float(ms) for ms in range(1, 12)])  # 1..11 ms
    assert (spread.p10, spread.p50, spread.p90) == pytest.approx((2.0, 6.0, 10.0))
    assert spread.ratio == pytest.approx(5.0)
    assert Spread.of([3.0]) == Spread(3.0, 3.0, 3.0) and Spread.of([3.0]).ratio == 1.0
    two = Spread.of([2.0, 4.0])
    assert (two.p10, two.p50, two.p90) == pytest.approx((2.2, 3.0, 3.8))
    with pytest.raises(CalibrationError, match="p10 <= p50 <= p90"):
        Spread(5.0, 4.0, 6.0)


def test_wide_is_a_ratio_and_more_than_a_millisecond() -> None:
    assert WIDE_RATIO == 1.5 and WIDE_MIN_MS == 1.0
    assert not Spread(10.0, 11.0, 14.9).wide()  # 1.49x
    assert Spread(10.0, 11.0, 15.1).wide()  # 1.51x
    assert not Spread(0.2, 0.3, 0.9).wide()  # 4.5x, but 0.7 ms: timer and scheduler jitter
    spreads = {"a": Spread(10.0, 11.0, 12.0), "b": Spread(10.0, 12.0, 30.0), "c": Spread(10.0, 12.0, 20.0)}
    assert widest(spreads) == ("b", spreads["b"])
    assert widest({"a": spreads["a"]}) is None


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
    # mid at B=4 is calibrated at 40 (B=1's 10, linear); its 8 runs at 30 are the board's last
    # runs of a split the model has (unknown-split's are not), so the board runs at 0.75 of its
    # calibrated time and mid's B=1, not run, is 10 * 0.75
    assert refined.timings("mid").head_ms == {1: 7.5, 4: 30.0}
    assert model.timings(LOCAL).head_ms == {1: 50.0}  # the original is untouched


def test_an_option_not_in_use_follows_the_board_it_runs_on() -> None:
    """The board runs mid at twice its calibrated time (a neighbour took half its CPU): LOCAL, not
    run since calibration, is predicted at twice its calibrated 50 ms too, and offload (no head)
    is as it was. At 2e7 mid then takes 20 + 8 + 3 + 5 = 36 against LOCAL's 100: mid stays best,
    where refining mid alone (LOCAL kept at 50) would have fled to a LOCAL twice as slow."""
    model = corners()
    times = RunningTimes()
    for _ in range(MIN_SAMPLES):
        times.observe("mid", 1, 20.0)
    refined = times.apply(model)
    assert times.factor(model) == 2.0
    assert refined.timings(LOCAL).head_ms == {1: 100.0}
    assert refined.timings(OFFLOAD).head_ms == {}
    assert refined.best(1, 2e7) == "mid"


def test_a_head_time_measured_long_ago_gives_way_to_the_board_s_speed_now() -> None:
    """LOCAL ran at 34 ms early on; then the board slowed to 3x and ran mid FRESH times: LOCAL's
    old median no longer says how it runs, and is predicted at 50 * 3 instead."""
    model = corners()
    times = RunningTimes()
    for _ in range(MIN_SAMPLES):
        times.observe(LOCAL, 1, 34.0)
    assert times.apply(model).timings(LOCAL).head_ms == {1: 34.0}
    for _ in range(FRESH):
        times.observe("mid", 1, 30.0)
    assert not times.fresh(LOCAL, 1)
    assert times.apply(model).timings(LOCAL).head_ms == {1: 150.0}
    assert times.apply(model).timings("mid").head_ms == {1: 30.0}


def test_preprocessing_tells_the_board_s_speed_where_no_head_runs() -> None:
    """A board offloading whole frames runs no head, but preprocesses every frame: calibrated at 4 ms,
    run at 8, the board runs at twice its calibrated time, and LOCAL is predicted at 100 ms."""
    model = preprocessed(corners(), 4.0)
    times = RunningTimes()
    for _ in range(MIN_SAMPLES):
        times.observe_preprocess(8.0)
    assert times.factor(model) == 2.0
    assert times.apply(model).timings(LOCAL).head_ms == {1: 100.0}
    assert times.factor(corners()) is None  # a calibration that did not time preprocessing: no ratio


def test_runs_beside_the_board_s_own_uploads_time_their_option_not_the_board() -> None:
    """mid's head and the frames' preprocessing ran at 2x while its uploads were in flight (the
    kernel sending them on the board's CPU): mid's own median says so, but the board's speed does
    not move, and LOCAL keeps its 50 ms. Run so without uploads, they would have moved it."""
    model = preprocessed(corners(), 4.0)
    times = RunningTimes()
    for _ in range(MIN_SAMPLES):
        times.observe("mid", 1, 20.0, sending=True)
        times.observe_preprocess(8.0, sending=True)
    assert times.factor(model) is None
    refined = times.apply(model)
    assert (refined.timings("mid").head_ms, refined.timings(LOCAL).head_ms) == ({1: 20.0}, {1: 50.0})
    for _ in range(MIN_SAMPLES):
        times.observe_preprocess(8.0)
    assert times.factor(model) == 2.0


def test_the_host_s_replies_keep_every_tail_current() -> None:
    """The host answers mid's tail in 30 ms, calibrated at 3: it runs at 10x, offload's tail too
    (2 -> 20). At 2e7 mid then takes 10 + 8 + 30 + 5 = 53 against LOCAL's 50: LOCAL."""
    model = corners()
    times = RunningTimes()
    for _ in range(MIN_SAMPLES):
        times.observe_tail("mid", 1, 30.0)
    assert times.host_factor(model) == 10.0
    refined = times.apply(model)
    assert (refined.timings("mid").tail_ms, refined.timings(OFFLOAD).tail_ms) == ({1: 30.0}, {1: 20.0})
    assert refined.timings(LOCAL).head_ms == {1: 50.0}  # the board's own speed is another matter
    assert (model.best(1, 2e7), refined.best(1, 2e7)) == ("mid", LOCAL)


def test_a_slower_head_at_run_time_moves_the_eq6_optimum() -> None:
    # At 2e7 mid takes 10 + 8 + 3 + 5 = 26 < LOCAL's 50. LOCAL measured as calibrated while mid's
    # head takes 40 ms (something slows mid alone): mid takes 56 > 50.
    model = corners()
    times = RunningTimes()
    for _ in range(MIN_SAMPLES):
        times.observe("mid", 1, 40.0)
        times.observe(LOCAL, 1, 50.0)
    assert (model.best(1, 2e7), times.apply(model).best(1, 2e7)) == ("mid", LOCAL)


def test_negative_times_are_refused() -> None:
    with pytest.raises(ValueError, match="ms: expected a finite number >= 0"):
        RunningTimes().observe("mid", 1, -1.0)
