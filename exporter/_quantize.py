"""int8 heads and uint8 cut tensors, calibrated on real samples (``--quantize int8``).

Two things are quantized, for two reasons:

- the **head** itself, with onnxruntime's static quantization (QDQ, int8 per-channel
  weights, uint8 activations), so the board computes in int8 where its CPU gains from it —
  measure: on some CPUs int8 is slower than float32;
- the **cut tensor** on the link, as affine uint8 (:mod:`device_runtime.wire._quantization`),
  whatever the head's precision: four times fewer bytes. Its range comes from the float
  head's outputs on the calibration samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

from device_runtime import Quantization
from device_runtime.wire import affine_params
from exporter._datasets import ImageSet, hold_out
from exporter._validate import OnnxRunner
from splitedge.errors import ExportError

__all__ = ["HELD_OUT_SAMPLES", "MIN_CALIBRATION_SAMPLES", "MIN_HELD_OUT", "CalibrationSets", "calibration_sets",
           "cut_quantization", "head_outputs", "quantize_onnx", "uint8_link"]

MIN_CALIBRATION_SAMPLES = 32
#: Without --test-data, int8's accuracy is measured on calibration images held out of the
#: calibration: at least this many (one image moves top-1 by 1/32), at most HELD_OUT_SAMPLES.
MIN_HELD_OUT = 32
HELD_OUT_SAMPLES = 500
_BATCH = 16


@dataclass(frozen=True)
class CalibrationSets:
    calibration: np.ndarray  # (N, *input) what the int8 ranges are fitted on
    held_out: ImageSet | None  # what int8's accuracy is measured on when nothing else is given


def calibration_sets(
    images: ImageSet, samples: int, hold_out_for_accuracy: bool, seed: int = 0, needed_by: str = "int8",
) -> CalibrationSets:
    """Calibration images, and (``hold_out_for_accuracy``) a held-out part never calibrated on.

    Checked before anything is exported, so a set too small for both is one line that says how
    many images it takes and which flag gives them, and no bundle is half written. ``needed_by``
    names what calibrates in that line (int8, the k-bit cut codings, or both).
    """
    if samples < MIN_CALIBRATION_SAMPLES:
        raise ExportError(f"--calib-samples {samples}: {needed_by} calibration needs at least {MIN_CALIBRATION_SAMPLES}")
    held = min(HELD_OUT_SAMPLES, max(MIN_HELD_OUT, len(images) - samples)) if hold_out_for_accuracy else 0
    needed = MIN_CALIBRATION_SAMPLES + held
    if len(images) < needed:
        why = (f"{MIN_CALIBRATION_SAMPLES} to calibrate on and {held} held out to measure {needed_by}'s accuracy "
               "(or give --test-data to measure on, and all of them calibrate)" if held else "to calibrate on")
        raise ExportError(f"--calib-data {images.source} has {len(images)} images; {needed_by} needs at least {needed}: "
                          f"{why}; add images to it, or point --calib-data at a larger set")
    if not held:
        return CalibrationSets(images.subset(samples, seed).x, None)
    rest, held_out = hold_out(images, held, seed)
    return CalibrationSets(rest.subset(samples, seed).x, held_out)


class _Samples(CalibrationDataReader):
    def __init__(self, input_name: str, samples: np.ndarray) -> None:
        self.batches = iter([{input_name: samples[i : i + _BATCH]} for i in range(0, len(samples), _BATCH)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.batches, None)


def _check(samples: np.ndarray) -> None:
    if len(samples) < MIN_CALIBRATION_SAMPLES:
        raise ExportError(f"int8 calibration needs at least {MIN_CALIBRATION_SAMPLES} samples, got {len(samples)}")


def head_outputs(head: Path, samples: np.ndarray) -> np.ndarray:
    """The float head's cut on ``samples`` (``(N, *cut)``): what the link's uint8 and k-bit
    codings are calibrated on."""
    runner = OnnxRunner(head)
    output = runner.output_names[0]  # the cut (a head with an early exit has its logits second)
    return np.concatenate([runner({runner.input_names[0]: samples[i : i + _BATCH]})[output]
                           for i in range(0, len(samples), _BATCH)])


def uint8_link(outputs: np.ndarray) -> Quantization:
    """uint8 parameters covering ``outputs`` (a head's cut on the calibration samples)."""
    scale, zero_point = affine_params(outputs.min(), outputs.max())
    return Quantization(scale=scale, zero_point=zero_point, dtype="uint8")


def cut_quantization(head: Path, samples: np.ndarray) -> Quantization:
    """uint8 parameters covering the float head's outputs on the calibration samples."""
    _check(samples)
    return uint8_link(head_outputs(head, samples))


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
