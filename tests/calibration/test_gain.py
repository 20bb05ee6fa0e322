"""DSC Eq. 7, the relative gain of dynamic over static split computing, against a hand computation."""

from __future__ import annotations

import pytest

from calibration import CalibrationError, LatencyModel, SplitTable, SplitTimings, gains_over_static, relative_gain
from splitedge._words import LOCAL, OFFLOAD
from tests.calibration.models import corners

# Two states of the CORNERS model (times from its docstring):
#   (1, 1e5): LOCAL 50,  mid 1618, OFFLOAD 12049.24    -> dynamic picks LOCAL (50)
#   (1, 2e7): LOCAL 50,  mid 26,   OFFLOAD 67.2112     -> dynamic picks mid (26)
SCENARIO = [(1, 1e5), (1, 2e7)]


def test_gain_over_static_mid_by_hand() -> None:
    # (|50 - 1618| / 1618 + |26 - 26| / 26) / 2
    assert relative_gain(corners(), SCENARIO, "mid") == pytest.approx((1568 / 1618 + 0.0) / 2)


def test_gains_over_every_static_split_by_hand() -> None:
    gains = gains_over_static(corners(), SCENARIO)
    assert gains == pytest.approx(
        {
            LOCAL: (0.0 + 24 / 50) / 2,
            "mid": (1568 / 1618 + 0.0) / 2,
            OFFLOAD: ((12049.24 - 50) / 12049.24 + (67.2112 - 26) / 67.2112) / 2,
        }
    )


def test_a_policy_that_is_the_static_split_gains_nothing() -> None:
    assert relative_gain(corners(), SCENARIO, "mid", dynamic=lambda batch, rate: "mid") == 0.0


def test_table_lookup_as_the_dynamic_policy() -> None:
    model = corners()
    table = SplitTable.build(model, [1])
    assert relative_gain(model, SCENARIO, "mid", dynamic=table.lookup) == pytest.approx(relative_gain(model, SCENARIO, "mid"))


def test_a_stateful_policy_sees_each_state_once() -> None:
    calls = []
    gains_over_static(corners(), SCENARIO, dynamic=lambda batch, rate: calls.append(rate) or LOCAL)
    assert calls == [1e5, 2e7]


def test_empty_scenario_is_refused() -> None:
    with pytest.raises(CalibrationError, match="scenario: expected at least one"):
        relative_gain(corners(), [], "mid")


def test_signed_gain_counts_a_slower_choice_as_a_loss() -> None:
    """A policy that picks the slower option: Eq. 7's absolute value calls it a gain, signed does not."""
    model = LatencyModel((SplitTimings(LOCAL, 0, {1: 10.0}, {}), SplitTimings("cut", 1000, {1: 1.0}, {1: 1.0})), 0.0)
    # At 8 Mbit/s the cut takes 1 + 1 + 1 = 3 ms, local 10 ms; the policy always says local.
    scenario = [(1, 8e6)]
    assert relative_gain(model, scenario, "cut", dynamic=lambda b, r: LOCAL) == pytest.approx(7 / 3)
    assert relative_gain(model, scenario, "cut", dynamic=lambda b, r: LOCAL, signed=True) == pytest.approx(-7 / 3)
    assert gains_over_static(model, scenario, signed=True) == {LOCAL: pytest.approx(0.7), "cut": 0.0}
