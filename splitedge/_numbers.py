"""Numbers from command lines and settings files, checked where they enter.

Every numeric flag of ``split-host`` and ``split-device`` and every numeric key of a board's
``device.toml`` is a :class:`Bounds`: whole or real, the least and the most it may be, and what
it counts. Its check refuses text that is no number, NaN, the infinities and anything outside
the bounds, in one line that says the range (``expected seconds above 0 up to 3600, like 5, got
'nan'``); as an argparse ``type`` (:func:`as_flag_type`) that line is the usage error, which
argparse prefixes with the flag's name (exit status 2). Each maximum is stated where its bounds
are defined, with why: past it a value is a typo or a mistake, never a setting (100,000
onnxruntime threads ended a board's run in SIGSEGV; an infinite batching wait timed every request
out; ``nan`` passed ``value < minimum`` and crashed later, issue 45).

Standard library only: the board imports it.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Bounds", "SettingError", "as_flag_type", "bounds_of"]


class SettingError(ValueError):
    """A setting's value refused by its check; the message says what is expected, with an example."""


def _number_text(value: float) -> str:
    """1048576, not 1.04858e+06: a range is read by people, and must be exact."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


@dataclass(frozen=True)
class Bounds:
    """A number a flag or a setting may take: ``low`` to ``high`` (``low`` itself refused when
    ``low_open``), whole when ``kind`` is int. Called with text, it answers the number or raises
    :class:`SettingError`."""

    kind: type  # int or float
    low: float
    high: float
    unit: str = ""  # what it counts, as a noun phrase: "seconds", "a TCP port"; "" a whole number / a number
    example: str = ""  # a value the message shows, like 4
    low_open: bool = False  # above ``low``, not from it
    zero: str = ""  # what 0 means, where it means something other than nothing ("none", "a free one")

    def __post_init__(self) -> None:
        assert self.kind in (int, float), f"Bounds kind is int or float, got {self.kind}"
        assert math.isfinite(self.low) and math.isfinite(self.high) and self.low <= self.high, (self.low, self.high)

    def describe(self) -> str:
        noun = self.unit or ("a whole number" if self.kind is int else "a number")
        low, high = _number_text(self.low), _number_text(self.high)
        said = f"{noun} above {low} up to {high}" if self.low_open else f"{noun} from {low} to {high}"
        return said + (f" (0: {self.zero})" if self.zero else "")

    def refusal(self, text: str) -> SettingError:
        like = f", like {self.example}" if self.example else ""
        return SettingError(f"expected {self.describe()}{like}, got {text!r}")

    def __call__(self, text: str) -> Any:
        try:
            value = self.kind(text)
        except (ValueError, TypeError, OverflowError):  # "many", a whole number written 4.0, "1e999" as int
            raise self.refusal(text) from None
        if not math.isfinite(value) or value < self.low or value > self.high or (self.low_open and value == self.low):
            raise self.refusal(text)
        return value

    def contains(self, value: float) -> bool:
        """Whether a number already parsed is within the bounds (a value in code, not text)."""
        return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                and self.low <= value <= self.high and not (self.low_open and value == self.low)
                and (self.kind is float or float(value).is_integer()))


def bounds_of(parse: Callable[[str], Any]) -> Bounds | None:
    """The :class:`Bounds` a flag's type or a setting's check applies to its numbers (the whole
    value's or each part's, for ``WIDTHxHEIGHT`` or ``1,2,4``), or None for a type that takes no
    number: what a test generated from the parsers walks."""
    if isinstance(parse, Bounds):
        return parse
    return getattr(parse, "bounds", None)


def as_flag_type(check: Callable[[str], Any]) -> Callable[[str], Any]:
    """``check`` as an argparse ``type``: its :class:`SettingError` becomes the usage error, one
    line after the flag's name (``argument --threads: expected a whole number from 1 to 256, ...``)."""

    def parse(value: str) -> Any:
        try:
            return check(value)
        except SettingError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = getattr(check, "__name__", "number")
    parse.bounds = bounds_of(check)  # type: ignore[attr-defined]
    parse.template = getattr(check, "template", "{}")  # type: ignore[attr-defined]
    return parse
