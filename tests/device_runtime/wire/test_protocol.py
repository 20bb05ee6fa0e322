"""The codec alone: round trips, reassembly from small reads, bounds checks, zero-copy sends."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from device_runtime.wire._protocol import LENGTH, FrameDecoder, Oversized, decode, encode, encode_bytes
from splitedge.errors import ProtocolError

SHAPES = [(1, 32, 112, 112), (1, 1280, 7, 7), (3, 10), (7,), (2, 0, 4), ()]


def frames_of(decoder: FrameDecoder, data: bytes, chunk: int) -> list:
    out = []
    for start in range(0, len(data), chunk):
        out.extend(decoder.feed(data[start : start + chunk]))
    return out


@pytest.mark.parametrize("dtype", ["float32", "uint8"])
@pytest.mark.parametrize("shape", SHAPES)
def test_tensor_round_trip(shape: tuple[int, ...], dtype: str) -> None:
    rng = np.random.default_rng(0)
    array = (rng.standard_normal(shape) * 50).astype(dtype)
    data = encode_bytes({"op": "infer", "id": 7, "bundle": "b", "split": "s"}, array)
    (body,) = list(FrameDecoder().feed(data))
    message = decode(body)
    assert message["id"] == 7 and message["split"] == "s"
    assert message["tensor"].dtype == array.dtype
    assert message["tensor"].shape == array.shape
    np.testing.assert_array_equal(message["tensor"], array)


def test_quantized_tensor_keeps_scale_and_zero_point() -> None:
    q = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    message = decode(next(FrameDecoder().feed(encode_bytes({"id": 1}, q, scale=0.05, zero_point=128))))
    assert message["quantization"] == {"scale": 0.05, "zero_point": 128}
    np.testing.assert_array_equal(message["tensor"], q)


def test_encoded_frame_is_valid_msgpack_for_any_reader() -> None:
    """The hand-written prefix must be ordinary msgpack: another implementation can read it."""
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    data = encode_bytes({"op": "infer", "id": 3}, array)
    (length,) = LENGTH.unpack(data[:4])
    assert length == len(data) - 4
    plain = msgpack.unpackb(data[4:], raw=False)
    assert plain["tensor"]["shape"] == [2, 3] and plain["tensor"]["data"] == array.tobytes()


def test_tensor_is_sent_from_a_memoryview_of_the_array_itself() -> None:
    array = np.ones((1, 1280, 7, 7), dtype=np.float32)
    prefix, data = encode({"op": "infer", "id": 1}, array)
    assert isinstance(data, memoryview)
    assert np.shares_memory(np.frombuffer(data, dtype=np.float32), array)  # no copy made
    assert len(prefix) < 100  # only the header is built in Python


@pytest.mark.parametrize("chunk", [1, 3, 4, 5, 1000, 65536])
def test_frames_reassemble_from_many_small_reads(chunk: int) -> None:
    arrays = [np.full((2, 5), i, dtype=np.float32) for i in range(3)]
    stream = b"".join(encode_bytes({"id": i}, a) for i, a in enumerate(arrays))
    decoder = FrameDecoder()
    bodies = frames_of(decoder, stream, chunk)
    assert [decode(b)["id"] for b in bodies] == [0, 1, 2]
    for body, array in zip(bodies, arrays):
        np.testing.assert_array_equal(decode(body)["tensor"], array)
    assert decoder.idle


def test_oversized_frame_is_refused_from_its_prefix_and_skipped() -> None:
    decoder = FrameDecoder(max_frame_bytes=1000)
    big = encode_bytes({"id": 1}, np.zeros(2000, dtype=np.uint8))
    after = encode_bytes({"id": 2, "op": "ping"})
    # The refusal comes with the first 4 bytes, before any of the body is read.
    events = list(decoder.feed(big[:4]))
    assert len(events) == 1 and isinstance(events[0], Oversized)
    assert "exceeds the limit of 1000 bytes" in events[0].message
    # The body is discarded as it streams in; the next frame decodes normally.
    rest = frames_of(decoder, big[4:] + after, 333)
    assert [decode(b)["id"] for b in rest] == [2]


def test_malformed_msgpack_is_a_bad_request() -> None:
    with pytest.raises(ProtocolError, match="malformed msgpack") as info:
        decode(b"\xc1\xff\x00")
    assert info.value.code == "bad_request"


def test_non_map_frame_is_a_bad_request() -> None:
    with pytest.raises(ProtocolError, match="must hold a msgpack map"):
        decode(msgpack.packb([1, 2, 3]))


@pytest.mark.parametrize(
    ("tensor", "match"),
    [
        ({"dtype": "complex64", "shape": [1], "data": b"12345678"}, "dtype 'complex64'"),
        ({"dtype": "float32", "shape": [-1], "data": b""}, "non-negative integers"),
        ({"dtype": "float32", "shape": [2, 2], "data": b"\x00" * 12}, "needs 16 bytes, frame carries 12"),
        ({"dtype": "float32", "shape": [1], "data": "text"}, "must be msgpack bin"),
        ({"dtype": "uint8", "shape": [1], "data": b"\x00", "scale": "x", "zero_point": 0}, "numeric scale"),
        ("not a map", "must be a map"),
    ],
)
def test_bad_tensors_are_refused_with_the_request_id(tensor: object, match: str) -> None:
    body = msgpack.packb({"id": 42, "op": "infer", "tensor": tensor}, use_bin_type=True)
    with pytest.raises(ProtocolError, match=match) as info:
        decode(body)
    assert info.value.request_id == 42 and info.value.code == "bad_request"


def test_unsupported_dtype_cannot_be_sent() -> None:
    with pytest.raises(ProtocolError, match="cannot be sent"):
        encode({"id": 1}, np.zeros(2, dtype=np.complex64))
