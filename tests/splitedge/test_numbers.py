"""splitedge._numbers: a number is refused where it enters unless finite and within its bounds, in
one line that says the range; any text whatever is a number in range or that line, nothing else.
Property-based (hypothesis, pinned in the dev extra)."""

from __future__ import annotations

import argparse
import math

import pytest
from hypothesis import given, settings, strategies as st

from splitedge import Bounds, SettingError, as_flag_type, bounds_of

FAST = settings(max_examples=300, deadline=None)

finite = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e15, max_value=1e15)


@st.composite
def bounds(draw) -> Bounds:
    kind = draw(st.sampled_from([int, float]))
    if kind is int:
        low = draw(st.integers(-10**6, 10**6))
        high = draw(st.integers(low, low + 10**9))
    else:
        low = draw(finite)
        high = draw(st.floats(min_value=low, max_value=low + 1e12, allow_nan=False, allow_infinity=False))
    return Bounds(kind, low, high, draw(st.sampled_from(["", "seconds", "MiB"])), low_open=draw(st.booleans()))


number_text = st.one_of(
    st.text(max_size=12),
    finite.map(repr), st.integers(-10**13, 10**13).map(str),
    st.sampled_from(["nan", "NaN", "-nan", "inf", "-inf", "Infinity", "1e999", "-1e999", "1_000", " 4 ", "4.0", "0x10",
                     "", "-0", "1e-320"]),
)


@FAST
@given(bounds(), number_text)
def test_any_text_is_a_number_in_range_or_one_line_saying_the_range(b: Bounds, text: str) -> None:
    try:
        value = b(text)
    except SettingError as exc:
        message = str(exc)
        assert "\n" not in message.replace(repr(text), "") and message.startswith("expected ") and repr(text) in message
        assert b.describe() in message
        return
    assert isinstance(value, b.kind) and math.isfinite(value) and b.low <= value <= b.high
    assert not (b.low_open and value == b.low) and b.contains(value)


@FAST
@given(bounds(), st.data())
def test_a_value_in_range_written_out_reads_back(b: Bounds, data) -> None:
    if b.kind is int:
        value = data.draw(st.integers(int(b.low), int(b.high)))
    else:
        value = data.draw(st.floats(b.low, b.high, allow_nan=False))
    if b.low_open and value == b.low:
        with pytest.raises(SettingError):
            b(repr(value))
        return
    assert b(repr(value)) == value


@FAST
@given(bounds(), st.sampled_from(["nan", "inf", "-inf"]))
def test_nan_and_the_infinities_are_never_in_range(b: Bounds, text: str) -> None:
    with pytest.raises(SettingError):
        b(text)
    assert not b.contains(float(text))


@FAST
@given(bounds(), number_text)
def test_as_a_flag_type_the_refusal_is_the_usage_error(b: Bounds, text: str) -> None:
    parse = as_flag_type(b)
    assert bounds_of(parse) is b
    try:
        expected = b(text)
    except SettingError as exc:
        with pytest.raises(argparse.ArgumentTypeError, match="^expected "):
            parse(text)
        assert str(exc).startswith("expected ")
    else:
        assert parse(text) == expected


def test_a_range_reads_as_people_write_it() -> None:
    assert Bounds(int, 1, 1_048_576).describe() == "a whole number from 1 to 1048576"
    assert Bounds(float, 0, 3600, "seconds", low_open=True).describe() == "seconds above 0 up to 3600"
    assert Bounds(float, 0, 1000, "milliseconds", zero="none").describe() == "milliseconds from 0 to 1000 (0: none)"
    with pytest.raises(SettingError, match=r"^expected a whole number from 1 to 256, like 4, got '100000'$"):
        Bounds(int, 1, 256, example="4")("100000")
