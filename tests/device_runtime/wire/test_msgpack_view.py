"""The bounded msgpack reader agrees with msgpack-python on everything the protocol sends, takes
a frame's bins as views, and refuses malformed input or input past its limits with a
ProtocolError before building it."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import time

from device_runtime.wire._msgpack_view import DecodeLimits, unpack
from device_runtime.wire._protocol import REQUEST_LIMITS
from splitedge.errors import ProtocolError

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=300)
    | st.binary(max_size=300)
)
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=20)
    | st.dictionaries(st.text(max_size=20) | st.integers(-1000, 1000), children, max_size=20),
    max_leaves=60,
)


def plain(value):
    """memoryview bins as bytes, for comparing with msgpack-python's own reading."""
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


@settings(max_examples=300, deadline=None)
@given(values)
def test_agrees_with_msgpack_python(value) -> None:
    packed = msgpack.packb(value, use_bin_type=True)
    assert plain(unpack(packed)) == msgpack.unpackb(packed, raw=False, strict_map_key=False)


@settings(max_examples=300, deadline=None)
@given(values, st.data())
def test_truncations_are_refused(value, data) -> None:
    packed = msgpack.packb(value, use_bin_type=True)
    cut = data.draw(st.integers(min_value=0, max_value=len(packed) - 1))
    with pytest.raises(ProtocolError, match="malformed msgpack"):
        unpack(packed[:cut])


def test_bins_past_the_header_are_views_not_copies() -> None:
    body = bytearray(msgpack.packb({"data": b"\x01" * 1000}, use_bin_type=True))
    data = unpack(body, DecodeLimits(header_bytes=64, max_array_len=8, max_map_len=8, max_str_len=64))["data"]
    assert isinstance(data, memoryview)
    body[-1] = 7  # the view sees the frame's buffer itself
    assert data[-1] == 7


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"\xdd\xff\xff\xff\xff", "exceeds max_array_len"),
        (b"\xdf\x7f\xff\xff\xff\x00", "exceeds max_map_len"),
        (b"\x81\xa1d\xc6\xff\xff\xff\xff", "malformed msgpack"),
        (b"\xd4\x01\x00", "exceeds max_ext_len"),
        (b"\xc1", "malformed msgpack"),
        (b"\xa2\xff\xfe", "not UTF-8"),
        (b"\x81\x90\x01", "unhashable type"),
        (b"\x81\xa1k\x81\xcb" + bytes(8) + b"\x01", "map key of type float"),
        (b"\x01\x02", "1 trailing bytes"),
        (b"\x91" * 25 + b"\x00", "nested deeper"),
        (b"\x91" * 3000 + b"\x00", "nested too deep"),
        (b"\x81\xa5route\xdd\x00\x0a\xae\x60" + b"\x80" * 700_000, "route: a list of 700000 items, at most 8"),
        (b"\x81\xa1x\xdd\x01\x00\x00\x00" + b"\x90" * (1 << 24), "exceeds max_array_len"),
        (b"\x81\xa1x\xdc\x00\x40" + (b"\xda\x03\xe8" + b"a" * 1000) * 64, "header .* is over 8192 bytes"),
    ],
)
def test_malformed_or_unbounded_input_is_refused_before_it_is_built(body: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        unpack(body, REQUEST_LIMITS)


def test_a_tensor_of_megabytes_is_a_view_and_costs_no_header_bytes() -> None:
    data = bytes(range(256)) * 8192  # 2 MiB: far past the request header's 8 KiB
    body = msgpack.packb({"op": "ping", "tensor": {"dtype": "uint8", "shape": [len(data)], "data": data}, "id": 3},
                         use_bin_type=True)
    message = unpack(body, REQUEST_LIMITS)
    assert isinstance(message["tensor"]["data"], memoryview) and message["tensor"]["data"] == data
    assert message["id"] == 3  # read after the view, by a fresh unpacker


def test_a_decode_bomb_is_refused_in_milliseconds_whatever_its_size() -> None:
    limits = DecodeLimits(header_bytes=16 * 1024, max_array_len=1 << 30, max_map_len=32, max_str_len=1024)
    bomb = b"\x81\xa1x\xdd" + (1 << 24).to_bytes(4, "big") + b"\x90" * (1 << 24)  # 16 Mi empty arrays
    started = time.thread_time()
    with pytest.raises(ProtocolError, match="over 16384 bytes"):
        unpack(bomb, limits)
    assert time.thread_time() - started < 1.0  # CPU of this thread: the header window, never the 16 MiB


@pytest.mark.parametrize("data", [b"", b"x"])
@pytest.mark.parametrize("tensor_bytes", [0, 20_000])  # read whole, and read past the header's window
def test_every_extension_type_is_refused_even_an_empty_one(data: bytes, tensor_bytes: int) -> None:
    """An empty ext passes ``max_ext_len=0``: it must still be refused (hypothesis found it as a
    readable map that then answered with its id, where an unreadable frame answers id-null)."""
    message = {"id": 1, "op": "infer", "tensor": {"data": bytes(tensor_bytes)}, "extra": msgpack.ExtType(5, data)}
    with pytest.raises(ProtocolError, match="extension type 5|max_ext_len"):
        unpack(msgpack.packb(message), REQUEST_LIMITS)


TENSOR = bytes(range(256)) * 128  # 32 KiB: past the request header's 8 KiB, as a cut tensor is


@pytest.mark.parametrize("message", [
    # As the protocol's encoders write it, the tensor's data last: read in one call of the C unpacker.
    {"op": "infer", "bundle": "b", "split": "s", "id": 7, "tensor": {"dtype": "uint8", "shape": [len(TENSOR)],
                                                                     "scale": 0.5, "zero_point": 3, "data": TENSOR}},
    # A ``data`` key with a bin before the tensor's, and one inside a string: the reader reads them.
    {"op": "infer", "data": b"\x00" * 9, "tensor": {"dtype": "uint8", "shape": [len(TENSOR)], "data": TENSOR}},
    {"split": "\xa4data", "note": b"\xa4data\xc5\x80\x00", "tensor": {"dtype": "uint8", "shape": [1], "data": TENSOR}},
    # The data not last in its map, the tensor not last in the frame, twice the key: the reader again.
    {"tensor": {"data": TENSOR, "dtype": "uint8", "shape": [len(TENSOR)]}, "id": 1},
    {"id": 1, "tensor": {"shape": [len(TENSOR)], "dtype": "uint8", "data": b"", "data2": TENSOR}},
    {"tensor": {"dtype": "uint8", "shape": [len(TENSOR)], "data": TENSOR, "data": TENSOR}, "route": [[1, 2]] * 3},
])
def test_a_frame_with_its_tensor_last_reads_as_msgpack_python_reads_it(message) -> None:
    body = msgpack.packb(message, use_bin_type=True)
    read = unpack(body, REQUEST_LIMITS)
    assert plain(read) == msgpack.unpackb(body, raw=False, strict_map_key=False)
    assert list(read) == list(message) and list(read["tensor"]) == list(message["tensor"])  # the sender's order
    data = read["tensor"]["data"] if read["tensor"]["data"] else read["tensor"]["data2"]
    assert isinstance(data, memoryview) and data.obj is body  # a view of the frame, not a copy


def test_a_frame_with_its_tensor_last_keeps_the_header_limits() -> None:
    deep = {"x": [[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]], "tensor": {"dtype": "uint8", "shape": [1], "data": TENSOR}}
    with pytest.raises(ProtocolError, match="nested deeper"):
        unpack(msgpack.packb(deep, use_bin_type=True), REQUEST_LIMITS)
    hops = {"route": list(range(9)), "tensor": {"dtype": "uint8", "shape": [1], "data": TENSOR}}
    with pytest.raises(ProtocolError, match="route: a list of 9 items, at most 8"):
        unpack(msgpack.packb(hops, use_bin_type=True), REQUEST_LIMITS)


def test_the_usual_request_is_read_in_one_call_not_entry_by_entry(monkeypatch) -> None:
    """An infer request as a board's encoder writes it never reaches the reader (17 µs against 4)."""
    import numpy as np

    from device_runtime.wire import _msgpack_view as msgpack_view
    from device_runtime.wire.ops import Hop, InferRequest
    from device_runtime.wire._protocol import decode, encode_bytes

    cut = np.arange(160 * 49, dtype=np.float32).reshape(1, 160, 7, 7)  # 31 KB, the test bundle's late cut
    route = (Hop("10.0.0.2:7767", "c", 2),)
    for request in (InferRequest(3, "b", "s", cut, 50.0), InferRequest(4, "b", "c", cut, None, None, 1, route)):
        monkeypatch.setattr(msgpack_view, "_Reader", None)  # the reader is not called
        head, tensor, fields = request.parts()
        message = decode(encode_bytes(head, tensor, **fields)[4:], REQUEST_LIMITS)
        assert (message["tensor"] == cut).all() and message["id"] == request.id
