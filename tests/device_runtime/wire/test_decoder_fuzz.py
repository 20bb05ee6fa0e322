"""The wire's decoding, end to end, as a host and a board run it on what a peer sends (issue 45).

A host cuts frames with :class:`FrameDecoder`, reads each with :func:`decode` under
:data:`REQUEST_LIMITS` and types it with :func:`parse_request` (``host_runtime._server``'s
``frame_received``); a board reads replies under :data:`REPLY_LIMITS` and types them with
:func:`parse_reply`. Whatever the bytes (arbitrary ones, valid frames cut short or mutated,
msgpack headers declaring gigabytes, nesting thousands deep, every field of every op given a
value of the wrong type), each frame ends in a typed message or a :class:`ProtocolError`
whose message is one line, never in another exception; and what decoding it allocates is
bounded by the frame, not by what the frame declares (``tracemalloc``'s peak, numpy's arrays
counted).

The property tests of the reader alone (tests/device_runtime/wire/test_msgpack_view.py) and of
a tensor's map alone (test_tensor_garbage.py) hold each piece; a live host is fuzzed over
sockets in tests/host_runtime/test_fuzz.py. ``derandomize``: the same examples every run, so
this cannot fail by chance; a few seconds in all.
"""

from __future__ import annotations

import struct
import tracemalloc
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from device_runtime.wire import (
    FrameDecoder, Oversized, PROTOCOL_VERSION, REPLY_LIMITS, REQUEST_LIMITS, decode, dequantize, encode_message,
)
from device_runtime.wire.ops import (
    ERROR_CODES, ErrorReply, HelloReply, HelloRequest, Hop, InferReply, InferRequest, LinksReply, LinksRequest,
    PingReply, PingRequest, ProfileReply, ProfileRequest, Quantization, StatsReply, StatsRequest, parse_reply,
    parse_request,
)
from splitedge.errors import ProtocolError

FUZZ = settings(max_examples=100, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

#: The largest frame the fuzzing's decoder takes: small, so that prefixes past it are refused too.
MAX_FRAME = 4096
#: What decoding one frame of at most a few KB may allocate at its peak, whatever it declares.
MEMORY_BOUND = 1 << 20


def _frame(message: Any) -> bytes:
    return b"".join(bytes(part) for part in encode_message(message))


#: One valid frame of each request the host reads, and of each reply a board reads (with its op).
REQUESTS = [
    HelloRequest(1),
    PingRequest(2),
    PingRequest(3, np.arange(16, dtype=np.uint8)),
    StatsRequest(4),
    InferRequest(5, "a" * 16, "features_4", np.linspace(-1, 1, 16, dtype=np.float32).reshape(1, 4, 2, 2),
                 deadline_ms=100.0),
    InferRequest(6, "bundle", "cut", np.arange(32, dtype=np.uint8).reshape(1, 2, 4, 4),
                 quantization=Quantization(0.05, 3), stage=1, route=(Hop("127.0.0.1:7767", "cut", 2),)),
    ProfileRequest(7, "bundle", (1, 2, 4), repeats=3, splits=("a", "b")),
    LinksRequest(8, ("127.0.0.1:7767", "[::1]:7768"), bytes=1000),
]
REPLIES = [
    ("hello", HelloReply(1, PROTOCOL_VERSION, {"bundle": ["a", "b"]}, False, 1 << 20, "cpu")),
    ("infer", InferReply(2, np.arange(10, dtype=np.float32).reshape(1, 10), 1.5, 0.25, 1)),
    ("ping", PingReply(3, 16)),
    ("stats", StatsReply(4, {"requests": {"infer": 3}})),
    ("profile", ProfileReply(5, {"a": {1: 2.0, 4: 6.5}})),
    ("infer", ErrorReply(6, "bad_request", "no")),
    ("links", LinksReply(7, {"127.0.0.1:7767": (1e8, 0.5)}, {"127.0.0.1:7768": "silent"})),
]
FRAMES = [_frame(r) for r in REQUESTS] + [_frame(r) for _, r in REPLIES]
OPS_OF_REPLIES = sorted({op for op, _ in REPLIES})


def _refused(exc: ProtocolError) -> None:
    """What a peer is answered with: one non-empty line and a typed code."""
    text = str(exc)
    assert text and "\n" not in text and "\r" not in text, repr(text)
    assert exc.code in ERROR_CODES, exc.code


def _as_host_and_board(body: Any) -> None:
    """``body`` read as a host reads a request and as a board reads each kind of reply; every
    outcome a typed message or a one-line :class:`ProtocolError`, the peak of what it allocated bounded."""
    size = len(memoryview(body).cast("B"))
    bound = MEMORY_BOUND + 8 * size
    peak = _peak(body)
    if peak > bound:  # read again: a first read may pay once for what is made once (a cache, a lazy import)
        peak = _peak(body)
    assert peak <= bound, f"decoding a frame of {size} bytes peaked at {peak} bytes"


def _peak(body: Any) -> int:
    """The most :func:`_read` of ``body`` held at once (numpy's arrays counted)."""
    tracemalloc.start()  # here only: tracing hypothesis's own drawing too made the file ten times slower
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        _read(body)
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def _read(body: Any) -> None:
    try:
        request = parse_request(decode(body, REQUEST_LIMITS))
    except ProtocolError as exc:
        _refused(exc)
    else:
        assert type(request).op in {type(r).op for r in REQUESTS}
        quantization = getattr(request, "quantization", None)
        if quantization is not None:  # what the host's worker does with it
            assert dequantize(request.tensor, quantization.scale, quantization.zero_point).dtype == np.float32
    for op in OPS_OF_REPLIES:
        try:
            parse_reply(op, decode(body, REPLY_LIMITS))
        except ProtocolError as exc:
            _refused(exc)


def _through_the_framing(stream: bytes, chunks: list[int]) -> int:
    """``stream`` as a socket hands it over, cut into ``chunks``: each frame the decoder completes
    is read by :func:`_as_host_and_board`, each oversized one answered. The frames seen."""
    decoder = FrameDecoder(max_frame_bytes=MAX_FRAME)
    seen, pos, sizes = 0, 0, iter(chunks)
    while pos < len(stream):
        n = max(1, next(sizes, len(stream)))
        for event in decoder.feed(stream[pos : pos + n]):
            seen += 1
            if isinstance(event, Oversized):
                assert event.length > MAX_FRAME and "\n" not in event.message
            else:
                assert len(event) <= MAX_FRAME
                _as_host_and_board(event)
        assert decoder.held <= MAX_FRAME  # a prefix's promise is held to the limit before its body comes
        pos += n
    return seen


# -- arbitrary bytes -----------------------------------------------------------------------------

#: Bytes that start msgpack values a frame may hold (maps, arrays, str, bin, ext, numbers, nil),
#: so that arbitrary input reaches past the first byte more often than random bytes would.
HEADS = st.sampled_from([b"\x81", b"\x82", b"\x8f", b"\xde\x00\x02", b"\xdf\xff\xff\xff\xff", b"\x91", b"\x9f",
                         b"\xdc\x00\x10", b"\xdd\xff\xff\xff\xff", b"\xa2op", b"\xa4ping", b"\xa6tensor",
                         b"\xa4data", b"\xc4\x10", b"\xc5\xff\xff", b"\xc6\xff\xff\xff\xff", b"\xd9\xff",
                         b"\xdb\xff\xff\xff\xff", b"\xc7\x00\x05", b"\xd4\x01", b"\xc1", b"\xc0", b"\xc3",
                         b"\xcf" + b"\xff" * 8, b"\xcb" + struct.pack(">d", float("nan")), b"\x00", b"\xff"])
msgpackish = st.lists(HEADS | st.binary(max_size=6), max_size=40).map(b"".join)
anything = st.binary(max_size=600) | msgpackish
chunking = st.lists(st.integers(1, 700), max_size=12)


@FUZZ
@given(body=anything)
def test_arbitrary_bytes_are_a_message_or_one_line(body: bytes) -> None:
    _as_host_and_board(body)


@FUZZ
@given(bodies=st.lists(anything, max_size=4), chunks=chunking, prefix_lies=st.lists(st.integers(-64, 64), max_size=4))
def test_arbitrary_frames_cut_anywhere_are_framed_and_read(bodies: list[bytes], chunks: list[int],
                                                           prefix_lies: list[int]) -> None:
    """Frames of arbitrary bodies, some with a length prefix that lies (the next frame's bytes
    taken as its own, or its own as the next's), arriving in chunks cut anywhere."""
    lies = iter(prefix_lies)
    stream = b"".join(struct.pack(">I", max(0, len(b) + next(lies, 0))) + b for b in bodies)
    _through_the_framing(stream, chunks)


# -- valid frames cut short and mutated ----------------------------------------------------------


def test_the_valid_frames_are_read_as_what_they_are() -> None:
    """The frames the mutations start from: each read back as the message it was made of."""
    for request in REQUESTS:
        frame = _frame(request)
        assert type(parse_request(decode(frame[4:], REQUEST_LIMITS))) is type(request)
    for op, reply in REPLIES:
        assert type(parse_reply(op, decode(_frame(reply)[4:], REPLY_LIMITS))) is type(reply)


@st.composite
def mutated_frames(draw: st.DrawFn) -> bytes:
    """A valid frame (prefix and all) with a few bytes flipped, set, inserted or deleted, or cut short."""
    frame = bytearray(draw(st.sampled_from(FRAMES)))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(frame)))
        kind = draw(st.sampled_from(("flip", "set", "insert", "delete", "cut")))
        if kind == "cut":
            del frame[at:]
        elif kind == "insert":
            frame[at:at] = draw(HEADS | st.binary(min_size=1, max_size=4))
        elif at < len(frame) and kind == "delete":
            del frame[at : at + draw(st.integers(1, 8))]
        elif at < len(frame):
            frame[at] = frame[at] ^ (1 << draw(st.integers(0, 7))) if kind == "flip" else draw(st.integers(0, 255))
    return bytes(frame)


@FUZZ
@given(frame=mutated_frames(), chunks=chunking)
def test_a_valid_frame_mutated_is_a_message_or_one_line(frame: bytes, chunks: list[int]) -> None:
    _as_host_and_board(frame[4:])  # the body as it is, whatever its prefix says
    _through_the_framing(frame, chunks)  # and as framed by its prefix, mutated or not


@FUZZ
@given(frames=st.lists(st.sampled_from(FRAMES), min_size=1, max_size=6), chunks=chunking)
def test_valid_frames_cut_anywhere_are_read_whole(frames: list[bytes], chunks: list[int]) -> None:
    assert _through_the_framing(b"".join(frames), chunks) == len(frames)


# -- declared lengths past what the frame holds ----------------------------------------------------

#: msgpack headers that declare a length (str, bin, ext, array, map), with the largest each width says.
LENGTHS = [2**32 - 1, 2**31, 2**24, 2**16, 2**16 - 1, 4096, 255]


def _declaring(kind: str, n: int) -> bytes:
    width = 1 if n < 2**8 else 2 if n < 2**16 else 4
    codes = {"str": {1: 0xD9, 2: 0xDA, 4: 0xDB}, "bin": {1: 0xC4, 2: 0xC5, 4: 0xC6}, "ext": {1: 0xC7, 2: 0xC8, 4: 0xC9},
             "array": {2: 0xDC, 4: 0xDD}, "map": {2: 0xDE, 4: 0xDF}}[kind]
    width = max(width, min(codes))
    return bytes([codes[width]]) + n.to_bytes(width, "big") + (b"\x01" if kind == "ext" else b"")


#: Where the declaring header goes: the whole body, under a key of the request's map, or under a
#: key of its tensor's map ("tensor.shape").
PLACES = ["top", "op", "id", "route", "peers", "batches", "tensor", "tensor.shape", "tensor.data", "tensor.dtype"]


def _placed(place: str, header: bytes, tail: bytes) -> bytes:
    """An infer request's map with ``header`` (and ``tail``, the few bytes that follow it) at ``place``."""
    head = b"\xa2op\xa5infer\xa2id\x07"
    if place == "top":
        return header + tail
    if place.startswith("tensor."):
        inner = {"dtype": b"\xa7float32", "shape": b"\x91\x04", "data": b"\xc4\x10" + bytes(16)}
        inner[place.split(".")[1]] = header + tail
        tensor = b"\x83" + b"".join(msgpack.packb(k) + v for k, v in inner.items())
        return b"\x83" + head + b"\xa6tensor" + tensor
    return b"\x83" + head + msgpack.packb(place) + header + tail


@FUZZ
@given(kind=st.sampled_from(["str", "bin", "ext", "array", "map"]), n=st.sampled_from(LENGTHS),
       place=st.sampled_from(PLACES), tail=st.binary(max_size=24))
def test_a_length_declared_past_the_frame_allocates_nothing_for_it(kind: str, n: int, place: str, tail: bytes) -> None:
    body = _placed(place, _declaring(kind, n), tail)
    _as_host_and_board(body)
    _through_the_framing(struct.pack(">I", len(body)) + body, [len(body) + 4])


@pytest.mark.parametrize("kind", ["array", "map", "str", "bin"])
def test_a_header_past_the_limit_with_a_megabyte_tensor_behind_it_is_one_line(kind: str) -> None:
    """The reader's path (a frame longer than the header's limit): a header declaring 4 G items
    ahead of a tensor of a megabyte, the frame read as it stands."""
    data = bytes(1 << 20)
    tensor = b"\x83\xa5dtype\xa5uint8\xa5shape\x91" + msgpack.packb(len(data)) + b"\xa4data\xc6" + struct.pack(">I", len(data))
    body = b"\x84\xa2op\xa4ping\xa2id\x01\xa1x" + _declaring(kind, 2**32 - 1) + b"\xa6tensor" + tensor + data
    with pytest.raises(ProtocolError) as refused:
        decode(body, REQUEST_LIMITS)
    _refused(refused.value)
    _as_host_and_board(body)


# -- nesting -------------------------------------------------------------------------------------


@FUZZ
@given(depth=st.integers(1, 3000) | st.sampled_from([15, 16, 17, 100_000]), kind=st.sampled_from(["array", "map"]),
       place=st.sampled_from(["top", "x", "route", "tensor", "tensor.shape", "id"]))
def test_nesting_of_any_depth_is_a_message_or_one_line(depth: int, kind: str, place: str) -> None:
    nested = (b"\x91" if kind == "array" else b"\x81\xa1k") * depth + b"\xc0"
    if place == "top":
        body = nested
    elif place.startswith("tensor"):
        tensor = {"dtype": b"\xa5uint8", "shape": b"\x91\x01", "data": b"\xc4\x01\x00"}
        if place == "tensor.shape":
            tensor["shape"] = nested
            body = b"\x83\xa2op\xa4ping\xa2id\x01\xa6tensor\x83" + b"".join(msgpack.packb(k) + v for k, v in tensor.items())
        else:
            body = b"\x83\xa2op\xa4ping\xa2id\x01\xa6tensor" + nested
    else:
        body = b"\x83\xa2op\xa4ping\xa2id\x01" + msgpack.packb(place) + nested
        if place == "id":
            body = b"\x82\xa2op\xa4ping\xa2id" + nested
    _as_host_and_board(body)


# -- wrong types into every field -----------------------------------------------------------------

EDGE_INTS = [0, 1, -1, 2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, -(2**63), 2**64 - 1]
junk = st.recursive(
    st.none() | st.booleans() | st.sampled_from(EDGE_INTS) | st.integers(-(2**63), 2**64 - 1)
    | st.floats() | st.text(max_size=12) | st.binary(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8) | st.integers(-5, 5),
                                                                        children, max_size=4),
    max_leaves=12,
)


def _maps() -> list[tuple[str | None, dict[str, Any]]]:
    """Every valid frame as the map it decodes to, its tensor a plain map (None: a request; else the reply's op)."""
    out: list[tuple[str | None, dict[str, Any]]] = []
    for op, message in [(None, r) for r in REQUESTS] + REPLIES:
        head, tensor, fields = message.parts()
        if tensor is not None:
            head = {**head, "tensor": {"dtype": tensor.dtype.name, "shape": list(tensor.shape), **fields,
                                       "data": tensor.tobytes()}}
        out.append((op, head))
    return out


MAPS = _maps()


@st.composite
def retyped(draw: st.DrawFn) -> tuple[str | None, dict[str, Any]]:
    """A valid message with one to three fields (its own, its tensor's or a new one) given junk, or removed."""
    op, message = draw(st.sampled_from(MAPS))
    message = {**message}
    if isinstance(message.get("tensor"), dict):
        message["tensor"] = {**message["tensor"]}
    for _ in range(draw(st.integers(1, 3))):
        target = message["tensor"] if isinstance(message.get("tensor"), dict) and draw(st.booleans()) else message
        key = draw(st.sampled_from([*sorted(target, key=str), "op", "id", "quantization", "extra"]))
        if draw(st.integers(0, 5)) == 0:
            target.pop(key, None)
        else:
            target[key] = draw(junk)
    return op, message


@FUZZ
@given(case=retyped())
def test_every_field_of_every_op_given_the_wrong_type_is_a_message_or_one_line(
        case: tuple[str | None, dict[str, Any]]) -> None:
    op, message = case
    body = msgpack.packb(message, use_bin_type=True)
    try:
        if op is None:
            parse_request(decode(body, REQUEST_LIMITS))
        else:
            parse_reply(op, decode(body, REPLY_LIMITS))
    except ProtocolError as exc:
        _refused(exc)
    _as_host_and_board(body)


@FUZZ
@given(message=st.sampled_from([m for op, m in MAPS if op is None and isinstance(m.get("tensor"), dict)]),
       scale=st.floats() | st.sampled_from([1e-320, 1e-45, 3.5e38, 1e300]) | st.integers(-1, 2**64 - 1),
       zero_point=st.integers(-1, 300) | st.floats())
def test_a_quantized_tensor_of_any_scale_is_dequantized_or_refused(message: dict[str, Any], scale: Any,
                                                                    zero_point: Any) -> None:
    """What the worker does with an accepted uint8 tensor: no exception, whatever the scale said."""
    tensor = {k: v for k, v in message["tensor"].items() if k != "data"}
    tensor.update(dtype="uint8", scale=scale, zero_point=zero_point, data=message["tensor"]["data"])
    tensor["shape"] = [len(tensor["data"])]
    body = msgpack.packb({**message, "tensor": tensor}, use_bin_type=True)
    with np.errstate(all="ignore"):  # a scale past float32's range dequantizes to inf: garbage in, not a crash
        _as_host_and_board(body)
