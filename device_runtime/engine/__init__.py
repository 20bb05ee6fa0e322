"""What runs a network on the board: backends (onnxruntime, LiteRT), preprocessing, the runner.

Sessions are created once per artifact and kept (:class:`DeviceRunner`); the camera frame
becomes the model input as torchvision would make it (:func:`preprocess`), or nearly so and at a
fraction of the cost with OpenCV (:func:`fast_preprocess`) where the bundle measured that the two
answer alike (:func:`preprocess_path`).
"""

from device_runtime.engine._backend import Backend, OnnxBackend, check_input, load_backend
from device_runtime.engine._cpus import session_options, usable_cpus
from device_runtime.engine._litert_backend import LiteRTBackend
from device_runtime.engine._fast_preprocess import fast_preprocess
from device_runtime.engine._preprocess import preprocess
from device_runtime.engine._preprocess_path import EXACT, FAST, FAST_AGREEMENT, PREPROCESS_PATHS, preprocess_path
from device_runtime.engine._runner import AUTO, INT8_MARGIN, PRECISIONS, DeviceRunner, default_split, prefers_int8

__all__ = [
    "AUTO",
    "Backend",
    "DeviceRunner",
    "EXACT",
    "FAST",
    "FAST_AGREEMENT",
    "INT8_MARGIN",
    "LiteRTBackend",
    "OnnxBackend",
    "PRECISIONS",
    "PREPROCESS_PATHS",
    "check_input",
    "default_split",
    "fast_preprocess",
    "load_backend",
    "prefers_int8",
    "preprocess",
    "preprocess_path",
    "session_options",
    "usable_cpus",
]
