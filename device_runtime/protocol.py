"""The wire protocol: a pure bytes-in / bytes-out codec, no sockets.

A frame is a 4-byte big-endian length followed by a msgpack map. A tensor travels as
``{dtype, shape, data: bin}`` (plus ``scale``/``zero_point`` when quantized). The tensor,
when a message has one, is always the *last* entry of the map and ``data`` the last entry
of the tensor, so an encoded frame is ``prefix + raw tensor bytes``: :func:`encode` returns
the prefix and a memoryview of the array itself, and the transport writes both without
joining them — the tensor is never copied in user space on the way out.

The asyncio code on both sides only feeds :class:`FrameDecoder` and calls :func:`decode`;
every length is checked before it is trusted.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Iterator, Union

import msgpack
import numpy as np

from device_runtime.errors import ProtocolError

PROTOCOL_VERSION = 1
#: A 1×3×224×224 float32 input is 602 KB; 64 MiB leaves room for batches of large cuts
#: while still refusing a length prefix that would make the peer allocate gigabytes.
DEFAULT_MAX_FRAME_BYTES = 64 * 1024 * 1024
LENGTH = struct.Struct(">I")

OPS = ("hello", "infer", "ping", "stats")
ERROR_CODES = (
    "bad_request",
    "unknown_bundle",
    "unknown_split",
    "unauthorized",
    "overloaded",
    "deadline_exceeded",
    "internal",
)
DTYPES = ("float32", "float16", "uint8", "int8", "int32", "int64")
MAX_NDIM = 8

Buffer = Union[bytes, memoryview]


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
    packer = msgpack.Packer(use_bin_type=True)
    if tensor is None:
        body = packer.pack(message)
        return [LENGTH.pack(len(body)) + body]
    if "tensor" in message:
        raise ValueError("pass the tensor as the tensor argument, not inside the message")
    if tensor.dtype.name not in DTYPES:
        raise ProtocolError(f"dtype {tensor.dtype.name} cannot be sent; supported: {', '.join(DTYPES)}")
    # A non-contiguous array (a slice of a batch) must be made contiguous once; a contiguous
    # one is sent as-is.
    array = np.asarray(tensor)
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    data = memoryview(array.reshape(-1).view(np.uint8))  # a view: same memory, byte-addressed
    meta = {"dtype": array.dtype.name, "shape": list(array.shape), **tensor_fields}
    parts = [packer.pack_map_header(len(message) + 1)]
    parts += [packer.pack(k) + packer.pack(v) for k, v in message.items()]
    parts.append(packer.pack("tensor") + packer.pack_map_header(len(meta) + 1))
    parts += [packer.pack(k) + packer.pack(v) for k, v in meta.items()]
    parts.append(packer.pack("data") + _bin_header(data.nbytes))
    prefix = b"".join(parts)
    return [LENGTH.pack(len(prefix) + data.nbytes) + prefix, data]


def encode_bytes(message: dict[str, Any], tensor: np.ndarray | None = None, **tensor_fields: Any) -> bytes:
    """One contiguous frame; for tests and for transports that cannot write a list."""
    return b"".join(bytes(b) for b in encode(message, tensor, **tensor_fields))


@dataclass(frozen=True)
class Oversized:
    """A frame whose length prefix exceeds the limit; its body is skipped, never buffered."""

    length: int
    limit: int

    @property
    def message(self) -> str:
        return f"frame of {self.length} bytes exceeds the limit of {self.limit} bytes"


class FrameDecoder:
    """Incremental framing: feed it whatever the socket delivered, get whole frame bodies back.

    A frame split over many reads is reassembled into one preallocated buffer (one copy).
    An oversized frame yields :class:`Oversized` at once — before its body arrives — and
    its body is then discarded as it streams in, so the connection stays usable.
    """

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._header = bytearray()
        self._body: bytearray | None = None
        self._filled = 0
        self._skip = 0

    @property
    def idle(self) -> bool:
        """True between frames: nothing partial is buffered."""
        return not self._header and self._body is None and self._skip == 0

    def feed(self, data: Buffer) -> Iterator[Union[memoryview, Oversized]]:
        view = memoryview(data).cast("B")
        pos = 0
        while pos < len(view):
            if self._skip:
                n = min(self._skip, len(view) - pos)
                self._skip -= n
                pos += n
            elif self._body is None:
                n = min(LENGTH.size - len(self._header), len(view) - pos)
                self._header += view[pos : pos + n]
                pos += n
                if len(self._header) == LENGTH.size:
                    (length,) = LENGTH.unpack(self._header)
                    self._header.clear()
                    if length > self.max_frame_bytes:
                        self._skip = length
                        yield Oversized(length, self.max_frame_bytes)
                    else:
                        self._body = bytearray(length)
                        self._filled = 0
                        if length == 0:
                            yield from self._finish()
            else:
                n = min(len(self._body) - self._filled, len(view) - pos)
                self._body[self._filled : self._filled + n] = view[pos : pos + n]
                self._filled += n
                pos += n
                if self._filled == len(self._body):
                    yield from self._finish()

    def _finish(self) -> Iterator[memoryview]:
        body, self._body = self._body, None
        assert body is not None
        yield memoryview(body)


def decode(body: Buffer) -> dict[str, Any]:
    """Decode one frame body into a message; a ``tensor`` entry becomes a numpy array.

    Raises :class:`ProtocolError` (code ``bad_request``) for anything malformed: not
    msgpack, not a map, a tensor whose dtype, shape or byte count is wrong.
    """
    try:
        message = msgpack.unpackb(body, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated types for garbage input
        raise ProtocolError(f"malformed msgpack: {exc}") from exc
    if not isinstance(message, dict):
        raise ProtocolError(f"a frame must hold a msgpack map, got {type(message).__name__}")
    if "tensor" in message:
        try:
            message["tensor"], quantization = decode_tensor(message["tensor"])
        except ProtocolError as exc:
            # The map itself was fine, so the error reply can still carry the request's id.
            exc.request_id = message.get("id")
            raise
        if quantization is not None:
            message["quantization"] = quantization
    return message


def decode_tensor(obj: Any) -> tuple[np.ndarray, dict[str, Any] | None]:
    """Check a tensor map against its own header before viewing its bytes as an array.

    Returns the array (a read-only view of the frame, no copy) and, for a quantized
    tensor, its ``{scale, zero_point}``.
    """
    if not isinstance(obj, dict):
        raise ProtocolError("tensor must be a map with dtype, shape and data")
    dtype, shape, data = obj.get("dtype"), obj.get("shape"), obj.get("data")
    if dtype not in DTYPES:
        raise ProtocolError(f"tensor dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_NDIM
        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
    ):
        raise ProtocolError(f"tensor shape {shape!r} must be a list of at most {MAX_NDIM} non-negative integers")
    if not isinstance(data, bytes):
        raise ProtocolError("tensor data must be msgpack bin")
    expected = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    if expected != len(data):
        raise ProtocolError(f"tensor of shape {shape} {dtype} needs {expected} bytes, frame carries {len(data)}")
    array = np.frombuffer(data, dtype=dtype).reshape(shape)
    if "scale" not in obj and "zero_point" not in obj:
        return array, None
    scale, zero_point = obj.get("scale"), obj.get("zero_point")
    if not isinstance(scale, (int, float)) or not isinstance(zero_point, int):
        raise ProtocolError("a quantized tensor needs a numeric scale and an integer zero_point")
    return array, {"scale": float(scale), "zero_point": zero_point}


def error_reply(request_id: Any, code: str, message: str) -> dict[str, Any]:
    """The typed error every failure is reported as; ``code`` is one of :data:`ERROR_CODES`."""
    assert code in ERROR_CODES, code
    return {"id": request_id, "ok": False, "error": {"code": code, "message": message}}
