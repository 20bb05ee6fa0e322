"""The wire protocol: a pure bytes-in / bytes-out codec, no sockets.

A frame is a 4-byte big-endian length followed by a msgpack map. A tensor travels as
``{dtype, shape, data: bin}`` (plus ``scale``/``zero_point`` when quantized). The tensor,
when a message has one, is always the *last* entry of the map and ``data`` the last entry
of the tensor, so an encoded frame is ``prefix + raw tensor bytes``: :func:`encode` returns
the prefix and a memoryview of the array itself, and the transport writes both without
joining them — the tensor is never copied in user space on the way out.

Frames are cut by :class:`~device_runtime.wire._framing.FrameDecoder` and read by
:mod:`~device_runtime.wire._msgpack_view`, whose bins are views: a received tensor is a view of
the buffer the socket wrote into. The asyncio code on both sides only feeds them.

This module turns bytes into maps and back; :mod:`~device_runtime.wire.ops` turns maps into
typed requests and replies and back (``ERROR_CODES``, ``OPS``, ``PROTOCOL_VERSION`` and
``error_reply`` live there and are re-exported here).
"""

from __future__ import annotations

import math
from typing import Any, Union

import msgpack
import numpy as np

from device_runtime.wire._framing import DEFAULT_MAX_FRAME_BYTES, LENGTH, FrameDecoder, Oversized  # noqa: F401 (re-exported)
from device_runtime.wire._msgpack_view import DecodeLimits, unpack
from device_runtime.wire.coding import CodedCut, coding_bits, packed_bytes
from device_runtime.wire.ops import (  # noqa: F401 (re-exported)
    ERROR_CODES,
    MAX_PROFILE_BATCH,
    MAX_ROUTE_HOPS,
    OPS,
    PROTOCOL_VERSION,
    Message,
    error_reply,
)
from splitedge import shown
from splitedge.errors import ProtocolError

DTYPES = ("float32", "float16", "uint8", "int8", "int32", "int64")
MAX_NDIM = 8
#: The most elements a shape may describe, its zero dimensions counted as 1: far above what any
#: frame carries (64 MiB is 2**26 bytes), far below where numpy's size arithmetic overflows
#: (2**63 bytes). Without it, ``[2**63, 2, 0]`` needs 0 bytes and numpy refuses to make it.
MAX_ELEMENTS = 1 << 40
_DTYPE_NAMES = {np.dtype(name): name for name in DTYPES}
_ITEMSIZES = {name: np.dtype(name).itemsize for name in DTYPES}
_DTYPE_OBJECTS = {name: np.dtype(name) for name in DTYPES}

Buffer = Union[bytes, bytearray, memoryview]

#: What a host reads a request with: a request's header is a few hundred bytes (a chain's route of
#: 8 hops at the longest addresses, 3 KB), its lists a route, a shape, a profile's batch sizes.
#: A frame past these is ``bad_request`` before anything is built for it.
REQUEST_LIMITS = DecodeLimits(
    header_bytes=8 * 1024, max_array_len=MAX_PROFILE_BATCH, max_map_len=32, max_str_len=1024,
    # A shape is held to max_array_len here and to MAX_NDIM by the tensor reader, which answers with
    # the request's id (a limit hit while reading the header can only answer with a null id).
    array_caps={"route": MAX_ROUTE_HOPS, "peers": MAX_ROUTE_HOPS, "batches": MAX_PROFILE_BATCH},
)
#: What a device reads a reply with: ``stats`` and ``hello`` carry a host's figures and bundles.
REPLY_LIMITS = DecodeLimits(header_bytes=1 << 20, max_array_len=4096, max_map_len=4096, max_str_len=64 * 1024)

_EMPTY_BIN = b"\xc4\x00"

#: Packers kept for reuse. ``msgpack.packb`` makes a Packer per call, and a Packer mallocs a
#: 256 KiB buffer: one per frame on each side. Beside a host's 250 KB frame body at the top of
#: the heap, that pushed the heap's free top past glibc's trim threshold on every request, so
#: each request gave ~500 KB back to the kernel and faulted it in again (40 page faults a
#: request on a standalone host; docs/benchmarks.md, issue 27). A pop and an append are atomic,
#: so threads and re-entry each get their own.
_PACKERS: list[msgpack.Packer] = []
#: A packer's buffer (msgpack's default); one that grew past it for a large message (a ``hello``,
#: ``stats``) is dropped, not kept at that size.
_KEEP_PACKER_BELOW = 256 * 1024


def _packb(value: Any) -> bytes:
    """``msgpack.packb(value, use_bin_type=True)`` with a reused packer."""
    packer = _PACKERS.pop() if _PACKERS else msgpack.Packer(use_bin_type=True)
    packed = packer.pack(value)  # autoreset: emptied for the next; a packer that raised is not kept
    if len(packed) < _KEEP_PACKER_BELOW:
        _PACKERS.append(packer)
    return packed


def _bin_header(n: int) -> bytes:
    """msgpack's bin 8/16/32 header; msgpack.Packer has no public way to write one alone."""
    if n < 1 << 8:
        return b"\xc4" + n.to_bytes(1, "big")
    if n < 1 << 16:
        return b"\xc5" + n.to_bytes(2, "big")
    return b"\xc6" + n.to_bytes(4, "big")


def encode(message: dict[str, Any], tensor: np.ndarray | None = None, **tensor_fields: Any) -> list[Buffer]:
    """Encode one frame as ``[prefix, tensor memoryview]`` (or ``[frame]`` with no tensor).

    ``message`` must not contain the key ``tensor``; ``tensor_fields`` (``scale``,
    ``zero_point``) are stored beside the tensor's dtype and shape.
    """
    if tensor is None:
        body = _packb(message)
        return [LENGTH.pack(len(body)) + body]
    if "tensor" in message:
        raise ValueError("pass the tensor as the tensor argument, not inside the message")
    array = np.asarray(tensor)
    dtype = _DTYPE_NAMES.get(array.dtype)  # a dict lookup: dtype.name costs microseconds per call
    if dtype is None:
        raise ProtocolError(f"dtype {array.dtype.name} cannot be sent; supported: {', '.join(DTYPES)}")
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)  # a slice of a batch: made contiguous once
    # A view: same memory, byte-addressed (a cast costs a third of reshape and view; it refuses an empty shape).
    data = memoryview(array).cast("B") if array.size else memoryview(array.reshape(-1).view(np.uint8))
    # Pack everything with an empty placeholder bin as the very last value (dicts keep their
    # order), then swap the placeholder's 2-byte header for the real one: one packb call,
    # and the tensor's bytes follow the prefix untouched.
    tensor_map = {"dtype": dtype, "shape": list(array.shape), **tensor_fields, "data": b""}
    packed = _packb({**message, "tensor": tensor_map})
    assert packed.endswith(_EMPTY_BIN), "the tensor must be packed last"
    prefix = packed[: -len(_EMPTY_BIN)] + _bin_header(data.nbytes)
    return [LENGTH.pack(len(prefix) + data.nbytes) + prefix, data]


def encode_message(message: Message) -> list[Buffer]:
    """:func:`encode` for a typed request or reply of :mod:`device_runtime.wire.ops`."""
    head, tensor, tensor_fields = message.parts()
    return encode(head, tensor, **tensor_fields)


def encode_bytes(message: dict[str, Any], tensor: np.ndarray | None = None, **tensor_fields: Any) -> bytes:
    """One contiguous frame; for tests and for transports that cannot write a list."""
    return b"".join(bytes(b) for b in encode(message, tensor, **tensor_fields))


def decode(body: Buffer, limits: DecodeLimits = REPLY_LIMITS) -> dict[str, Any]:
    """Decode one frame body into a message; a ``tensor`` entry becomes a numpy array. A host
    passes :data:`REQUEST_LIMITS`: its peers are anyone.

    Raises :class:`ProtocolError` (code ``bad_request``) for anything malformed: not
    msgpack, not a map, a tensor whose dtype, shape or byte count is wrong.
    """
    message = unpack(body, limits)
    if not isinstance(message, dict):
        raise ProtocolError(f"a frame must hold a msgpack map, got {type(message).__name__}")
    message.pop("quantization", None)  # set below from the tensor's own fields, never taken from the wire
    message.pop("coding", None)
    if "tensor" in message:
        try:
            message["tensor"], fields = decode_tensor(message["tensor"])
        except ProtocolError as exc:
            # The map itself was fine, so the error reply can still carry the request's id.
            exc.request_id = message.get("id")
            raise
        if fields is not None:
            message["coding" if isinstance(fields, CodedCut) else "quantization"] = fields
    return message


def decode_tensor(obj: Any) -> tuple[np.ndarray, dict[str, Any] | CodedCut | None]:
    """Check a tensor map against its own header before viewing its bytes as an array.

    Returns the array (a view of the frame's buffer, no copy) and, for a quantized
    tensor, its ``{scale, zero_point}``; for a coded one (``coding``: ``k4``), its packed bits
    (uint8, one dimension) and the :class:`CodedCut` they unpack to.
    """
    if not isinstance(obj, dict):
        raise ProtocolError("tensor must be a map with dtype, shape and data")
    dtype, shape, data = obj.get("dtype"), obj.get("shape"), obj.get("data")
    if dtype not in DTYPES:
        raise ProtocolError(f"tensor dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    count = _element_count(shape)
    if not isinstance(data, memoryview):
        raise ProtocolError("tensor data must be msgpack bin")
    if "coding" in obj:
        return _coded(obj, dtype, shape, count, data)
    expected = count * _ITEMSIZES[dtype]
    if expected != len(data):
        raise ProtocolError(f"tensor of shape {shape} {dtype} needs {expected} bytes, frame carries {len(data)}")
    # The array over the frame's bytes, shape and size checked above: a third of frombuffer + reshape.
    array = np.ndarray(shape, _DTYPE_OBJECTS[dtype], data)
    if "scale" not in obj and "zero_point" not in obj:
        return array, None
    scale, zero_point = obj.get("scale"), obj.get("zero_point")
    scale_ok = type(scale) in (int, float) and 0 < scale < math.inf  # NaN fails too; type(): bool is no number
    if not scale_ok or type(zero_point) is not int or not 0 <= zero_point <= 255:
        raise ProtocolError(
            "a quantized tensor needs a positive finite numeric scale and an integer zero_point in 0..255, "
            f"got scale={shown(scale)}, zero_point={shown(zero_point)}"
        )
    return array, {"scale": float(scale), "zero_point": zero_point}


def _coded(obj: dict[str, Any], dtype: str, shape: list[int], count: int, data: memoryview) -> tuple[np.ndarray, CodedCut]:
    """A coded cut's packed bits, exactly as many bytes as its shape's values take at its bits
    (so unpacking allocates the shape's bound and nothing more)."""
    name = obj["coding"]
    bits = coding_bits(name)
    if dtype != "float32" or "scale" in obj or "zero_point" in obj or len(shape) < 2:
        raise ProtocolError(f"a {name} tensor decodes to float32 [batch, channels, ...] and carries no scale or "
                            f"zero_point, got {dtype} {shape}{' with scale/zero_point' if 'scale' in obj else ''}")
    expected = packed_bytes(count, bits)
    if expected != len(data):
        raise ProtocolError(f"a {name} tensor of shape {shape} packs into {expected} bytes, frame carries {len(data)}")
    return np.frombuffer(data, np.uint8), CodedCut(name, tuple(shape))


def _element_count(shape: Any) -> int:
    """The elements of a well-formed shape; :class:`ProtocolError` for anything numpy must not be asked for."""
    if not isinstance(shape, list) or len(shape) > MAX_NDIM:
        raise ProtocolError(f"tensor shape {shown(shape)} must be a list of at most {MAX_NDIM} non-negative integers")
    count, extent = 1, 1  # extent: the zero dimensions counted as 1
    for d in shape:
        if type(d) is not int or d < 0:  # type(): bool is no dimension
            raise ProtocolError(f"tensor shape {shown(shape)} must be a list of at most {MAX_NDIM} non-negative integers")
        count *= d
        extent *= d or 1
    if extent > MAX_ELEMENTS:
        raise ProtocolError(
            f"tensor shape {shown(shape)} is out of bounds: every dimension, and the product of the non-zero ones, "
            f"must be at most {MAX_ELEMENTS}"
        )
    return count
