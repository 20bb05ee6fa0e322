"""The bundle contract's words that the packages below the runtimes need too.

They are words of the bundle contract (``device_runtime.bundle`` re-exports them with the
contract's other words, roles and tensor names, and that is where the runtimes and the
exporter import them from). ``calibration`` and ``boards`` may import nothing of the project
but this bottom package, and they need these: the split names of the latency model (DSC
Eq. 4-5: l = L and l = 0) and the formats and precisions a board times and runs. So they
are defined here, once.
"""

from __future__ import annotations

__all__ = ["FLOAT32", "FORMATS", "INT8", "LOCAL", "OFFLOAD", "ONNX", "PRECISIONS", "TFLITE"]

LOCAL = "local"  # l = L: the full model on the board, nothing crosses the link
OFFLOAD = "offload"  # l = 0: the input crosses, the full model runs on the host (DSC Eq. 5)

ONNX = "onnx"  # every bundle has it: onnxruntime on the board and the host
TFLITE = "tflite"  # heads and full model only, for boards whose profile runs LiteRT
FORMATS = (ONNX, TFLITE)

FLOAT32 = "float32"  # every artifact has a float32 variant
INT8 = "int8"  # quantized heads and full model, beside the float32 ones
PRECISIONS = (FLOAT32, INT8)
