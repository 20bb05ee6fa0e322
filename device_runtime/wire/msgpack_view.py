"""A msgpack reader whose ``bin`` values are views of the frame, not copies.

msgpack-python always copies a bin into a new ``bytes``. For a cut tensor of megabytes per
frame, that copy and the page faults of its fresh allocation cost more than everything else
the protocol does, so frames are *read* here (they are still *written* by msgpack-python).
Input comes from the network: every length is checked against the bytes left before it is
sliced or used to size a container, and nesting is bounded.
"""

from __future__ import annotations

import struct
from typing import Any

from splitedge.errors import ProtocolError

MAX_DEPTH = 16
# first byte -> struct reading the length (or the value) that follows it
_BE = {1: struct.Struct(">B"), 2: struct.Struct(">H"), 4: struct.Struct(">I"), 8: struct.Struct(">Q")}
_SIGNED = {0xD0: struct.Struct(">b"), 0xD1: struct.Struct(">h"), 0xD2: struct.Struct(">i"), 0xD3: struct.Struct(">q")}
_UINTS = {0xCC: _BE[1], 0xCD: _BE[2], 0xCE: _BE[4], 0xCF: _BE[8]}
_FLOATS = {0xCA: struct.Struct(">f"), 0xCB: struct.Struct(">d")}
_BINS = {0xC4: _BE[1], 0xC5: _BE[2], 0xC6: _BE[4]}
_STRS = {0xD9: _BE[1], 0xDA: _BE[2], 0xDB: _BE[4]}
_ARRAYS = {0xDC: _BE[2], 0xDD: _BE[4]}
_MAPS = {0xDE: _BE[2], 0xDF: _BE[4]}
_CONSTANTS = {0xC0: None, 0xC2: False, 0xC3: True}


def _truncated(need: int, pos: int, view: memoryview) -> ProtocolError:
    return ProtocolError(f"malformed msgpack: needs {need} bytes at offset {pos}, frame has {len(view) - pos}")


def _fixed(view: memoryview, pos: int, fmt: struct.Struct) -> tuple[Any, int]:
    end = pos + fmt.size
    if end > len(view):
        raise _truncated(fmt.size, pos, view)
    return fmt.unpack_from(view, pos)[0], end


def _slice(view: memoryview, pos: int, n: int) -> tuple[memoryview, int]:
    end = pos + n
    if end > len(view):
        raise _truncated(n, pos, view)
    return view[pos:end], end


def _text(view: memoryview, pos: int, n: int) -> tuple[str, int]:
    end = pos + n
    if end > len(view):
        raise _truncated(n, pos, view)
    try:
        return str(view[pos:end], "utf-8"), end
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"malformed msgpack: string is not UTF-8 ({exc})") from exc


def _count(view: memoryview, pos: int, n: int, min_item_bytes: int) -> int:
    # A header may claim 4 billion items; each needs at least one byte, so bound it first.
    if n * min_item_bytes > len(view) - pos:
        raise ProtocolError(f"malformed msgpack: container of {n} items in {len(view) - pos} bytes")
    return n


def _value(view: memoryview, pos: int, depth: int) -> tuple[Any, int]:
    """The value starting at ``pos`` and the offset after it. Plain functions and struct
    lookups keep this at a few microseconds for a request header."""
    if depth > MAX_DEPTH:
        raise ProtocolError(f"malformed msgpack: nested deeper than {MAX_DEPTH}")
    if pos >= len(view):
        raise _truncated(1, pos, view)
    b = view[pos]
    pos += 1
    if b <= 0x7F:
        return b, pos
    if b >= 0xE0:
        return b - 0x100, pos
    if b <= 0x8F:
        return _map(view, pos, b & 0x0F, depth)
    if b <= 0x9F:
        return _array(view, pos, b & 0x0F, depth)
    if b <= 0xBF:
        return _text(view, pos, b & 0x1F)
    if b in _CONSTANTS:
        return _CONSTANTS[b], pos
    if b in _BINS:
        n, pos = _fixed(view, pos, _BINS[b])
        return _slice(view, pos, n)
    if b in _UINTS:
        return _fixed(view, pos, _UINTS[b])
    if b in _SIGNED:
        return _fixed(view, pos, _SIGNED[b])
    if b in _FLOATS:
        return _fixed(view, pos, _FLOATS[b])
    if b in _STRS:
        n, pos = _fixed(view, pos, _STRS[b])
        return _text(view, pos, n)
    if b in _ARRAYS:
        n, pos = _fixed(view, pos, _ARRAYS[b])
        return _array(view, pos, _count(view, pos, n, 1), depth)
    if b in _MAPS:
        n, pos = _fixed(view, pos, _MAPS[b])
        return _map(view, pos, _count(view, pos, n, 2), depth)
    raise ProtocolError(f"malformed msgpack: type byte 0x{b:02x} (ext or reserved) is not used by this protocol")


def _array(view: memoryview, pos: int, n: int, depth: int) -> tuple[list[Any], int]:
    out = []
    for _ in range(n):
        item, pos = _value(view, pos, depth + 1)
        out.append(item)
    return out, pos


def _map(view: memoryview, pos: int, n: int, depth: int) -> tuple[dict[Any, Any], int]:
    out: dict[Any, Any] = {}
    for _ in range(n):
        key, pos = _value(view, pos, depth + 1)
        if not isinstance(key, (str, int)):
            raise ProtocolError(f"malformed msgpack: map key of type {type(key).__name__}")
        out[key], pos = _value(view, pos, depth + 1)
    return out, pos


def unpack(body: bytes | bytearray | memoryview) -> Any:
    """One msgpack value filling ``body`` exactly; bins are memoryviews into ``body``."""
    view = memoryview(body).cast("B")
    value, pos = _value(view, 0, 0)
    if pos != len(view):
        raise ProtocolError(f"malformed msgpack: {len(view) - pos} trailing bytes after the value")
    return value
