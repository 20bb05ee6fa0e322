"""The bottom of splitedge: standard library only, imported by every other package.

The face holds what every package needs: the error family's base (:class:`SplitEdgeError`), the
checker of decoded JSON fields that names the offending field by its path (:class:`Fields`),
the one way to replace a file atomically (:func:`write_atomically`), the bounds every numeric
flag and setting is checked against where it enters (:class:`Bounds`), and the bundle
contract's words that the lower packages need too (the split words ``LOCAL`` and ``OFFLOAD``,
the formats and the precisions). Four public sub-faces hold groups of their own:
:mod:`splitedge.errors` (the narrow errors), :mod:`splitedge.reading` (bounded reading, the one
reader of a trace, its record kinds and the report's flags), :mod:`splitedge.lifecycle` (signals
and ``sd_notify``) and :mod:`splitedge.units` (systemd units). ``calibration`` and ``boards`` may
import this and nothing else of the project (DESIGN.md, "Parts and where they run").
"""

from splitedge._fields import Fields, join, shown
from splitedge._files import write_atomically
from splitedge._numbers import Bounds, SettingError, as_flag_type, bounds_of
from splitedge._words import FLOAT32, FORMATS, INT8, LOCAL, OFFLOAD, ONNX, PRECISIONS, TFLITE
from splitedge.errors import SplitEdgeError

__all__ = [
    "Bounds", "FLOAT32", "FORMATS", "Fields", "INT8", "LOCAL", "OFFLOAD", "ONNX", "PRECISIONS", "SettingError",
    "SplitEdgeError", "TFLITE", "as_flag_type", "bounds_of", "join", "shown", "write_atomically",
]
