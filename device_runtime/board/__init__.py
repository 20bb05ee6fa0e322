"""This board: which Raspberry Pi it is and what it has installed, calibrating it (timing its
heads here, asking the host for its tails, probing the link), its releases (``releases/<id>/``
and the ``current`` link, :class:`Layout`), its settings (``device.toml``) and its systemd unit.

The typed settings a run and a calibration take (one check per value, the flags' keys) are a
public sub-face of their own: :mod:`device_runtime.board.run_settings`. The rest is private.
"""

from device_runtime.board._calibrate import (
    DEFAULT_BATCHES, DEFAULT_FRAME, Rounds, Scene, calibrate, calibration_for, calibrations_for, precision_of,
    spread_warning,
)
from device_runtime.board._commands import add_commands, handler, settings_for
from device_runtime.board._detect import DetectedBoard, InstalledBackend, detect_board, installed_backends, resolve_backend
from device_runtime.board._release import Layout, UpdateDeferred, default_root
from device_runtime.board._service import CAMERA_GROUP, START_TIMEOUT_S, add_service_command, device_unit, install_service
from device_runtime.board._settings import run_checker, write_settings
from device_runtime.board._status import SERVICE, LastRun

__all__ = [
    "CAMERA_GROUP", "DEFAULT_BATCHES", "DEFAULT_FRAME", "DetectedBoard", "InstalledBackend", "LastRun", "Layout",
    "Rounds", "SERVICE", "START_TIMEOUT_S", "Scene", "UpdateDeferred", "add_commands", "add_service_command",
    "calibrate", "calibration_for", "calibrations_for", "default_root", "detect_board", "device_unit", "handler",
    "install_service", "installed_backends", "precision_of", "resolve_backend", "run_checker", "settings_for",
    "spread_warning", "write_settings",
]
