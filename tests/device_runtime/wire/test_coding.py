"""k-bit cut codings (issue 47): packing bit-exact with numpy's own bit order, per-channel scales
calibrated on samples, and every malformed coding or frame refused in one line."""

from __future__ import annotations

import math

import numpy as np
import pytest

from device_runtime.bundle import CUT_BITS
from device_runtime.wire.coding import MIN_CHANNEL_VALUES, CutCoding, pack_bits, packed_bytes, unpack_bits
from splitedge.errors import ProtocolError


def reference_pack(q: np.ndarray, bits: int) -> bytes:
    """Plain numpy: value i's bit b is bit i*bits + b of the stream, least significant first."""
    stream = np.unpackbits(q.astype(np.uint8).reshape(-1, 1), axis=1, bitorder="little")[:, :bits].reshape(-1)
    return np.packbits(stream, bitorder="little").tobytes().ljust(packed_bytes(q.size, bits), b"\0")


@pytest.mark.parametrize("bits", CUT_BITS)
@pytest.mark.parametrize("count", [1, 7, 8, 9, 61, 1280, 7840])
def test_packing_is_numpys_bit_order_and_unpacks_to_the_same_values(bits: int, count: int) -> None:
    q = np.random.default_rng(count * bits).integers(0, 1 << bits, count, dtype=np.uint8)
    packed = pack_bits(q, bits)
    assert packed == reference_pack(q, bits)
    assert len(packed) == math.ceil(count / 8) * bits
    assert np.array_equal(unpack_bits(packed, count, bits), q)


@pytest.mark.parametrize("extra", [-1, 1, 1 << 20])
def test_a_packed_cut_of_the_wrong_length_is_refused_before_anything_is_allocated(extra: int) -> None:
    with pytest.raises(ProtocolError, match=r"a 3-bit cut of 100 values packs into 39 bytes, frame carries"):
        unpack_bits(b"\0" * (packed_bytes(100, 3) + extra), 100, 3)


def cut(seed: int = 0) -> np.ndarray:
    """A ReLU cut whose channels' ranges span three orders of magnitude, as MobileNetV2's do."""
    rng = np.random.default_rng(seed)
    ranges = np.geomspace(0.01, 10.0, 16, dtype=np.float32).reshape(1, 16, 1, 1)
    return np.maximum(rng.standard_normal((48, 16, 5, 5)).astype(np.float32) * ranges, 0)


def relative_error(coding: CutCoding, x: np.ndarray) -> np.ndarray:
    """Per channel: RMS error of the decoded cut over the channel's RMS."""
    back = coding.decode(coding.encode(x), x.shape)
    return np.sqrt(np.square(back - x).mean(axis=(0, 2, 3)) / np.square(x).mean(axis=(0, 2, 3)))


def test_per_channel_scales_keep_small_channels_that_one_scale_loses() -> None:
    x, held_out = cut(0), cut(1)
    coding = CutCoding.calibrate(x, 8)
    one_scale = CutCoding(8, np.full(16, coding.scale.max()), np.zeros(16, np.int64))
    assert relative_error(coding, held_out).max() < 0.06  # held-out values past the calibrated range saturate
    assert relative_error(one_scale, held_out)[:4].min() > 0.5  # the smallest channels round to nothing


def test_fewer_bits_fewer_bytes_more_error_and_zero_stays_exact() -> None:
    x, held_out = cut(0), cut(1)
    errors = []
    for bits in CUT_BITS:
        coding = CutCoding.calibrate(x, bits)
        encoded = coding.encode(held_out)
        assert len(encoded) == held_out.size * bits // 8
        back = coding.decode(encoded, held_out.shape)
        assert back.dtype == np.float32 and back.shape == held_out.shape
        assert np.all(back[held_out == 0] == 0)
        errors.append(float(np.sqrt(np.square(back - held_out).mean() / np.square(held_out).mean())))
    assert errors == sorted(errors) and errors[0] < 0.03 and errors[-1] < 0.35


def test_the_decoded_cut_is_a_plain_numpy_dequantization() -> None:
    x = cut(2)
    coding = CutCoding.calibrate(x, 4)
    q = np.clip(np.rint(x / coding.scale.reshape(1, -1, 1, 1)) + coding.zero.reshape(1, -1, 1, 1), 0, 15)
    expected = (q - coding.zero.reshape(1, -1, 1, 1).astype(np.float32)) * coding.scale.reshape(1, -1, 1, 1)
    assert np.array_equal(coding.decode(coding.encode(x), x.shape), expected.astype(np.float32))


def test_the_manifests_record_round_trips_and_counts_the_bytes_a_sample_crosses_in() -> None:
    coding = CutCoding.calibrate(cut(3), 3)
    spec = coding.spec(16 * 5 * 5, agreement=0.97)
    assert (spec.name, spec.bytes_per_sample, spec.agreement, spec.top1) == ("k3", 150, 0.97, None)
    again = CutCoding.of(spec)
    assert again.bits == 3 and np.array_equal(again.scale, coding.scale) and np.array_equal(again.zero, coding.zero)


@pytest.mark.parametrize(("bits", "scale", "zero", "message"), [
    (5, [1.0], [0], "8, 6, 4, 3, 2 bits, not 5"),
    (4, [float("nan")], [0], "positive and finite"),
    (4, [0.0], [0], "positive and finite"),
    (4, [1.0], [16], "integers in 0..15"),
    (4, [1.0, 2.0], [0], "one scale and one zero point per channel"),
    (4, [], [], "one scale and one zero point per channel"),
])
def test_a_coding_made_in_code_is_checked_too(bits: int, scale: list, zero: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CutCoding(bits, np.asarray(scale, np.float32), np.asarray(zero, np.int64))


def test_a_frame_whose_channels_are_not_the_codings_is_refused() -> None:
    coding = CutCoding.calibrate(cut(4), 2)
    with pytest.raises(ProtocolError, match=r"a k2 cut has 16 channels \(axis 1\), the frame's shape is \[1, 8, 5, 5\]"):
        coding.decode(b"\0" * packed_bytes(200, 2), (1, 8, 5, 5))


def test_a_channel_seen_too_few_times_for_a_range_of_its_own_shares_one() -> None:
    """A pooled cut calibrated on 64 images sees each channel 64 times: the largest of them is
    passed on about one held-out value in 65, so its channels share one range (MIN_CHANNEL_VALUES)."""
    rng = np.random.default_rng(5)
    pooled = np.maximum(rng.standard_normal((64, 32)).astype(np.float32) * np.geomspace(0.1, 10, 32), 0)
    coding = CutCoding.calibrate(pooled, 8)
    assert np.unique(coding.scale).size == 1 and np.unique(coding.zero).size == 1
    spatial = np.repeat(np.repeat(pooled[:, :, None, None], 6, axis=2), 6, axis=3)  # 64 x 36 values a channel
    assert 64 * 36 >= MIN_CHANNEL_VALUES and np.unique(CutCoding.calibrate(spatial, 8).scale).size > 1
