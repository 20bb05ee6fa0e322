"""This board: which Raspberry Pi it is and what it has installed, and calibrating it
(timing its heads here, asking the host for its tails, probing the link)."""

from device_runtime.board.calibrate import DEFAULT_BATCHES, calibrate, calibration_for
from device_runtime.board.detect import (
    DetectedBoard,
    InstalledBackend,
    detect_board,
    installed_backends,
    resolve_backend,
)

__all__ = [
    "DEFAULT_BATCHES",
    "DetectedBoard",
    "InstalledBackend",
    "calibrate",
    "calibration_for",
    "detect_board",
    "installed_backends",
    "resolve_backend",
]
