"""What dynamic split computing gains over a static split in a scenario (DSC Eq. 7).

A scenario is the sequence of states (batch size, link rate in bit/s) an application goes
through. The gain tells whether switching is worth having on a given deployment before
anyone builds a switching runtime for it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from calibration._latency import LatencyModel
from splitedge.errors import CalibrationError

Policy = Callable[[int, float], str]  # (batch size, rate in bit/s) -> split name


def relative_gain(
    model: LatencyModel,
    scenario: Sequence[tuple[int, float]],
    static_split: str,
    dynamic: Policy | None = None,
    signed: bool = False,
) -> float:
    """DSC Eq. 7: G = 1/N * sum over the states of |T_dyn - T_static| / T_static.

    T_dyn is the predicted time of the split ``dynamic`` picks (``model.best``, DSC Eq. 6,
    when not given; a table lookup or a selector to measure what they lose to the exact argmin).
    With the argmin T_dyn <= T_static and the absolute value changes nothing; a real policy
    (hysteresis, a stale estimate) can be slower in some states, which ``signed=True``
    counts as a loss, (T_static - T_dyn) / T_static, instead of a gain.
    """
    return _mean_gain(model, scenario, static_split, _choices(model, scenario, dynamic), signed)


def gains_over_static(
    model: LatencyModel, scenario: Sequence[tuple[int, float]], dynamic: Policy | None = None, signed: bool = False
) -> dict[str, float]:
    """DSC Eq. 7 against each split of the model held static (their Fig. 3, one split at a time).

    The dynamic policy is asked once per state, not once per static split: a stateful policy
    (a selector with hysteresis) sees the scenario once, as it would at run time.
    """
    choices = _choices(model, scenario, dynamic)
    return {name: _mean_gain(model, scenario, name, choices, signed) for name in model.names}


def _choices(model: LatencyModel, scenario: Sequence[tuple[int, float]], dynamic: Policy | None) -> list[str]:
    if not scenario:
        raise CalibrationError("scenario: expected at least one (batch size, rate) state, got none")
    policy = model.best if dynamic is None else dynamic
    return [policy(batch, rate) for batch, rate in scenario]


def _mean_gain(
    model: LatencyModel, scenario: Sequence[tuple[int, float]], static_split: str, choices: list[str],
    signed: bool = False,
) -> float:
    total = 0.0
    for (batch, rate), choice in zip(scenario, choices):
        static_ms = model.predict_ms(static_split, batch, rate)
        if static_ms <= 0.0:
            raise CalibrationError(
                f"{static_split!r} is predicted to take {static_ms} ms at batch {batch}, {rate:g} bit/s: "
                "a relative gain needs a positive time"
            )
        difference = static_ms - model.predict_ms(choice, batch, rate)
        total += (difference if signed else abs(difference)) / static_ms
    return total / len(scenario)
