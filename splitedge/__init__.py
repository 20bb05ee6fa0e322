"""The bottom of splitedge: standard library only, imported by every other package.

The one error family (:class:`SplitEdgeError` and its narrow subclasses), the checker of
decoded JSON fields that names the offending field by its path (:mod:`splitedge.fields`),
the one way to replace a file atomically (:mod:`splitedge.files`) and to read one a trace or a
setting names (:mod:`splitedge.reading`: regular files only, a size cap; with the one reader of a
trace, its record kinds and the report's flags), the bounds every numeric flag
and setting is checked against where it enters (:mod:`splitedge.numbers`), and the bundle
contract's words that the lower packages need too (:mod:`splitedge.words`:
the split words ``LOCAL`` and ``OFFLOAD``, the formats and the precisions). ``calibration``
and ``boards`` may import this and nothing else of the project (DESIGN.md, "Parts and where
they run").
"""

from splitedge.errors import SplitEdgeError
from splitedge.words import LOCAL, OFFLOAD

from splitedge.errors import (
    AuthenticationError, BackendError, BoardFitError, BundleError, CalibrationError, CameraError, ConfigError,
    CredentialsError, CutPointError, DeployError, ExportError, FrameRefused, HostUnavailableError,
    ModelSpecError, ProtocolError, RemoteError, ValidationError, brief,
)
from splitedge.fields import Fields, join, shown
from splitedge.files import write_atomically
from splitedge.reading import (
    FRAME, HEAD_TIMES, LINK_RATE, MAX_LINE_BYTES, RUN, NotReadable, add_report_arguments, file_kind, read_bounded,
    read_text_bounded, trace_records,
)
from splitedge.numbers import Bounds, SettingError, as_flag_type, bounds_of
from splitedge.lifecycle import (
    SIGNAL_EXIT, Runner, Stopped, exit_on_signals, notify, run_command, signals_held, stop_on_signals,
)
from splitedge.units import Credential, ServiceUnit, UNIT_DIR, enable_offline, enable_unit, write_unit
from splitedge.words import FLOAT32, FORMATS, INT8, ONNX, PRECISIONS, TFLITE

__all__ = [
    "AuthenticationError",
    "BackendError",
    "BoardFitError",
    "Bounds",
    "BundleError",
    "CalibrationError",
    "CameraError",
    "ConfigError",
    "Credential",
    "CredentialsError",
    "CutPointError",
    "DeployError",
    "ExportError",
    "FLOAT32",
    "FRAME",
    "FORMATS",
    "Fields",
    "HEAD_TIMES",
    "FrameRefused",
    "HostUnavailableError",
    "INT8",
    "LINK_RATE",
    "LOCAL",
    "MAX_LINE_BYTES",
    "ModelSpecError",
    "NotReadable",
    "OFFLOAD",
    "ONNX",
    "PRECISIONS",
    "ProtocolError",
    "RUN",
    "RemoteError",
    "Runner",
    "SIGNAL_EXIT",
    "ServiceUnit",
    "SettingError",
    "SplitEdgeError",
    "Stopped",
    "TFLITE",
    "UNIT_DIR",
    "ValidationError",
    "add_report_arguments",
    "as_flag_type",
    "bounds_of",
    "brief",
    "enable_offline",
    "enable_unit",
    "exit_on_signals",
    "join",
    "notify",
    "file_kind",
    "read_bounded",
    "read_text_bounded",
    "run_command",
    "shown",
    "signals_held",
    "stop_on_signals",
    "trace_records",
    "write_atomically",
    "write_unit",
]
