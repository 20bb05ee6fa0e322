"""Split policies: fixed splits fall back to local without a host; auto refines its table with measured times;
every choice says why (its :class:`Reason`)."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timezone

import pytest

from calibration import LatencyModel, SplitTable, SplitTimings, Spread
from calibration.calibration_file import Calibration, Preprocessing
from device_runtime.bundle import LOCAL, OFFLOAD
from device_runtime.stream._policy import REFINE_MIN_S, AutoPolicy, HeadTimes, StaticPolicy
from device_runtime.stream._reason import (
    FALLBACK, FIXED, HOLD, NO_HOST, NO_RATE, REFINED, TABLE, UPLOAD_CAP, Choice, Reason,
)
from splitedge.errors import BundleError

CUT = "cut"


class _Manifest:
    def option(self, option_id: str):
        if option_id != CUT:
            raise BundleError(f"unknown split {option_id!r}")


class _Bundle:
    manifest = _Manifest()


def _calibration(local_ms: float, tail_ms: float = 5.0) -> Calibration:
    """Local at ``local_ms`` against CUT: 10,000 bytes, a 5 ms head and a ``tail_ms`` tail."""
    model = LatencyModel((SplitTimings(LOCAL, 0, {1: local_ms}, {}), SplitTimings(CUT, 10_000, {1: 5.0}, {1: tail_ms})), 0.0)
    return Calibration(
        bundle_id="b", manifest_sha256="0" * 64, created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        board={}, backend="onnx", precision="float32", threads=1, repeats=1, batches=(1,), link=None, model=model,
        table=SplitTable.build(model, (1,)),
    )


def test_static_policy_runs_local_while_no_host_has_its_split() -> None:
    policy = StaticPolicy(CUT, _Bundle())
    assert policy.choose(1, 1e7, {LOCAL, CUT}) == Choice(CUT, Reason(FIXED))
    assert policy.choose(1, 1e7, {LOCAL}) == Choice(LOCAL, Reason(NO_HOST, batch=1, wanted=CUT))
    assert StaticPolicy(OFFLOAD, _Bundle()).split == OFFLOAD  # not a split of the bundle, still an option
    with pytest.raises(BundleError, match="unknown split 'nope'"):
        StaticPolicy("nope", _Bundle())


def test_auto_policy_refines_the_table_with_the_times_it_measures() -> None:
    """Calibrated local at 200 ms, CUT wins at 100 Mbit/s (5 + 0.8 + 10 = 15.8 ms); the board then
    measures local at 8 ms: the table is rebuilt and says local (CUT's head at the board's speed
    now, 5 * 8 / 200 = 0.2 ms, still leaves it 11 ms), and the reason says the refined table chose
    it against the calibrated one's CUT."""
    policy = AutoPolicy(_calibration(200.0, tail_ms=10.0), min_hold=1, refine_every=16)
    everything = {LOCAL, CUT}
    assert policy.choose(1, 1e8, everything).reason.kind == TABLE
    for _ in range(16):
        policy.observe_head(LOCAL, 1, 8.0)
    choice = policy.choose(1, 1e8, everything)
    assert (choice.split, choice.reason.kind, choice.reason.calibrated) == (LOCAL, REFINED, CUT)
    assert policy.switches == 1


def test_auto_policy_retimes_the_option_it_is_not_using_within_a_few_frames() -> None:
    """Calibrated local at 30 ms, CUT at 5 + 8 + 5 = 18 ms at 10 Mbit/s: CUT. The run's heads take a
    quarter of their calibrated time (calibration timed them under contention, issue 43): CUT's
    head at 1.25 ms says the board runs at 0.25, so local, never run, is predicted at 7.5 ms and
    wins against CUT's 14.25; the table is rebuilt once the board's speed has MIN_SAMPLES head runs
    behind it, not after refine_every (32) of them."""
    policy = AutoPolicy(_calibration(30.0), min_hold=1, refine_every=32)
    everything = {LOCAL, CUT}
    assert policy.choose(1, 1e7, everything).split == CUT
    for _ in range(8):
        policy.observe_head(CUT, 1, 1.25)
    choice = policy.choose(1, 1e7, everything)
    assert (choice.split, choice.reason.kind, choice.reason.calibrated) == (LOCAL, REFINED, CUT)
    assert policy.head_times.head_ms[LOCAL] == {1: 7.5}


def test_preprocessing_alone_keeps_the_board_s_speed_current() -> None:
    """With 5 ms of preprocessing, local takes 35 ms and CUT 5 + 5 + 8 + 25 = 43 at 10 Mbit/s: local.
    No head runs (a board offloading whole frames); its frames' preprocessing takes 20 ms: the board
    runs at 4x, local at 125 against CUT's 58: CUT. Back at 5 ms, local again, once REFINE_MIN_S
    has passed since the last rebuild (a rebuild costs a slow board's CPU: one a second at most)."""
    base = _calibration(30.0, tail_ms=25.0)
    calibration = dataclasses.replace(base, model=dataclasses.replace(base.model, preprocess_ms=5.0),
                                      preprocess=Preprocessing("fast", 640, 480, Spread.of([5.0])))
    now = [0.0]
    policy = AutoPolicy(calibration, min_hold=1, clock=lambda: now[0])
    everything = {LOCAL, CUT}
    assert policy.choose(1, 1e7, everything).split == LOCAL
    for _ in range(8):
        policy.observe_preprocess(20.0)
    assert policy.choose(1, 1e7, everything).split == CUT
    for _ in range(16):
        policy.observe_preprocess(5.0)
    assert policy.choose(1, 1e7, everything).split == CUT  # rebuilt less than REFINE_MIN_S ago: not yet
    now[0] += REFINE_MIN_S
    policy.observe_preprocess(5.0)
    assert policy.choose(1, 1e7, everything).split == LOCAL


def test_a_host_slower_than_calibrated_moves_the_choice_back_to_the_board() -> None:
    """CUT at 5 + 0.8 + 5 = 10.8 ms at 100 Mbit/s against local's 30: CUT. The host's replies say its
    tail takes 50 ms (a host shared with others): CUT at 55.8, and local wins (refined); the head
    times it decided with are the calibrated ones, the tail's the host's now."""
    policy = AutoPolicy(_calibration(30.0), min_hold=1)
    everything = {LOCAL, CUT}
    assert policy.choose(1, 1e8, everything).split == CUT
    for _ in range(8):
        policy.observe_tail(CUT, 1, 50.0)
    choice = policy.choose(1, 1e8, everything)
    assert (choice.split, choice.reason.kind) == (LOCAL, REFINED)
    assert policy.head_times.tail_ms[CUT] == {1: 50.0} and policy.head_times.head_ms[CUT] == {1: 5.0}
    assert HeadTimes.from_dict(json.loads(json.dumps(policy.head_times.as_dict())), "record") == policy.head_times


def test_the_board_s_alternative_is_its_full_model_at_the_time_it_decides_with() -> None:
    """What a request tells the host the board would do otherwise: local at its calibrated 30 ms,
    then, with the board measured at a quarter of its calibrated speed, at 7.5 ms; a fixed split
    has no measured alternative."""
    policy = AutoPolicy(_calibration(30.0), min_hold=1)
    assert policy.alternative(1) == (LOCAL, 30.0)
    for _ in range(8):
        policy.observe_head(CUT, 1, 1.25)
    assert policy.alternative(1) == (LOCAL, 7.5)
    assert StaticPolicy(CUT, _Bundle()).alternative(1) is None


def test_auto_policy_paced_by_a_camera_it_cannot_keep_up_with_offloads_more() -> None:
    """Local at 30 ms against CUT's 5 + 0.8 + 25 = 30.8 at 100 Mbit/s: local by latency. From a camera
    26 ms apart local's board is always busy (a frame waits 13 ms for it) and answers 26 of every
    30 ms (cost (30 + 13) * 30 / 26 = 49.6); CUT's board (5 ms) and host (25 ms) keep up (cost 30.8):
    CUT answers every frame, and sooner, and wins. Unpaced again, local is back ahead by less than
    the hysteresis's margin."""
    policy = AutoPolicy(_calibration(30.0, tail_ms=25.0), min_hold=1)
    everything = {LOCAL, CUT}
    assert policy.choose(1, 1e8, everything).split == LOCAL
    policy.pace(26.0)
    assert policy.choose(1, 1e8, everything).split == CUT
    policy.pace(None)
    choice = policy.choose(1, 1e8, everything)
    assert (choice.split, choice.reason.kind, choice.reason.wanted) == (CUT, HOLD, LOCAL)


def test_auto_policy_without_a_host_runs_local_at_once() -> None:
    policy = AutoPolicy(_calibration(200.0), min_hold=5)
    assert policy.choose(1, 1e8, {LOCAL, CUT}).split == CUT
    # forced: no hysteresis when the split cannot run, and the reason names what it wanted
    assert policy.choose(1, 1e8, {LOCAL}) == Choice(LOCAL, Reason(NO_HOST, batch=1, rate_bps=1e8, wanted=CUT))


def test_a_table_choice_names_its_cell_around_the_estimate() -> None:
    """CUT wins above 8 * 10,000 B / 190 ms = 0.42 Mbit/s: at 100 Mbit/s the cell is [≈0.42, ∞)."""
    calibration = _calibration(200.0)
    choice = AutoPolicy(calibration).choose(1, 1e8, {LOCAL, CUT})
    reason = choice.reason
    assert (choice.split, reason.kind, reason.batch, reason.rate_bps, reason.hi_bps) == (CUT, TABLE, 1, 1e8, None)
    ((edge, below, above),) = calibration.table.boundaries(1)
    assert (below, above) == (LOCAL, CUT) and reason.lo_bps == edge == pytest.approx(0.42e6, rel=0.07)
    slow = AutoPolicy(calibration).choose(1, 1e5, {LOCAL, CUT}).reason
    assert (slow.lo_bps, slow.hi_bps) == (0.0, edge)  # local from the bottom of the grid up to the edge
    assert reason.text() == f"table: B=1 at 100.00 Mbit/s in [{edge / 1e6:.3g}, ∞) Mbit/s"


def test_a_split_better_by_less_than_the_margin_is_held_off_and_the_reason_says_by_how_much() -> None:
    """The issue's run that stayed local at 4980 Mbit/s: CUT at 5 + 4.2 ms on any fast link against
    local's 10 ms is the table's choice above ~100 Mbit/s, but not 10 % faster: once local (a slow
    spell), the hysteresis keeps local. Each batch says so, first while the table's choice has not
    held for min_hold batches, then with both predictions."""
    policy = AutoPolicy(_calibration(10.0, tail_ms=4.2), min_hold=3)
    everything = {LOCAL, CUT}
    assert policy.choose(1, 1.5e6, everything).split == LOCAL  # the slow spell
    reasons = [policy.choose(1, 4.98e9, everything).reason for _ in range(4)]
    assert [r.kind for r in reasons] == [HOLD] * 4 and {r.wanted for r in reasons} == {CUT}
    assert [r.streak for r in reasons] == [1, 2, 3, 4]
    assert reasons[0].wanted_ms is None and reasons[-1].wanted_ms == pytest.approx(9.2, abs=0.05)
    assert reasons[-1].kept_ms == pytest.approx(10.0) and reasons[-1].margin == 0.1
    assert reasons[-1].text().endswith("predicted 9.2 ms against 10.0 ms: not 10 % faster")
    assert reasons[0].text().endswith("1 batch(es) in a row so far")


def test_a_capped_estimate_that_made_the_choice_is_named_with_the_uncapped_one() -> None:
    everything = {LOCAL, CUT}
    overdue = AutoPolicy(_calibration(200.0)).choose(1, 2e5, everything, link_busy=True, uncapped_bps=1e8)
    assert overdue == Choice(LOCAL, Reason(UPLOAD_CAP, batch=1, rate_bps=2e5, uncapped_bps=1e8, overdue=True))
    crossing = AutoPolicy(_calibration(200.0)).choose(1, 2e5, everything, uncapped_bps=1e8)
    assert (crossing.split, crossing.reason.kind, crossing.reason.overdue) == (LOCAL, UPLOAD_CAP, False)
    assert crossing.reason.hi_bps == pytest.approx(0.42e6, rel=0.07)  # the cell of the capped rate
    # A cap that changes nothing is not the reason, but the reason carries the uncapped estimate.
    same = AutoPolicy(_calibration(200.0)).choose(1, 5e7, everything, uncapped_bps=1e8).reason
    assert (same.kind, same.uncapped_bps) == (TABLE, 1e8)


def test_an_upload_crossing_slowly_moves_a_held_split_at_once() -> None:
    """The hysteresis holds a split against an estimate's wobble, not against the link measured
    now: a remote split kept under a capped rate sent frames into the socket behind the slow upload
    (answered 5 and 7 s late in test_dynamic_split's slowed upload, with busy processes beside it)."""
    policy, everything = AutoPolicy(_calibration(200.0)), {LOCAL, CUT}
    assert policy.choose(1, 1e8, everything).split == CUT
    uncapped = policy.choose(1, 2e5, everything)  # the estimate itself dropped: held, as before
    assert (uncapped.split, uncapped.reason.kind) == (CUT, HOLD)
    capped = policy.choose(1, 2e5, everything, uncapped_bps=1e8)
    assert (capped.split, capped.reason.kind, capped.reason.uncapped_bps) == (LOCAL, UPLOAD_CAP, 1e8)
    # Back up: the hysteresis again (the table's CUT for 1, then 2 calls: held; the third switches).
    assert [policy.choose(1, 1e8, everything).split for _ in range(3)] == [LOCAL, LOCAL, CUT]


def test_no_estimate_runs_local_and_says_so() -> None:
    assert AutoPolicy(_calibration(200.0)).choose(1, None, {LOCAL, CUT}) == Choice(LOCAL, Reason(NO_RATE, batch=1))


def test_a_reason_goes_to_json_and_back() -> None:
    reason = Reason(HOLD, batch=1, rate_bps=4.98e9, lo_bps=1e8, wanted=CUT, streak=2)
    d = json.loads(json.dumps(reason.as_dict()))
    assert d == {"kind": HOLD, "batch": 1, "rate_bps": 4.98e9, "lo_bps": 1e8, "wanted": CUT, "streak": 2}
    assert Reason.from_dict(d) == reason
    fell = Reason(FALLBACK, batch=1, wanted=CUT, error="host gone", chosen=Reason(TABLE, batch=1, rate_bps=1e8, lo_bps=1e6))
    d = json.loads(json.dumps(fell.as_dict()))
    assert d["chosen"] == {"kind": TABLE, "batch": 1, "rate_bps": 1e8, "lo_bps": 1e6}
    assert Reason.from_dict(d) == fell and fell.text() == f"fell back from {CUT}: host gone"
    with pytest.raises(ValueError, match="reason kind 'why'"):
        Reason("why")
