"""The selector's hysteresis: no flapping around a boundary, prompt switches past it, forced changes at once."""

from __future__ import annotations

import pytest

from calibration import CalibrationError, LatencyModel, SplitSelector, SplitTable, SplitTimings
from calibration._switching import Decision, decision_cost_us
from splitedge._words import LOCAL, OFFLOAD
from tests.calibration.models import corners, two_cuts


def selector_at_boundary() -> tuple[SplitSelector, SplitTable, float]:
    """TWO_CUTS at B = 1, its table, and the rate where the table switches from late to early (≈ 8.4e7)."""
    model = two_cuts()
    table = SplitTable.build(model, [1])
    ((boundary, _, _),) = table.boundaries(1)
    return SplitSelector(table, model, margin=0.1, min_hold=3), table, boundary


def test_first_call_adopts_the_tables_choice() -> None:
    selector, _, _ = selector_at_boundary()
    assert selector.current is None
    assert selector.choose(1, 1e7) == "late"
    assert selector.switches == 0


@pytest.mark.parametrize("period", [1, 5])  # alternate every call, or hold each side for 5 calls
def test_no_flapping_when_the_rate_oscillates_5_percent_around_a_boundary(period: int) -> None:
    selector, table, boundary = selector_at_boundary()
    high, low = boundary * 1.05, boundary / 1.05
    assert selector.choose(1, low) == "late"
    # The table does change its mind across the boundary...
    assert (table.lookup(1, high), table.lookup(1, low)) == ("early", "late")
    # ...but at 1.05 x 8.41e7 early is only (21.906 - 21.06) / 21.906 ≈ 4 % faster, inside the 10 % margin.
    rates = [high if (i // period) % 2 == 0 else low for i in range(100)]
    assert {selector.choose(1, rate) for rate in rates} == {"late"}
    assert selector.switches == 0


def test_switches_after_min_hold_calls_well_past_the_boundary() -> None:
    selector, _, _ = selector_at_boundary()
    selector.choose(1, 1e7)
    # At 8e8: early 12 + 1 = 13 ms, late 21 + 0.1 = 21.1 ms: 38 % faster, past the margin.
    assert [selector.choose(1, 8e8) for _ in range(4)] == ["late", "late", "early", "early"]
    assert selector.switches == 1


def test_no_switch_when_the_model_sees_no_clear_gain() -> None:
    # Same table, a margin of 50 %: early's 38 % at 8e8 is not enough.
    model = two_cuts()
    selector = SplitSelector(SplitTable.build(model, [1]), model, margin=0.5)
    selector.choose(1, 1e7)
    assert {selector.choose(1, 8e8) for _ in range(10)} == {"late"}


def test_losing_the_host_forces_local_at_once_and_the_return_waits_for_the_hold() -> None:
    model = corners()
    selector = SplitSelector(SplitTable.build(model, [1]), model, min_hold=3)
    assert selector.choose(1, 1e9) == OFFLOAD
    assert selector.choose(1, 1e9, available={LOCAL}) == LOCAL  # forced: no margin, no hold
    assert selector.switches == 1
    # Host back: OFFLOAD has been the table's choice for 2 calls, 3 with this one.
    assert selector.choose(1, 1e9) == OFFLOAD
    assert selector.switches == 2


def test_a_rate_measured_now_is_followed_at_once_and_the_return_waits_for_the_hold() -> None:
    model = corners()
    table = SplitTable.build(model, [1])
    selector = SplitSelector(table, model, min_hold=3)
    assert selector.choose(1, 1e9) == OFFLOAD
    slow = table.lookup(1, 1e5)
    assert slow != OFFLOAD
    assert selector.decide(1, 1e5).split == OFFLOAD  # an estimate's drop: held
    decision = selector.decide(1, 1e5, at_once=True)
    assert (decision.split, decision.why, selector.switches) == (slow, Decision.TABLE, 1)  # no hold, no margin
    assert [selector.choose(1, 1e9) for _ in range(3)] == [slow, slow, OFFLOAD]


def test_forced_choice_is_the_best_among_the_available() -> None:
    model = corners()
    selector = SplitSelector(SplitTable.build(model, [1]), model)
    selector.choose(1, 1e9)
    # OFFLOAD's tail is gone from the host: among LOCAL (50) and mid (18.16), mid.
    assert selector.choose(1, 1e9, available={LOCAL, "mid"}) == "mid"


def test_without_a_rate_estimate_runs_local() -> None:
    model = corners()
    selector = SplitSelector(SplitTable.build(model, [1]), model)
    assert selector.choose(1, None) == LOCAL
    selector.choose(1, 1e9, available={"mid"})
    assert selector.choose(1, None, available={"mid", OFFLOAD}) == "mid"  # no LOCAL: keep the current


def test_without_rate_or_local_assumes_the_slowest_link() -> None:
    model = corners()
    selector = SplitSelector(SplitTable.build(model, [1]), model)
    # At the grid's 1e5: mid 1618 < OFFLOAD 12049
    assert selector.choose(1, None, available={"mid", OFFLOAD}) == "mid"


def test_a_table_split_missing_from_the_model_is_refused() -> None:
    other = LatencyModel((SplitTimings("elsewhere", 10, {1: 1.0}, {1: 1.0}),), rtt_ms=0.0)
    with pytest.raises(CalibrationError, match=r"the table's splits early, late are not in the latency model \(elsewhere\)"):
        SplitSelector(SplitTable.build(two_cuts(), [1]), other)


def test_decision_cost_leaves_the_selector_alone() -> None:
    selector, _, _ = selector_at_boundary()
    selector.choose(1, 1e7)
    assert decision_cost_us(selector, n=200) > 0.0
    assert (selector.current, selector.switches) == ("late", 0)


def test_retune_keeps_the_current_split_and_decides_with_the_new_model() -> None:
    model = corners()
    selector = SplitSelector(SplitTable.build(model, [1]), model, min_hold=1)
    assert selector.choose(1, 2e7) == "mid"  # 26 < 50
    # The board throttles: mid's head goes from 10 to 40 ms -> mid 56 > LOCAL 50 at 2e7.
    slow = LatencyModel(
        (model.timings(LOCAL), SplitTimings("mid", 20_000, {1: 40.0}, {1: 3.0}), model.timings(OFFLOAD)), rtt_ms=5.0
    )
    selector.retune(SplitTable.build(slow, [1]), slow)
    assert selector.current == "mid"  # retuning is not a switch
    # LOCAL is only (56 - 50) / 56 ≈ 11 % faster: just past the 10 % margin.
    assert selector.choose(1, 2e7) == LOCAL
    assert selector.switches == 1


def test_retune_refuses_a_table_without_the_current_split() -> None:
    model = corners()
    selector = SplitSelector(SplitTable.build(model, [1]), model)
    selector.choose(1, 1e9)
    with pytest.raises(CalibrationError, match="the retuned table lacks the current split 'offload'"):
        selector.retune(SplitTable.build(model, [1], allowed={LOCAL, "mid"}), model)
