"""The zero-copy msgpack reader agrees with msgpack-python on everything the protocol sends,
and refuses malformed input with a ProtocolError instead of crashing or allocating."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from device_runtime.wire.msgpack_view import MAX_DEPTH, unpack
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


def test_bins_are_views_not_copies() -> None:
    body = bytearray(msgpack.packb({"data": b"\x01" * 1000}, use_bin_type=True))
    data = unpack(body)["data"]
    assert isinstance(data, memoryview)
    body[-1] = 7  # the view sees the frame's buffer itself
    assert data[-1] == 7


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"\xdd\xff\xff\xff\xff", "container of 4294967295 items in 0 bytes"),
        (b"\xdf\x7f\xff\xff\xff\x00", "container of 2147483647 items"),
        (b"\xc6\xff\xff\xff\xff", "needs 4294967295 bytes"),
        (b"\xd4\x01\x00", "type byte 0xd4"),
        (b"\xc1", "type byte 0xc1"),
        (b"\xa2\xff\xfe", "not UTF-8"),
        (b"\x81\x90\x01", "map key of type list"),
        (b"\x01\x02", "1 trailing bytes"),
        (b"\x91" * (MAX_DEPTH + 5) + b"\x00", f"nested deeper than {MAX_DEPTH}"),
    ],
)
def test_malformed_input(body: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        unpack(body)
