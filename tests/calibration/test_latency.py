"""DSC Eq. 4-6 on hand-computed models, and the interpolation of measured times over batch sizes."""

from __future__ import annotations

import pytest

from calibration import CalibrationError, LatencyModel, SplitTimings
from splitedge.words import LOCAL, OFFLOAD
from tests.calibration.models import corners, two_cuts


def test_predict_is_eq4_with_round_trip() -> None:
    model = corners()
    # mid at 2e7: 10 + 8 * 20_000 * 1000 / 2e7 + 3 + 5 = 10 + 8 + 3 + 5
    assert model.predict_ms("mid", 1, 2e7) == pytest.approx(26.0)
    # early at 2e8, no round trip: 2 + 8 * 100_000 * 1000 / 2e8 + 10 = 2 + 4 + 10
    assert two_cuts().predict_ms("early", 1, 2e8) == pytest.approx(16.0)


def test_offload_is_eq5_and_local_pays_neither_link_nor_round_trip() -> None:
    model = corners()
    # Eq. 5: D / r + T_tail: 8 * 150_528 * 1000 / 2e7 + 2 + 5 (round trip)
    assert model.predict_ms(OFFLOAD, 1, 2e7) == pytest.approx(60.2112 + 7.0)
    assert model.predict_ms(LOCAL, 1, 1e5) == model.predict_ms(LOCAL, 1, 1e9) == 50.0


def test_terms_are_eq4_term_by_term() -> None:
    model = corners()
    # mid at 2e7: head 10; transfer 8 * 20_000 * 1000 / 2e7 + the 5 ms round trip; tail 3
    assert model.terms_ms("mid", 1, 2e7) == pytest.approx({"head": 10.0, "transfer": 13.0, "tail": 3.0})
    assert sum(model.terms_ms("mid", 1, 2e7).values()) == pytest.approx(model.predict_ms("mid", 1, 2e7))
    assert model.terms_ms(OFFLOAD, 1, 2e7) == pytest.approx({"head": 0.0, "transfer": 65.2112, "tail": 2.0})
    assert model.terms_ms(LOCAL, 1, 1e5) == {"head": 50.0, "transfer": 0.0, "tail": 0.0}
    with pytest.raises(CalibrationError, match="link rate must be > 0"):
        model.terms_ms("mid", 1, 0.0)


def test_transfer_scales_with_batch() -> None:
    # early at B = 4, 2e8: 8 + 8 * 100_000 * 4 * 1000 / 2e8 + 40 = 8 + 16 + 40
    assert two_cuts().predict_ms("early", 4, 2e8) == pytest.approx(64.0)


@pytest.mark.parametrize(
    ("rate", "allowed", "expected"),
    [
        (1e9, None, OFFLOAD),  # 8.2 < 18.16 < 50
        (2e7, None, "mid"),  # 26 < 50 < 67.2
        (1e5, None, LOCAL),  # 50 < 1618 < 12049
        (1e9, {LOCAL, "mid"}, "mid"),  # no full offload (privacy, DSC §3): 18.16 < 50
        (1e5, {"mid", OFFLOAD}, "mid"),  # no local: 1618 < 12049
        (1e9, {LOCAL}, LOCAL),
        (1e9, {LOCAL, "not-a-split"}, LOCAL),  # names the model lacks are ignored
    ],
)
def test_best_is_eq6_argmin(rate: float, allowed: set[str] | None, expected: str) -> None:
    assert corners().best(1, rate, allowed) == expected


def test_best_breaks_ties_by_listing_order() -> None:
    same = ({1: 5.0}, {1: 5.0})
    model = LatencyModel((SplitTimings("b", 1000, *same), SplitTimings("a", 1000, *same)), rtt_ms=1.0)
    assert model.best(1, 1e6) == "b"


def test_best_with_nothing_allowed_names_both_sides() -> None:
    with pytest.raises(CalibrationError, match=r"none of the allowed splits \(x\) is in the latency model \(local, mid, offload\)"):
        corners().best(1, 1e6, {"x"})


def test_unknown_split_is_named_with_the_known_ones() -> None:
    with pytest.raises(CalibrationError, match=r"unknown split 'conv9'; the latency model has local, mid, offload"):
        corners().predict_ms("conv9", 1, 1e6)


@pytest.mark.parametrize("rate", [0.0, -1.0, float("nan")])
def test_remote_split_needs_a_positive_rate(rate: float) -> None:
    with pytest.raises(CalibrationError, match="link rate must be > 0"):
        corners().predict_ms("mid", 1, rate)


def test_duplicate_split_names_are_refused() -> None:
    t = SplitTimings("a", 1, {}, {})
    with pytest.raises(CalibrationError, match=r"splits\[1\].split: 'a' is listed twice"):
        LatencyModel((t, t), rtt_ms=0.0)


@pytest.mark.parametrize(
    ("head", "message"),
    [
        ({4: -1.0}, r"head_ms\[4\]: expected a finite number >= 0, got -1.0"),
        ({4: "x"}, r"head_ms\[4\]: expected a number, got 'x'"),
        ({0: 1.0}, r"head_ms\[0\]: expected an integer >= 1, got 0"),
    ],
)
def test_bad_timings_are_refused_by_field(head: dict, message: str) -> None:
    with pytest.raises(CalibrationError, match=message):
        SplitTimings("a", 1, head, {})


def test_timings_are_copied_on_construction() -> None:
    head = {1: 5.0}
    timings = SplitTimings("a", 1, head, {})
    head[1] = 500.0
    assert timings.head_at(1) == 5.0


# head_ms {1: 10, 2: 16, 4: 28}:
#   B = 3: halfway between 16 and 28 -> 22;  B = 8: the line through (2, 16), (4, 28) has slope 6 -> 28 + 6 * 4 = 52
@pytest.mark.parametrize(("batch", "expected"), [(1, 10.0), (2, 16.0), (3, 22.0), (4, 28.0), (8, 52.0)])
def test_head_interpolates_between_and_extrapolates_beyond(batch: int, expected: float) -> None:
    assert SplitTimings("a", 1, {1: 10.0, 2: 16.0, 4: 28.0}, {}).head_at(batch) == pytest.approx(expected)


def test_tail_below_the_smallest_batch_scales_proportionally() -> None:
    # tail_ms {2: 10, 4: 16}: B = 1 is half of B = 2's 10 ms
    assert SplitTimings("a", 1, {}, {2: 10.0, 4: 16.0}).tail_at(1) == pytest.approx(5.0)


def test_single_measured_batch_scales_proportionally_both_ways() -> None:
    timings = SplitTimings("a", 1, {4: 20.0}, {})
    assert (timings.head_at(2), timings.head_at(8)) == pytest.approx((10.0, 40.0))


def test_decreasing_last_two_extrapolate_flat_not_negative() -> None:
    # tail_ms {1: 10, 2: 8}: the line would reach 0 at B = 6; a larger batch is never taken as faster
    assert SplitTimings("a", 1, {}, {1: 10.0, 2: 8.0}).tail_at(100) == 8.0


def test_nothing_measured_costs_nothing() -> None:
    timings = SplitTimings(OFFLOAD, 100, {}, {})
    assert timings.head_at(7) == timings.tail_at(7) == 0.0


def test_batch_must_be_positive() -> None:
    with pytest.raises(CalibrationError, match="batch size must be an integer >= 1, got 0"):
        SplitTimings("a", 1, {1: 1.0}, {}).head_at(0)


def test_model_round_trips_through_dict() -> None:
    model = corners()
    assert LatencyModel.from_dict(model.to_dict()) == model
