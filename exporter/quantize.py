"""int8 heads and uint8 cut tensors, calibrated on real samples (``--quantize int8``).

Two things are quantized, for two reasons:

- the **head** itself, with onnxruntime's static quantization (QDQ, int8 per-channel
  weights, uint8 activations), so the board computes in int8 where its CPU gains from it —
  measure: on some CPUs int8 is slower than float32;
- the **cut tensor** on the link, as affine uint8 (:mod:`device_runtime.wire.quantization`),
  whatever the head's precision: four times fewer bytes. Its range comes from the float
  head's outputs on the calibration samples.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

from device_runtime.bundle import Quantization
from device_runtime.wire.quantization import affine_params
from exporter.validate import OnnxRunner
from splitedge.errors import ExportError

__all__ = ["MIN_CALIBRATION_SAMPLES", "cut_quantization", "quantize_onnx"]

MIN_CALIBRATION_SAMPLES = 32
_BATCH = 16


class _Samples(CalibrationDataReader):
    def __init__(self, input_name: str, samples: np.ndarray) -> None:
        self.batches = iter([{input_name: samples[i : i + _BATCH]} for i in range(0, len(samples), _BATCH)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.batches, None)


def _check(samples: np.ndarray) -> None:
    if len(samples) < MIN_CALIBRATION_SAMPLES:
        raise ExportError(f"int8 calibration needs at least {MIN_CALIBRATION_SAMPLES} samples, got {len(samples)}")


def cut_quantization(head: Path, samples: np.ndarray) -> Quantization:
    """uint8 parameters covering the float head's outputs on the calibration samples."""
    _check(samples)
    runner = OnnxRunner(head)
    (output,) = runner.output_names
    outputs = [runner({runner.input_names[0]: samples[i : i + _BATCH]})[output] for i in range(0, len(samples), _BATCH)]
    scale, zero_point = affine_params(min(o.min() for o in outputs), max(o.max() for o in outputs))
    return Quantization(scale=scale, zero_point=zero_point, dtype="uint8")


def quantize_onnx(source: Path, target: Path, samples: np.ndarray) -> None:
    """Static int8 quantization of an ONNX head or full model, calibrated on ``samples`` (N, *input)."""
    _check(samples)
    try:
        quantize_static(
            str(source), str(target), _Samples(OnnxRunner(source).input_names[0], samples),
            quant_format=QuantFormat.QDQ, per_channel=True,
            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
        )
    except Exception as exc:  # onnxruntime.quantization raises bare ValueError/RuntimeError/KeyError
        raise ExportError(f"cannot quantize {source} to int8: {exc}") from exc
