"""This board: which Raspberry Pi it is and what it has installed, calibrating it (timing its
heads here, asking the host for its tails, probing the link), its releases (``releases/<id>/``
and the ``current`` link, :class:`Layout`) and its settings (``device.toml``)."""

from device_runtime.board.calibrate import DEFAULT_BATCHES, DEFAULT_FRAME, Rounds, Scene, calibrate, calibration_for
from device_runtime.board.detect import (
    DetectedBoard,
    InstalledBackend,
    detect_board,
    installed_backends,
    resolve_backend,
)
from device_runtime.board.release import Layout, UpdateDeferred, default_root

from device_runtime.board.calibrate import calibrations_for, precision_of, spread_warning
from device_runtime.board.commands import add_commands, handler, settings_for
from device_runtime.board.run_settings import (
    BATCH, FPS, FRAMES, KEYS, QUEUE, REPEATS, SUMMARY_EVERY, CalibrateSettings, Connection, RunSettings, Runtime,
    SettingError, as_flag_type, batches, calibrate_settings, run_settings,
)
from device_runtime.board.service import (
    CAMERA_GROUP, START_TIMEOUT_S, add_service_command, device_unit, install_service,
)
from device_runtime.board.settings import run_checker, write_settings
from device_runtime.board.status import LastRun, SERVICE

__all__ = [
    "BATCH",
    "CAMERA_GROUP",
    "CalibrateSettings",
    "Connection",
    "DEFAULT_BATCHES",
    "DEFAULT_FRAME",
    "DetectedBoard",
    "FPS",
    "FRAMES",
    "InstalledBackend",
    "KEYS",
    "LastRun",
    "Layout",
    "QUEUE",
    "REPEATS",
    "Rounds",
    "RunSettings",
    "Runtime",
    "SERVICE",
    "START_TIMEOUT_S",
    "SUMMARY_EVERY",
    "Scene",
    "SettingError",
    "UpdateDeferred",
    "add_commands",
    "add_service_command",
    "as_flag_type",
    "batches",
    "calibrate",
    "calibrate_settings",
    "calibration_for",
    "calibrations_for",
    "default_root",
    "detect_board",
    "device_unit",
    "handler",
    "install_service",
    "installed_backends",
    "precision_of",
    "resolve_backend",
    "run_checker",
    "run_settings",
    "settings_for",
    "spread_warning",
    "write_settings",
]
