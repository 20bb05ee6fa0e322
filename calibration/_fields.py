"""Checks of decoded JSON and of constructor arguments that name the offending field by its path.

Shared by the dataclasses' ``__post_init__`` (paths relative to the object, such as
``head_ms[4]``) and by the ``from_dict`` readers, which prefix those paths with where the object
sits in the file (``calibration.json: model.splits[2].``) through :func:`located`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from splitedge.errors import CalibrationError

_SHOWN_CHARS = 60  # a wrong value is quoted in the message, but a whole nested object is not


def shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 1] + "…"


def join(path: str, child: str) -> str:
    """``calibration.json:`` + ``model`` -> ``calibration.json: model``; ``model`` + ``rtt_ms`` -> ``model.rtt_ms``."""
    return f"{path} {child}" if path.endswith(":") else f"{path}.{child}"


@contextmanager
def located(path: str) -> Iterator[None]:
    """Prefix the field path of any CalibrationError raised inside with ``path``."""
    try:
        yield
    except CalibrationError as exc:
        raise CalibrationError(join(path, str(exc))) from None


def obj(value: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise CalibrationError(f"{path}: expected an object, got {shown(value)}")
    return value


def array(value: Any, path: str) -> list[Any] | tuple[Any, ...]:
    if not isinstance(value, (list, tuple)):
        raise CalibrationError(f"{path}: expected a list, got {shown(value)}")
    return value


def member(parent: Mapping[str, Any], key: str, path: str) -> Any:
    """``parent[key]``, where ``path`` is the parent's path."""
    if key not in parent:
        raise CalibrationError(f"{join(path, key)}: missing")
    return parent[key]


def text(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise CalibrationError(f"{path}: expected a non-empty string, got {shown(value)}")
    return value


def integer(value: Any, path: str, minimum: int) -> int:
    # bool is an int to Python, but "repeats": true is still a mistake.
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise CalibrationError(f"{path}: expected an integer >= {minimum}, got {shown(value)}")
    return value


def number(value: Any, path: str, minimum: float = 0.0) -> float:
    """A finite float >= ``minimum``; timings, sizes and rates are never negative or NaN."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CalibrationError(f"{path}: expected a number, got {shown(value)}")
    if not math.isfinite(value) or value < minimum:
        raise CalibrationError(f"{path}: expected a finite number >= {minimum:g}, got {shown(value)}")
    return float(value)


def batch_key(key: Any, path: str) -> int:
    """JSON object keys are strings: ``"4"`` -> 4."""
    if isinstance(key, str) and key.isdecimal() and int(key) >= 1:
        return int(key)
    raise CalibrationError(f"{path}: expected a batch size (a positive integer), got key {shown(key)}")
