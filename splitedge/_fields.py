"""The one checker of decoded JSON fields, for every file splitedge reads (manifests, calibrations).

Every message starts with the offending field's path (``calibration.json: model.splits[2].rtt_ms``,
``bundle/manifest.json: full[0].bytes``), says what was expected and quotes what was found. A
reader raises its own error class (a bundle reader :class:`~splitedge.errors.BundleError`, the
calibration readers :class:`~splitedge.errors.CalibrationError`), so each reader holds a
:class:`Fields` made for that class. Standard library only: ``calibration`` and ``boards`` use it.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from splitedge.errors import SplitEdgeError

__all__ = ["Fields", "join", "shown"]

_SHOWN_CHARS = 60  # a wrong value is quoted in the message, but a whole nested object is not


def shown(value: Any) -> str:
    """``repr(value)``, cut short: enough to recognise the value, never a whole nested object."""
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 1] + "…"


def join(path: str, child: str) -> str:
    """``calibration.json:`` + ``model`` -> ``calibration.json: model``; ``model`` + ``rtt_ms`` -> ``model.rtt_ms``."""
    return f"{path} {child}" if path.endswith(":") else f"{path}.{child}"


class Fields:
    """Checks that return the checked value or raise ``error`` naming the field by ``path``.

    Paths are relative to what the caller knows (``head_ms[4]`` in a constructor); a reader
    that knows where the object sits in its file prefixes them with :meth:`located`.
    """

    def __init__(self, error: type[SplitEdgeError]) -> None:
        self.error = error

    @contextmanager
    def located(self, path: str) -> Iterator[None]:
        """Prefix the field path of any ``error`` raised inside with ``path``."""
        try:
            yield
        except self.error as exc:
            raise self.error(join(path, str(exc))) from None

    def obj(self, value: Any, path: str) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.error(f"{path}: expected an object, got {shown(value)}")
        return value

    def array(self, value: Any, path: str) -> list[Any] | tuple[Any, ...]:
        if not isinstance(value, (list, tuple)):
            raise self.error(f"{path}: expected a list, got {shown(value)}")
        return value

    def member(self, parent: Mapping[str, Any], key: str, path: str) -> Any:
        """``parent[key]``, where ``path`` is the parent's path."""
        if key not in parent:
            raise self.error(f"{join(path, key)}: missing")
        return parent[key]

    def text(self, value: Any, path: str, empty: bool = False) -> str:
        """A string, non-empty unless ``empty`` (a label may be blank; an id may not)."""
        if not isinstance(value, str) or not (value or empty):
            raise self.error(f"{path}: expected a {'' if empty else 'non-empty '}string, got {shown(value)}")
        return value

    def integer(self, value: Any, path: str, minimum: int) -> int:
        # bool is an int to Python, but "repeats": true is still a mistake.
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise self.error(f"{path}: expected an integer >= {minimum}, got {shown(value)}")
        return value

    def number(self, value: Any, path: str, minimum: float = 0.0) -> float:
        """A finite float >= ``minimum``; timings, sizes and rates are never negative or NaN."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(f"{path}: expected a number, got {shown(value)}")
        if not math.isfinite(value) or value < minimum:
            bound = "" if minimum == -math.inf else f" >= {minimum:g}"
            raise self.error(f"{path}: expected a finite number{bound}, got {shown(value)}")
        return float(value)

    def flag(self, value: Any, path: str) -> bool:
        if not isinstance(value, bool):
            raise self.error(f"{path}: expected true or false, got {shown(value)}")
        return value

    def choice(self, value: Any, path: str, choices: Collection[str]) -> str:
        """One of a closed set of words (a format, a precision, a role)."""
        if value not in choices:
            raise self.error(f"{path}: expected one of {', '.join(choices)}, got {shown(value)}")
        return value
