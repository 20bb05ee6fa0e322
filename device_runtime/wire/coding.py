"""k-bit cut codings: a cut tensor sent as k in {8, 6, 4, 3, 2} bits a value, affine per channel.

``real = scale[c] * (q - zero[c])`` with ``q`` in ``0 .. 2**k - 1`` and ``c`` the value's channel
(axis 1: NCHW's channels, or a pooled ``[N, C]`` cut's features). Today's per-tensor uint8 gives
one scale to channels whose ranges differ by orders of magnitude; per channel, the same 8 bits keep
answers one scale loses (MobileNetV2's features_14: 0.988 of the float model's top-1 on held-out
photos against uint8's 0.922, bench/cut_codings.py), and fewer bits send fewer bytes where what
they keep is enough (issue 47). The scales and zero points are calibrated per split at build
time and stored in the manifest, so a frame carries its bits and the coding's name, nothing else.

Packing: eight values fill ``k`` bytes exactly: the bytes of a block of eight are its 64-bit
word's first ``k`` (the first value in the lowest bits, the word little-endian, the last block
padded with zeros), ``ceil(n / 8) * k`` bytes for ``n`` values, whatever ``k``, made in a handful
of numpy passes over groups of one or three bytes (no Python per value; 8 bits are the values as
they are).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from device_runtime.bundle import CUT_BITS, Coding
from splitedge import shown
from splitedge.errors import ProtocolError

__all__ = ["MIN_CHANNEL_VALUES", "CodedCut", "CutCoding", "coding_bits", "pack_bits", "packed_bytes", "unpack_bits"]

#: Clipping ratios tried per channel at calibration (of the range seen): fewer bits gain more from
#: clipping a channel's rare extremes than they lose on them; each channel keeps the one of least
#: squared error over the calibration samples.
_CLIPS = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4)


_BITS_OF = {f"k{bits}": bits for bits in CUT_BITS}
#: Values of a channel below which it gets no range of its own: the largest of n values is passed
#: by about one new value in n + 1, so a pooled cut's 1,280 channels calibrated on 64 images each
#: saturated about 20 values an image on held-out photos, and kept 0.89 of the float model's answers
#: at 8 bits, against 1.0 for one range over all channels (issue 47, bench/cut_codings.py).
MIN_CHANNEL_VALUES = 1024


def coding_bits(name: object) -> int:
    """The bits a coding's name (``k4``) stands for; :class:`ProtocolError` for a name this side
    does not know (a newer peer's, or a forged one), naming it and those it knows."""
    bits = _BITS_OF.get(name) if type(name) is str else None
    if bits is None:
        raise ProtocolError(f"unknown cut coding {shown(name)}: this side knows {', '.join(_BITS_OF)}; "
                            "update splitedge where it is older, or send the split's uint8 or float32 cut")
    return bits


@dataclass(frozen=True, slots=True)
class CodedCut:
    """How a cut sent in a coding is read: its packed bits travel as the frame's tensor (uint8, one
    dimension) and unpack to the float32 tensor of ``shape`` by the split's coding ``name``."""

    name: str
    shape: tuple[int, ...]

    def fields(self) -> dict[str, Any]:
        """The tensor map's own fields for it (what the bits decode to, and by which coding)."""
        return {"dtype": "float32", "shape": list(self.shape), "coding": self.name}


def packed_bytes(count: int, bits: int) -> int:
    """The bytes ``count`` values of ``bits`` bits take packed."""
    return -(-count // 8) * bits


def pack_bits(q: np.ndarray, bits: int) -> bytes:
    """Values in ``0 .. 2**bits - 1`` (uint8; not checked: :meth:`CutCoding.encode` clips them),
    packed eight to ``bits`` bytes."""
    flat = q.reshape(-1)
    whole = -(-flat.size // 8) * 8  # the last block padded with zeros
    if whole != flat.size:
        flat = np.concatenate([flat, np.zeros(whole - flat.size, np.uint8)])
    if bits == 8:
        return flat.tobytes()
    per, size = _group(bits)
    values = np.ascontiguousarray(flat.reshape(-1, per).T)  # a row per place in the group: contiguous passes
    out = np.zeros((size, values.shape[1]), np.uint8)
    for i in range(per):
        byte, shift = divmod(i * bits, 8)
        out[byte] |= values[i] << shift  # uint8: the bits past the byte fall off here...
        if shift + bits > 8:
            out[byte + 1] |= values[i] >> (8 - shift)  # ...and land in the next one
    return out.T.tobytes()


def unpack_bits(data: Any, count: int, bits: int) -> np.ndarray:
    """``count`` uint8 values from what :func:`pack_bits` packed; :class:`ProtocolError` when
    ``data`` is not exactly their packed length (nothing larger is allocated)."""
    expected = packed_bytes(count, bits)
    if len(data) != expected:
        raise ProtocolError(f"a {bits}-bit cut of {count} values packs into {expected} bytes, frame carries {len(data)}")
    raw = np.frombuffer(data, np.uint8)
    if bits == 8:
        return raw[:count]
    per, size = _group(bits)
    groups = raw.reshape(-1, size)
    out = np.empty((groups.shape[0], per), np.uint8)
    mask = (1 << bits) - 1
    for i in range(per):
        byte, shift = divmod(i * bits, 8)
        value = groups[:, byte] >> shift
        if shift + bits > 8:
            value |= groups[:, byte + 1] << (8 - shift)
        out[:, i] = value & mask
    return out.reshape(-1)[:count]


def _group(bits: int) -> tuple[int, int]:
    """The fewest values of ``bits`` bits that fill whole bytes, and those bytes: (2, 1) for 4 bits,
    (4, 1) for 2, (4, 3) for 6, (8, 3) for 3. Each divides a block of eight values, so a block's
    bytes are its 64-bit word's first ``bits``, built in byte-wide numpy passes (in 64-bit words a
    75,264-value cut took 0.22-0.29 ms to pack)."""
    per = 8 // math.gcd(bits, 8)
    return per, per * bits // 8


@dataclass(frozen=True, eq=False)
class CutCoding:
    """One split's coding: ``bits`` a value, a ``scale`` (float32) and a ``zero`` point per channel."""

    bits: int
    scale: np.ndarray
    zero: np.ndarray

    def __post_init__(self) -> None:
        if self.bits not in CUT_BITS:
            raise ValueError(f"a cut coding has {', '.join(map(str, CUT_BITS))} bits, not {self.bits!r}")
        scale, zero = np.asarray(self.scale), np.asarray(self.zero)
        if scale.ndim != 1 or scale.shape != zero.shape or scale.size == 0:
            raise ValueError(f"a cut coding needs one scale and one zero point per channel, got {scale.shape} and {zero.shape}")
        if not (np.isfinite(scale).all() and (scale > 0).all()):
            raise ValueError("a cut coding's scales must be positive and finite")
        if not (np.issubdtype(zero.dtype, np.integer) and ((zero >= 0) & (zero < 1 << self.bits)).all()):
            raise ValueError(f"a {self.bits}-bit coding's zero points must be integers in 0..{(1 << self.bits) - 1}")
        object.__setattr__(self, "scale", scale.astype(np.float32))
        object.__setattr__(self, "zero", zero.astype(np.uint8))
        # what encode and decode compute with: a multiply instead of a divide, the zero point as a float
        object.__setattr__(self, "_inverse", (1.0 / self.scale).astype(np.float32))
        object.__setattr__(self, "_zero", self.zero.astype(np.float32))

    @property
    def name(self) -> str:
        """How a frame and the manifest name it: ``k4`` for four bits."""
        return f"k{self.bits}"

    @property
    def channels(self) -> int:
        return int(self.scale.size)

    @classmethod
    def calibrate(cls, samples: np.ndarray, bits: int) -> CutCoding:
        """The coding of least squared error on ``samples`` (``[N, C, ...]``, the cut's outputs on
        the calibration images): per channel, its range widened to hold 0 (so 0 is exact) and
        clipped by the best of a few ratios; one range for every channel where a channel is seen
        fewer than :data:`MIN_CHANNEL_VALUES` times (a pooled cut: one value a channel an image)."""
        x = np.asarray(samples, np.float32)
        per_channel = np.moveaxis(x, 1, 0).reshape(x.shape[1], -1)  # [C, everything else]
        if per_channel.shape[1] < MIN_CHANNEL_VALUES:
            scale, zero = _least_error(per_channel.reshape(1, -1), bits)
            return cls(bits, np.repeat(scale, x.shape[1]), np.repeat(zero, x.shape[1]).astype(np.int64))
        scale, zero = _least_error(per_channel, bits)
        return cls(bits, scale, zero.astype(np.int64))

    @classmethod
    def of(cls, spec: Coding) -> CutCoding:
        """The coding a bundle's split lists (its values checked when the manifest was read)."""
        return cls(spec.bits, np.asarray(spec.scale, np.float32), np.asarray(spec.zero, np.int64))

    def spec(self, values_per_sample: int, agreement: float | None = None, top1: float | None = None) -> Coding:
        """What the manifest records of it: its values, the bytes a sample of ``values_per_sample``
        values crosses in, and what the build measured of its answers."""
        return Coding(self.bits, tuple(float(s) for s in self.scale), tuple(int(z) for z in self.zero),
                      packed_bytes(values_per_sample, self.bits), agreement, top1)

    def encode(self, x: np.ndarray) -> bytes:
        """A cut (``[N, C, ...]`` float32) as packed bits, rounding to nearest and saturating."""
        shape = (1, self.channels) + (1,) * (x.ndim - 2)
        q = x * self._inverse.reshape(shape)  # a new array: the cut is not written to
        np.rint(q, out=q)
        q += self._zero.reshape(shape)
        np.clip(q, 0, (1 << self.bits) - 1, out=q)
        return pack_bits(q.astype(np.uint8), self.bits)

    def check(self, shape: tuple[int, ...]) -> None:
        """:class:`ProtocolError` unless ``shape`` is a batch of this coding's channels."""
        if len(shape) < 2 or shape[1] != self.channels:
            raise ProtocolError(f"a {self.name} cut has {self.channels} channels (axis 1), the frame's shape is {list(shape)}")

    def decode(self, data: Any, shape: tuple[int, ...]) -> np.ndarray:
        """The float32 cut of ``shape`` from packed bits; :class:`ProtocolError` for a shape
        whose channels are not this coding's, or bytes that are not its packed length."""
        self.check(shape)
        real = unpack_bits(data, int(np.prod(shape)), self.bits).reshape(shape).astype(np.float32)
        view = (1, self.channels) + (1,) * (len(shape) - 2)
        real -= self._zero.reshape(view)
        real *= self.scale.reshape(view)
        return real


def _least_error(per_channel: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's (scale, zero) of least squared error over its values (``[rows, values]``): its
    range widened to hold 0, clipped by the best of :data:`_CLIPS`."""
    low = np.minimum(per_channel.min(axis=1), 0.0)
    high = np.maximum(per_channel.max(axis=1), 0.0)
    best: tuple[np.ndarray, np.ndarray] | None = None
    best_error = np.full(per_channel.shape[0], np.inf)
    levels = (1 << bits) - 1
    for clip in _CLIPS:
        scale, zero = _affine(low * clip, high * clip, levels)
        q = np.clip(np.rint(per_channel / scale[:, None]) + zero[:, None], 0, levels)
        error = np.square((q - zero[:, None]) * scale[:, None] - per_channel).mean(axis=1)
        better = error < best_error
        best_error = np.where(better, error, best_error)
        best = (scale, zero) if best is None else (np.where(better, scale, best[0]), np.where(better, zero, best[1]))
    assert best is not None
    return best


def _affine(low: np.ndarray, high: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    scale = (high - low) / levels
    scale = np.where(scale > 0, scale, 1.0).astype(np.float32)  # an all-zero channel still needs a valid scale
    zero = np.clip(np.rint(-low / scale), 0, levels)
    return scale, zero
