"""The rate x batch table (DSC Eq. 6 tabulated) against hand-computed crossovers, and its O(1) lookup."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from calibration import CalibrationError, LatencyModel, SplitTable, SplitTimings
from splitedge._words import LOCAL, OFFLOAD
from tests.calibration.models import CROSSOVER_BPS, LOCAL_MID_BPS, MID_OFFLOAD_BPS, corners, preprocessed, two_cuts

HALF_STEP = 0.5 / 20  # in decades: a reported boundary is the log-midpoint of two grid rates


def near(rate: float, expected: float) -> bool:
    """Within half a grid step (a factor 10 ** (1 / 40), about 6 %) on the log axis."""
    return abs(math.log10(rate / expected)) <= HALF_STEP


def test_grid_spans_the_default_range_evenly_in_log() -> None:
    rates = SplitTable.build(corners(), [1]).rates_bps
    assert len(rates) == 4 * 20 + 1
    assert rates[0] == 1e5 and rates[-1] == pytest.approx(1e9)
    ratios = [b / a for a, b in zip(rates, rates[1:])]
    assert max(ratios) == pytest.approx(min(ratios)) == pytest.approx(10 ** (1 / 20))


def test_boundary_is_the_hand_computed_crossover() -> None:
    (boundary,) = SplitTable.build(two_cuts(), [1]).boundaries(1)
    rate, below, above = boundary
    assert (below, above) == ("late", "early")  # fewer bytes win on a slow link
    assert near(rate, CROSSOVER_BPS)  # 8 * 90_000 * 1 * 1000 / 9 = 8e7


def test_linear_times_keep_the_crossover_at_every_batch() -> None:
    table = SplitTable.build(two_cuts(late_head_at_4=80.0), [1, 4])
    # B = 4: r* = 8 * 90_000 * 4 * 1000 / (84 - 48) = 8e7, the same as at B = 1
    assert [(below, above) for _, below, above in table.boundaries(4)] == [("late", "early")]
    assert near(table.boundaries(4)[0][0], CROSSOVER_BPS)
    assert table.lookup(1, 2e8) == table.lookup(4, 2e8) == "early"


def test_nonlinear_head_changes_the_best_split_with_batch_size() -> None:
    # Late head 40 ms at B = 4 (not 80): late computes 44 < early's 48 and sends less -> late everywhere.
    table = SplitTable.build(two_cuts(late_head_at_4=40.0), [1, 4])
    assert table.boundaries(4) == []
    assert table.lookup(1, 2e8) == "early"  # 16 < 21.4
    assert table.lookup(4, 2e8) == "late"  # 45.6 < 64
    assert table.lookup(4, 1e9) == "late"


def test_corners_full_offload_and_local_only() -> None:
    table = SplitTable.build(corners(), [1])
    assert table.lookup(1, 1e9) == OFFLOAD  # fast link, fast host: 8.2 < 18.16 < 50
    assert table.lookup(1, 1e5) == LOCAL  # 0.1 Mbit/s: 50 < 1618
    assert table.lookup(1, 2e7) == "mid"  # 26 < 50 < 67.2
    (r1, below1, above1), (r2, below2, above2) = table.boundaries(1)
    assert (below1, above1, below2, above2) == (LOCAL, "mid", "mid", OFFLOAD)
    assert near(r1, LOCAL_MID_BPS) and near(r2, MID_OFFLOAD_BPS)  # 5e6 and 9.49e7


def test_allowed_restricts_the_table() -> None:
    private = SplitTable.build(corners(), [1], allowed={LOCAL, "mid"})  # the input must not leave the board
    assert private.splits == (LOCAL, "mid")
    assert private.lookup(1, 1e9) == "mid"  # 18.16 < 50
    assert [(b, a) for _, b, a in private.boundaries(1)] == [(LOCAL, "mid")]
    remote = SplitTable.build(corners(), [1], allowed={"mid", OFFLOAD})
    assert remote.lookup(1, 1e5) == "mid"  # 1618 < 12049


@pytest.mark.parametrize(
    ("rate", "expected"),
    [(1.0, LOCAL), (0.0, LOCAL), (-5.0, LOCAL), (1e12, OFFLOAD), (math.inf, OFFLOAD)],
)
def test_lookup_clamps_rates_outside_the_grid(rate: float, expected: str) -> None:
    assert SplitTable.build(corners(), [1]).lookup(1, rate) == expected


def test_lookup_refuses_nan() -> None:
    with pytest.raises(CalibrationError, match="link rate must be a number, got nan"):
        SplitTable.build(corners(), [1]).lookup(1, math.nan)


def test_lookup_takes_the_largest_tabulated_batch_not_above() -> None:
    model = two_cuts(late_head_at_4=40.0)  # at 2e8: B = 1 -> early, B = 4 -> late
    table = SplitTable.build(model, [1, 4])
    assert [table.lookup(b, 2e8) for b in (1, 2, 3, 4, 5, 64)] == ["early"] * 3 + ["late"] * 3
    only_four = SplitTable.build(model, [4])
    assert only_four.lookup(1, 2e8) == "late"  # below the table: its smallest batch's row
    assert only_four.boundaries(1) == only_four.boundaries(4) == []


_MS = st.floats(0.0, 300.0, allow_nan=False)
_BATCHES = (1, 2, 4, 8)


@st.composite
def models(draw: st.DrawFn) -> LatencyModel:
    """LOCAL, OFFLOAD and 1-3 cuts with arbitrary measured times, sizes and round trip."""
    splits = [
        SplitTimings(LOCAL, 0, {b: draw(_MS) for b in _BATCHES}, {}),
        SplitTimings(OFFLOAD, draw(st.integers(1, 10**6)), {}, {b: draw(_MS) for b in _BATCHES}),
    ]
    for i in range(draw(st.integers(1, 3))):
        head, tail = ({b: draw(_MS) for b in _BATCHES} for _ in range(2))
        splits.append(SplitTimings(f"cut{i}", draw(st.integers(0, 10**6)), head, tail))
    return LatencyModel(tuple(draw(st.permutations(splits))), rtt_ms=draw(st.floats(0.0, 50.0)))


@settings(max_examples=25, deadline=None)
@given(models())
def test_lookup_equals_eq6_at_every_grid_point(model: LatencyModel) -> None:
    table = SplitTable.build(model, _BATCHES)
    for batch in _BATCHES:
        assert [table.lookup(batch, r) for r in table.rates_bps] == [model.best(batch, r) for r in table.rates_bps]


def test_a_cell_is_the_rates_between_the_boundaries_around_the_estimate() -> None:
    """What a run prints to explain a choice: the split and the rates [lo, hi) it holds over."""
    table = SplitTable.build(corners(), [1])
    (r1, _, _), (r2, _, _) = table.boundaries(1)
    assert table.cell(1, 1e5) == (LOCAL, 0.0, r1)  # open below: the grid's bottom clamps
    assert table.cell(1, 2e7) == ("mid", r1, r2)
    assert table.cell(1, 1e9) == (OFFLOAD, r2, None)  # open above


@settings(max_examples=25, deadline=None)
@given(models(), st.floats(4.0, 10.0), st.sampled_from(_BATCHES))
def test_a_cell_holds_its_rate_and_agrees_with_lookup(model: LatencyModel, log_rate: float, batch: int) -> None:
    table = SplitTable.build(model, _BATCHES)
    rate = 10**log_rate
    split, lo, hi = table.cell(batch, rate)
    assert split == table.lookup(batch, rate)
    clamped = min(max(rate, table.rates_bps[0]), table.rates_bps[-1])
    assert lo <= clamped * (1 + 1e-9) and (hi is None or clamped <= hi * (1 + 1e-9))
    inside = [r for r in table.rates_bps if lo <= r and (hi is None or r < hi)]
    assert {table.lookup(batch, r) for r in inside} == {split}


@settings(max_examples=50, deadline=None)
@given(models(), st.floats(5.0, 9.0), st.sampled_from(_BATCHES))
def test_lookup_between_grid_points_takes_the_nearest_in_log(model: LatencyModel, log_rate: float, batch: int) -> None:
    table = SplitTable.build(model, _BATCHES)
    rate = 10**log_rate
    steps = (log_rate - 5.0) * 20
    assume(abs(steps - math.floor(steps) - 0.5) > 1e-6)  # not on a midpoint, where either neighbour is right
    nearest = min(table.rates_bps, key=lambda r: abs(math.log10(r) - log_rate))
    assert table.lookup(batch, rate) == model.best(batch, nearest)


def test_round_trips_through_json() -> None:
    table = SplitTable.build(corners(), [1, 2, 4])
    assert SplitTable.from_dict(json.loads(json.dumps(table.to_dict()))) == table


def _broken(edit) -> dict:
    d = SplitTable.build(corners(), [1, 2]).to_dict()
    edit(d)
    return d


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.pop("splits"), r"^table.splits: missing$"),
        (lambda d: d["best"][1].pop(), r"^table.best\[1\]: expected 81 entries \(one per rate\), got 80$"),
        (lambda d: d["best"][0].__setitem__(5, 3), r"^table.best\[0\]\[5\]: expected an index below 3, got 3$"),
        (lambda d: d["best"].__setitem__(0, 7), r"^table.best\[0\]: expected a list, got 7$"),
        (lambda d: d.__setitem__("batches", [2, 1]), r"^table.batches\[1\]: expected ascending batch sizes, got 1 after 2$"),
        (lambda d: d["rates_bps"].__setitem__(3, 3e5), r"^table.rates_bps\[3\]: expected evenly log-spaced rates, got 300000.0$"),
        (lambda d: d.__setitem__("splits", ["a", "a", "b"]), r"^table.splits: expected unique split names"),
    ],
)
def test_from_dict_names_the_bad_field(edit, message: str) -> None:
    with pytest.raises(CalibrationError, match=message):
        SplitTable.from_dict(_broken(edit))


def test_for_model_keeps_the_grid_and_retabulates() -> None:
    """The board's measured times replace the calibrated ones: same grid, Eq. 6 of the new model."""
    slow_local = corners()
    table = SplitTable.build(slow_local, (1, 4))
    fast_local = LatencyModel(
        tuple(SplitTimings(s.split, s.bytes_per_sample, {1: 0.01, 4: 0.04}, s.tail_ms) if s.split == LOCAL else s
              for s in slow_local.splits),
        slow_local.rtt_ms,
    )
    again = table.for_model(fast_local)
    assert (again.batches, again.rates_bps, again.splits) == (table.batches, table.rates_bps, table.splits)
    assert again == SplitTable.build(fast_local, (1, 4))
    assert {again.lookup(b, r) for b in again.batches for r in again.rates_bps} == {LOCAL}


@pytest.mark.parametrize("model", [corners(), two_cuts()], ids=["corners", "two_cuts"])
def test_preprocessing_moves_every_option_alike_and_changes_no_choice(model: LatencyModel) -> None:
    """Every option pays the same B frames' preprocessing: the table of the whole model is the
    table of DSC Eq. 4 alone, even for preprocessing that costs more than any head."""
    batches = [1, 4]
    assert SplitTable.build(preprocessed(model, 120.0), batches) == SplitTable.build(model, batches)
