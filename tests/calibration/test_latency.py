"""DSC Eq. 4-6 on hand-computed models, and the interpolation of measured times over batch sizes."""

from __future__ import annotations

import pytest

from calibration import CalibrationError, LatencyModel, SplitTimings, drop_share
from splitedge._words import LOCAL, OFFLOAD
from tests.calibration.models import corners, preprocessed, two_cuts


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


def test_preprocessing_is_a_term_of_every_option_per_frame() -> None:
    """Eq. 4 plus B frames' preprocessing, for every option (full offload sends the preprocessed input)."""
    model = preprocessed(corners(), 4.0)
    # mid at 2e7, B = 1: 4 + 10 + 13 + 3; the terms still add up to the prediction
    assert model.terms_ms("mid", 1, 2e7) == pytest.approx({"preprocess": 4.0, "head": 10.0, "transfer": 13.0, "tail": 3.0})
    assert model.predict_ms("mid", 1, 2e7) == pytest.approx(30.0)
    assert model.predict_ms(LOCAL, 1, 1e5) == pytest.approx(54.0)
    assert model.predict_ms(OFFLOAD, 1, 2e7) == pytest.approx(4.0 + 60.2112 + 7.0)
    # B frames are preprocessed one after another: early at B = 4, 2e8: 4 * 3 + 8 + 16 + 40
    assert preprocessed(two_cuts(), 3.0).predict_ms("early", 4, 2e8) == pytest.approx(76.0)


def test_a_model_without_preprocessing_counts_it_as_nothing_and_has_no_term() -> None:
    model = corners()  # calibrated before preprocessing was timed
    assert model.preprocess_ms is None and "preprocess" not in model.terms_ms("mid", 1, 2e7)
    assert model.stages_ms(LOCAL, 1, 1e5)["board"] == 50.0


def test_a_stream_runs_at_the_pace_of_its_slowest_stage() -> None:
    """B / max(board, link, host): preprocessing and the head share the board's thread (one stage);
    the round trip overlaps between requests in flight and does not slow the stream."""
    model = preprocessed(corners(), 4.0)
    # mid at 2e7: board 4 + 10, link 8 * 20_000 * 1000 / 2e7 = 8, host 3: the board, 1000 / 14
    assert model.stages_ms("mid", 1, 2e7) == pytest.approx({"board": 14.0, "link": 8.0, "host": 3.0})
    assert model.frames_per_s("mid", 1, 2e7) == pytest.approx(1000 / 14)
    # ... at 2e6 the link, 80 ms: 12.5 frames/s, though the frame takes 4 + 10 + 85 + 3 = 102 ms
    assert model.frames_per_s("mid", 1, 2e6) == pytest.approx(12.5)
    # LOCAL: the board alone, 4 + 50 ms a frame
    assert model.frames_per_s(LOCAL, 1, 1e5) == pytest.approx(1000 / 54)
    # OFFLOAD at 1e9: link 1.2 ms, host 2 ms; the board's 4 ms of preprocessing is slowest: 250 frames/s
    assert model.frames_per_s(OFFLOAD, 1, 1e9) == pytest.approx(1000 / 4)
    # A batch of 4 frames through early at 2e8: board 4 * 3 + 8 = 20, link 16, host 40: 4 frames in 40 ms
    assert preprocessed(two_cuts(), 3.0).frames_per_s("early", 4, 2e8) == pytest.approx(100.0)


def test_a_paced_stream_counts_the_frames_an_option_leaves_unanswered() -> None:
    """At 5 Mbit/s LOCAL answers a frame in 4 + 50 = 54 ms and so does mid (4 + 10 + 5 + 32 + 3): DSC
    picks LOCAL, listed first. From a camera at 25 frames/s (40 ms apart) LOCAL's board stage (54 ms)
    cannot keep up: the board is always busy, a frame waits half an interval for it (20 ms), and
    40 / 54 of the frames are answered: its cost is (54 + 20) * 54 / 40 = 99.9; mid's board (14 ms)
    and link (32 ms) keep up: 54, mid. At 4 Mbit/s mid's link takes the whole 40 ms: each frame
    waits behind the upload before it, 62 + 40 = 102, and LOCAL wins again by 2 %. At 60 ms apart
    LOCAL keeps up too: LOCAL."""
    model = preprocessed(corners(), 4.0)
    assert (model.predict_ms(LOCAL, 1, 5e6), model.predict_ms("mid", 1, 5e6)) == pytest.approx((54.0, 54.0))
    assert model.best(1, 5e6) == LOCAL
    paced = model.paced(40.0)
    assert paced.cost_ms(LOCAL, 1, 5e6) == pytest.approx((54.0 + 20.0) * 54.0 / 40.0)
    assert paced.cost_ms("mid", 1, 5e6) == pytest.approx(54.0)
    assert paced.best(1, 5e6) == "mid"
    assert paced.cost_ms("mid", 1, 4e6) == pytest.approx(62.0 + 40.0)
    assert paced.best(1, 4e6) == LOCAL
    assert model.paced(60.0).best(1, 5e6) == LOCAL
    assert paced.to_dict() == model.to_dict()  # the camera's pace is the run's, not the calibration file's
    with pytest.raises(CalibrationError, match="interval_ms: expected a frame interval > 0 ms"):
        model.paced(0.0)


def test_nothing_to_do_is_no_bound() -> None:
    model = LatencyModel((SplitTimings(LOCAL, 0, {1: 0.0}, {}),), rtt_ms=0.0)
    assert model.frames_per_s(LOCAL, 1, 1e6) == float("inf") and drop_share(30.0, float("inf")) == 0.0


@pytest.mark.parametrize("camera, answered, expected", [
    (10.0, 4.0, 0.6),  # the example: 4 of 10 frames answered, 60 % dropped
    (10.0, 10.0, 0.0),
    (10.0, 25.0, 0.0),  # a board faster than its camera drops nothing
    (0.0, 4.0, 0.0),  # a camera without a frame rate has nothing to drop
])
def test_drop_share_is_what_the_slowest_stage_leaves(camera: float, answered: float, expected: float) -> None:
    assert drop_share(camera, answered) == pytest.approx(expected)


@pytest.mark.parametrize("camera, answered", [(-1.0, 4.0), (10.0, float("nan")), (10.0, -1.0)])
def test_drop_share_refuses_nonsense(camera: float, answered: float) -> None:
    with pytest.raises(CalibrationError):
        drop_share(camera, answered)


def test_preprocessing_round_trips_and_older_models_read_without_it() -> None:
    model = preprocessed(corners(), 4.0)
    assert model.to_dict()["preprocess_ms"] == 4.0 and LatencyModel.from_dict(model.to_dict()) == model
    assert "preprocess_ms" not in corners().to_dict()
    assert LatencyModel.from_dict(corners().to_dict()).preprocess_ms is None
    with pytest.raises(CalibrationError, match=r"model.preprocess_ms: expected a finite number >= 0, got -1"):
        LatencyModel.from_dict({**corners().to_dict(), "preprocess_ms": -1})
