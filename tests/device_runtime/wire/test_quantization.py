"""uint8 affine quantization of cut tensors: exact zero, bounded error, saturation."""

from __future__ import annotations

import numpy as np
import pytest

from device_runtime.wire._quantization import affine_params, dequantize, quantize


@pytest.mark.parametrize(("low", "high"), [(-3.0, 5.0), (0.0, 6.0), (-2.0, -1.0), (0.0, 0.0), (1.5, 9.0)])
def test_round_trip_error_is_half_a_step(low: float, high: float) -> None:
    x = np.random.default_rng(0).uniform(low, high, size=(2, 16, 7, 7)).astype(np.float32)
    scale, zero_point = affine_params(low, high)
    q = quantize(x, scale, zero_point)
    assert q.dtype == np.uint8 and 0 <= zero_point <= 255
    assert np.abs(dequantize(q, scale, zero_point) - x).max() <= scale / 2 + 1e-6
    assert dequantize(quantize(np.zeros(1, np.float32), scale, zero_point), scale, zero_point)[0] == 0.0


def test_values_outside_the_calibrated_range_saturate() -> None:
    scale, zero_point = affine_params(0.0, 1.0)
    assert quantize(np.array([-5.0, 0.6, 99.0], np.float32), scale, zero_point).tolist() == [0, 153, 255]
