"""End-to-end latency of each split as a function of batch size and link rate (DSC Eq. 4-6).

``head_ms`` is measured on the board, ``tail_ms`` on the host, each at a few batch sizes: the
time is not linear in the batch size (DSC §3, after Eq. 6), so it is measured per batch size
and only interpolated between the measured ones.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from splitedge import LOCAL, CalibrationError, Fields, join, shown

_fields = Fields(CalibrationError)  # field checks raising this package's error

_MS_PER_S = 1000.0
_BITS_PER_BYTE = 8


@dataclass(frozen=True)
class SplitTimings:
    """Measured costs of one split: what crosses the link and how long each side computes.

    The dicts are copied and checked on construction (batch -> finite ms >= 0), so a caller
    mutating its own dict later cannot change a model already in use.
    """

    split: str  # a split id of the bundle, or LOCAL, or OFFLOAD
    bytes_per_sample: int  # bytes that cross the link per sample (0 for LOCAL; the input's bytes for OFFLOAD)
    head_ms: dict[int, float]  # batch size -> median ms on the board (empty for OFFLOAD)
    tail_ms: dict[int, float]  # batch size -> median ms on the host (empty for LOCAL)
    _head_batches: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _tail_batches: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _fields.text(self.split, "split")
        _fields.integer(self.bytes_per_sample, "bytes_per_sample", minimum=0)
        for name in ("head_ms", "tail_ms"):
            times = _fields.obj(getattr(self, name), name)
            checked = {
                _fields.integer(b, f"{name}[{b!r}]", minimum=1): _fields.number(ms, f"{name}[{b!r}]")
                for b, ms in times.items()
            }
            object.__setattr__(self, name, checked)
        object.__setattr__(self, "_head_batches", tuple(sorted(self.head_ms)))
        object.__setattr__(self, "_tail_batches", tuple(sorted(self.tail_ms)))

    def head_at(self, batch: int) -> float:
        """Board time at ``batch``: measured, else interpolated (see :func:`_at`)."""
        return _at(self.head_ms, self._head_batches, batch)

    def tail_at(self, batch: int) -> float:
        """Host time at ``batch``: measured, else interpolated (see :func:`_at`)."""
        return _at(self.tail_ms, self._tail_batches, batch)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: batch sizes become string keys, as JSON objects require."""
        return {
            "split": self.split,
            "bytes_per_sample": self.bytes_per_sample,
            "head_ms": {str(b): ms for b, ms in sorted(self.head_ms.items())},
            "tail_ms": {str(b): ms for b, ms in sorted(self.tail_ms.items())},
        }

    @classmethod
    def from_dict(cls, d: Any, where: str) -> SplitTimings:
        """Read :meth:`to_dict`'s output; errors name the field under ``where``."""
        d = _fields.obj(d, where)
        args = {name: _fields.member(d, name, where) for name in ("split", "bytes_per_sample")}
        for name in ("head_ms", "tail_ms"):
            path = join(where, name)
            raw = _fields.obj(_fields.member(d, name, where), path)
            args[name] = {_batch_key(k, f"{path}[{k!r}]"): v for k, v in raw.items()}
        with _fields.located(where):  # values are checked by __post_init__, named under `where`
            return cls(**args)


def _batch_key(key: Any, path: str) -> int:
    """JSON object keys are strings: ``"4"`` -> 4."""
    if isinstance(key, str) and key.isdecimal() and int(key) >= 1:
        return int(key)
    raise CalibrationError(f"{path}: expected a batch size (a positive integer), got key {shown(key)}")


def _at(times: Mapping[int, float], batches: tuple[int, ...], batch: int) -> float:
    """A time at any batch size from the measured ones.

    Exact where measured; piecewise linear between measured sizes; beyond the largest, the line
    through the last two (flat if they decrease: measurement noise must not predict a negative
    time); below the smallest, or beyond a single measured size, proportional to the batch.
    Nothing measured (the board side of OFFLOAD, the host side of LOCAL) costs nothing.
    """
    exact = times.get(batch)
    if exact is not None:
        return exact
    if not batches:
        return 0.0
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise CalibrationError(f"batch size must be an integer >= 1, got {batch!r}")
    i = bisect_left(batches, batch)
    if i == 0 or (i == len(batches) == 1):
        return times[batches[0]] * batch / batches[0]
    if i == len(batches):
        b0, b1 = batches[-2], batches[-1]
        slope = max((times[b1] - times[b0]) / (b1 - b0), 0.0)
        return times[b1] + slope * (batch - b1)
    b0, b1 = batches[i - 1], batches[i]
    return times[b0] + (times[b1] - times[b0]) * (batch - b0) / (b1 - b0)


@dataclass(frozen=True)
class LatencyModel:
    """Predicted end-to-end time of every split (DSC Eq. 4-5) and the best of them (DSC Eq. 6)."""

    splits: tuple[SplitTimings, ...]  # unique split names; ties in best() go to the one listed first
    rtt_ms: float  # one request's round trip with no payload, paid by every remote split, not by LOCAL
    _by_name: dict[str, SplitTimings] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "splits", tuple(self.splits))
        object.__setattr__(self, "rtt_ms", _fields.number(self.rtt_ms, "rtt_ms"))
        if not self.splits:
            raise CalibrationError("splits: expected at least one split, got none")
        by_name: dict[str, SplitTimings] = {}
        for i, timings in enumerate(self.splits):
            if timings.split in by_name:
                raise CalibrationError(f"splits[{i}].split: {timings.split!r} is listed twice")
            by_name[timings.split] = timings
        object.__setattr__(self, "_by_name", by_name)

    @property
    def names(self) -> tuple[str, ...]:
        """Split names in listing order, the order that breaks ties in :meth:`best`."""
        return tuple(self._by_name)

    def timings(self, split: str) -> SplitTimings:
        """The measured timings of ``split``; an unknown name is refused naming the known ones."""
        timings = self._by_name.get(split)
        if timings is None:
            raise CalibrationError(f"unknown split {split!r}; the latency model has {', '.join(self._by_name)}")
        return timings

    def predict_ms(self, split: str, batch: int, rate_bps: float) -> float:
        """End-to-end ms of a batch through ``split`` over a link of ``rate_bps`` bit/s.

        DSC Eq. 4: head(B) + 8 * bytes_per_sample * B / r + tail(B), plus the round trip every
        request pays whatever its payload. OFFLOAD has no head, which makes it DSC Eq. 5;
        LOCAL is T_L = head(B): nothing crosses, so neither the rate nor the round trip counts.
        """
        timings = self.timings(split)
        if split == LOCAL:
            return timings.head_at(batch)
        if not rate_bps > 0:  # also refuses NaN
            raise CalibrationError(f"link rate must be > 0 bit/s, got {rate_bps!r}")
        transfer_ms = _BITS_PER_BYTE * timings.bytes_per_sample * batch * _MS_PER_S / rate_bps
        return timings.head_at(batch) + transfer_ms + timings.tail_at(batch) + self.rtt_ms

    def terms_ms(self, split: str, batch: int, rate_bps: float) -> dict[str, float]:
        """:meth:`predict_ms` term by term, as a run measures them: ``head`` (the board's part),
        ``transfer`` (8 * bytes_per_sample * B / r plus the round trip: what a request's round trip
        takes less the host's time) and ``tail`` (the host's compute). They add up to
        :meth:`predict_ms` (DSC Eq. 4); LOCAL has only its head (T_L)."""
        timings = self.timings(split)
        if split == LOCAL:
            return {"head": timings.head_at(batch), "transfer": 0.0, "tail": 0.0}
        if not rate_bps > 0:  # also refuses NaN
            raise CalibrationError(f"link rate must be > 0 bit/s, got {rate_bps!r}")
        transfer_ms = _BITS_PER_BYTE * timings.bytes_per_sample * batch * _MS_PER_S / rate_bps + self.rtt_ms
        return {"head": timings.head_at(batch), "transfer": transfer_ms, "tail": timings.tail_at(batch)}

    def best(self, batch: int, rate_bps: float, allowed: Collection[str] | None = None) -> str:
        """DSC Eq. 6: the split of least predicted time, among ``allowed`` when given.

        ``allowed`` drops options (OFFLOAD under a privacy rule, DSC §3; every remote split
        without a host); names it holds that the model lacks are ignored. Ties go to the split
        listed first, so the answer is deterministic.
        """
        best_name, best_ms = None, float("inf")
        for timings in self.splits:
            if allowed is not None and timings.split not in allowed:
                continue
            ms = self.predict_ms(timings.split, batch, rate_bps)
            if ms < best_ms or best_name is None:
                best_name, best_ms = timings.split, ms
        if best_name is None:
            raise CalibrationError(
                f"none of the allowed splits ({', '.join(sorted(allowed or ())) or 'none'}) "
                f"is in the latency model ({', '.join(self._by_name)})"
            )
        return best_name

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, for calibration.json's ``model``."""
        return {"rtt_ms": self.rtt_ms, "splits": [t.to_dict() for t in self.splits]}

    @classmethod
    def from_dict(cls, d: Any, where: str = "model") -> LatencyModel:
        """Read :meth:`to_dict`'s output; errors name the field under ``where``."""
        d = _fields.obj(d, where)
        path = join(where, "splits")
        raw = _fields.array(_fields.member(d, "splits", where), path)
        splits = tuple(SplitTimings.from_dict(s, f"{path}[{i}]") for i, s in enumerate(raw))
        rtt_ms = _fields.member(d, "rtt_ms", where)
        with _fields.located(where):
            return cls(splits=splits, rtt_ms=rtt_ms)
