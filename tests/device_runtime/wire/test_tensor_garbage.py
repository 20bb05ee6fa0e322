"""Any tensor map a peer can send decodes to an array that matches its header, or is refused.

Finding 5: a zero-size shape with a huge dimension (``[2**63, 2, 0]`` with no bytes) passed
the byte-count check (0 == 0) and numpy's ``reshape`` raised ``ValueError``: the host logged a
traceback and dropped the connection without a reply. The property below holds for every
map hypothesis draws: ``ProtocolError`` (``bad_request``) or a faithful array, nothing else.
"""

from __future__ import annotations

import math
from datetime import timedelta

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from device_runtime.wire._protocol import DTYPES, MAX_ELEMENTS, MAX_NDIM, decode, decode_tensor
from splitedge.errors import ProtocolError

#: Dimensions a peer may claim: small ones (so that some maps are valid), zeros, and the edges
#: of every integer width msgpack carries.
EDGES = [0, 0, 1, 2, 3, 2**31 - 1, 2**31, 2**32, 2**40, 2**40 + 1, 2**62, 2**63 - 1, 2**63, 2**64 - 1]
junk = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=8) | st.binary(
    max_size=8
)
dims = st.integers(0, 4) | st.sampled_from(EDGES)


def mostly(draw: st.DrawFn, good: st.SearchStrategy, bad: st.SearchStrategy) -> object:
    """``good`` four times in five: ``a | b`` would weigh every branch of ``junk`` like ``good``."""
    return draw(bad if draw(st.integers(0, 4)) == 0 else good)


@st.composite
def tensor_maps(draw: st.DrawFn) -> dict:
    """A tensor map with each field right, nearly right or garbage; the byte count often fits the shape."""
    dtype = mostly(draw, st.sampled_from(DTYPES), junk)
    # Mostly lists of non-negative integers (the shapes that reach numpy), some with a wrong entry.
    shape = mostly(draw, st.lists(dims, max_size=MAX_NDIM + 2), st.lists(dims | junk, max_size=MAX_NDIM + 2) | junk)
    fits = isinstance(shape, list) and all(type(d) is int and 0 <= d for d in shape) and dtype in DTYPES
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize if fits else None
    if nbytes is not None and nbytes <= 4096 and draw(st.booleans()):
        data = draw(st.binary(min_size=nbytes, max_size=nbytes))
    else:
        data = draw(st.binary(max_size=64) | junk)
    tensor = {"dtype": dtype, "shape": shape, "data": data}
    if draw(st.booleans()):
        tensor.update(scale=draw(junk | st.floats(1e-3, 1.0)), zero_point=draw(junk | st.integers(0, 255)))
    return tensor


def assert_faithful(array: np.ndarray, tensor: dict) -> None:
    assert array.dtype == np.dtype(tensor["dtype"]) and list(array.shape) == tensor["shape"]
    assert array.tobytes() == bytes(tensor["data"])


@settings(max_examples=600, deadline=timedelta(seconds=5), derandomize=True, database=None)
@given(tensor=tensor_maps())
def test_any_tensor_map_decodes_faithfully_or_is_a_bad_request(tensor: dict) -> None:
    body = msgpack.packb({"id": 9, "op": "infer", "tensor": tensor}, use_bin_type=True)
    try:
        message = decode(body)
    except ProtocolError as exc:
        assert exc.code == "bad_request" and exc.request_id == 9
    else:
        assert_faithful(message["tensor"], tensor)


@pytest.mark.parametrize(
    "shape",
    [[2**63, 2, 0], [2**64 - 1, 0], [2**62, 0], [2**31, 2**31, 0], [0, 2**63 - 1], [MAX_ELEMENTS + 1, 0],
     [2**20, 2**20, 2, 0]],
)
def test_zero_size_shapes_with_huge_dimensions_are_bad_requests(shape: list[int]) -> None:
    """Finding 5's frames: no bytes are needed, so only the bound on the dimensions refuses them."""
    with pytest.raises(ProtocolError, match="at most") as info:
        decode_tensor({"dtype": "float32", "shape": shape, "data": memoryview(b"")})
    assert info.value.code == "bad_request"


def test_zero_size_shape_within_the_bound_decodes() -> None:
    array, _ = decode_tensor({"dtype": "float32", "shape": [MAX_ELEMENTS, 0], "data": memoryview(b"")})
    assert array.shape == (MAX_ELEMENTS, 0) and array.size == 0
