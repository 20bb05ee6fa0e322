"""What runs a network on the board: backends (onnxruntime, LiteRT), preprocessing, the runner.

Sessions are created once per artifact and kept (:class:`DeviceRunner`); the camera frame
becomes the model input as torchvision would make it (:func:`preprocess`).
"""

from device_runtime.engine.backend import Backend, OnnxBackend, check_input, load_backend
from device_runtime.engine.litert_backend import LiteRTBackend
from device_runtime.engine.preprocess import preprocess
from device_runtime.engine.runner import AUTO, INT8_MARGIN, PRECISIONS, DeviceRunner, default_split, prefers_int8

__all__ = [
    "AUTO",
    "Backend",
    "DeviceRunner",
    "INT8_MARGIN",
    "LiteRTBackend",
    "OnnxBackend",
    "PRECISIONS",
    "check_input",
    "default_split",
    "load_backend",
    "prefers_int8",
    "preprocess",
]
