"""This board: which Raspberry Pi it is and what it has installed, calibrating it (timing its
heads here, asking the host for its tails, probing the link), its releases (``releases/<id>/``
and the ``current`` link, :class:`Layout`) and its settings (``device.toml``)."""

from device_runtime.board.calibrate import DEFAULT_BATCHES, calibrate, calibration_for
from device_runtime.board.detect import (
    DetectedBoard,
    InstalledBackend,
    detect_board,
    installed_backends,
    resolve_backend,
)
from device_runtime.board.release import Layout, UpdateDeferred, default_root

__all__ = [
    "DEFAULT_BATCHES",
    "DetectedBoard",
    "InstalledBackend",
    "Layout",
    "UpdateDeferred",
    "calibrate",
    "calibration_for",
    "default_root",
    "detect_board",
    "installed_backends",
    "resolve_backend",
]
