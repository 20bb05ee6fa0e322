"""The one error this package raises on purpose.

It derives from ``ValueError`` (bad timings, a bad file, an unknown split are bad values) and
from nothing of the project: calibration/ imports the standard library and numpy only, so the
runtimes convert it to their own ``SplitEdgeError`` where it enters them.
"""

from __future__ import annotations


class CalibrationError(ValueError):
    """Timings, a table or a calibration file are unusable; the message names the file, the field,
    what was expected and what was found."""
