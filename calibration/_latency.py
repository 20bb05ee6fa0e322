"""End-to-end latency of each split as a function of batch size and link rate (DSC Eq. 4-6),
plus the board's preprocessing, and the frame rate a stream through a split can sustain.

``head_ms`` is measured on the board, ``tail_ms`` on the host, each at a few batch sizes: the
time is not linear in the batch size (DSC §3, after Eq. 6), so it is measured per batch size
and only interpolated between the measured ones. DSC's input x arrives ready for the network;
a camera's frame does not: the board resizes, crops and normalises it first, and on a small
board that costs as much as a head (issue 29: 124 ms against a 107 ms local head on a quarter
core). So the model adds a preprocessing term, the same for every option (full offload sends
the preprocessed input too), timed at the camera's frame size.

For a stream, latency is not the whole story: a camera delivers a frame every 1/fps s whatever
the board does, and a pipeline can only answer as many frames as its slowest stage lets through
(the DNN-slicing simulator's frame drop rate is exactly what a stage slower than the frame
interval causes). :meth:`LatencyModel.frames_per_s` is that bound, :func:`drop_share` the part
of a camera's frames it leaves unanswered.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from splitedge import Fields, LOCAL, join, shown
from splitedge.errors import CalibrationError

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
    """Predicted end-to-end time of every split (DSC Eq. 4-5, plus the board's preprocessing),
    the best of them (DSC Eq. 6), and the frame rate a stream through each can sustain."""

    splits: tuple[SplitTimings, ...]  # unique split names; ties in best() go to the one listed first
    rtt_ms: float  # one request's round trip with no payload, paid by every remote split, not by LOCAL
    # One frame's preprocessing on the board (camera frame -> model input), at the frame size it
    # was timed at; every option pays it once per frame. None: not timed (a calibration made
    # before it was), counted as 0 and left out of terms_ms, so a report can say it is missing.
    preprocess_ms: float | None = None
    # The live camera's frame interval (ms) a stream through the model must keep up with; None: no
    # camera pace (a recording, a calibration), latency alone decides. Not part of the file: it is the
    # run's camera, not the board's (:meth:`paced`).
    interval_ms: float | None = None
    _by_name: dict[str, SplitTimings] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "splits", tuple(self.splits))
        object.__setattr__(self, "rtt_ms", _fields.number(self.rtt_ms, "rtt_ms"))
        if self.preprocess_ms is not None:
            object.__setattr__(self, "preprocess_ms", _fields.number(self.preprocess_ms, "preprocess_ms"))
        if self.interval_ms is not None and not _fields.number(self.interval_ms, "interval_ms") > 0:
            raise CalibrationError(f"interval_ms: expected a frame interval > 0 ms, got {self.interval_ms!r}")
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
        """End-to-end ms of a batch through ``split`` over a link of ``rate_bps`` bit/s: the sum of
        :meth:`terms_ms`.

        DSC Eq. 4: head(B) + 8 * bytes_per_sample * B / r + tail(B), plus the round trip every
        request pays whatever its payload, plus B frames' preprocessing. OFFLOAD has no head,
        which makes it DSC Eq. 5; LOCAL is T_L = head(B) (and the preprocessing): nothing
        crosses, so neither the rate nor the round trip counts.
        """
        return sum(self.terms_ms(split, batch, rate_bps).values())

    def terms_ms(self, split: str, batch: int, rate_bps: float) -> dict[str, float]:
        """:meth:`predict_ms` term by term, as a run measures them: ``preprocess`` (B frames made
        model inputs, one after another on the board's compute thread; only when it was timed),
        ``head`` (the board's part), ``transfer`` (8 * bytes_per_sample * B / r plus the round
        trip: what a request's round trip takes less the host's time) and ``tail`` (the host's
        compute). DSC Eq. 4 is head + transfer + tail; LOCAL has only its head (T_L)."""
        timings = self.timings(split)
        terms = {} if self.preprocess_ms is None else {"preprocess": self.preprocess_ms * batch}
        if split == LOCAL:
            return {**terms, "head": timings.head_at(batch), "transfer": 0.0, "tail": 0.0}
        transfer_ms = self._crossing_ms(timings, batch, rate_bps) + self.rtt_ms
        return {**terms, "head": timings.head_at(batch), "transfer": transfer_ms, "tail": timings.tail_at(batch)}

    def stages_ms(self, split: str, batch: int, rate_bps: float) -> dict[str, float]:
        """How long each stage of a stream holds one batch of ``split``: ``board`` (preprocessing
        and the head, which run one after the other on the board's one compute thread, so they
        are one stage), ``link`` (the batch's bytes at ``rate_bps``: the link carries one payload
        at a time) and ``host`` (the tail). The round trip is left out: requests overlap in
        flight, so it delays each frame without slowing the stream. LOCAL is the board alone."""
        timings = self.timings(split)
        board = (self.preprocess_ms or 0.0) * batch + timings.head_at(batch)
        if split == LOCAL:
            return {"board": board, "link": 0.0, "host": 0.0}
        return {"board": board, "link": self._crossing_ms(timings, batch, rate_bps), "host": timings.tail_at(batch)}

    def frames_per_s(self, split: str, batch: int, rate_bps: float) -> float:
        """The most frames a second a stream through ``split`` can answer: B / max(stage) of
        :meth:`stages_ms`, the pipeline's slowest stage (the stages overlap, so throughput is
        that of the slowest, not of their sum). Infinite when every stage is free."""
        slowest = max(self.stages_ms(split, batch, rate_bps).values())
        return batch * _MS_PER_S / slowest if slowest > 0 else math.inf

    @staticmethod
    def _crossing_ms(timings: SplitTimings, batch: int, rate_bps: float) -> float:
        """8 * bytes_per_sample * B / r of DSC Eq. 4, in ms; a rate that is not > 0 is refused."""
        if not rate_bps > 0:  # also refuses NaN
            raise CalibrationError(f"link rate must be > 0 bit/s, got {rate_bps!r}")
        return _BITS_PER_BYTE * timings.bytes_per_sample * batch * _MS_PER_S / rate_bps

    def paced(self, interval_ms: float | None) -> LatencyModel:
        """This model for a stream from a live camera with frames ``interval_ms`` apart (None: unpaced)."""
        return replace(self, interval_ms=interval_ms)

    def cost_ms(self, split: str, batch: int, rate_bps: float) -> float:
        """What :meth:`best` minimises: the predicted time (:meth:`predict_ms`); for a stream from a
        live camera (``interval_ms``) that the option cannot keep up with, the time its frames wait
        for the board and the frames it leaves unanswered count too.

        DSC Eq. 6 weighs an idle pipeline's latency alone, which on a slow board picks an option
        that answers one frame in four a few ms sooner than one that answers them all (issue 43: a
        quarter core's compute was 5-10x the frame interval and 79 % of frames dropped). Where the
        board's stage (preprocessing and head) takes the interval or more, the board is never idle
        when a frame comes: the frame it takes next is the newest, on average half an interval old
        (a frame waits that long, as the field trial's queue times showed). Where the link or the
        host takes the interval or more, the board's frames are not dropped before them but queue:
        each batch waits for the one before it there, about that stage's time (a quarter core
        offloading 100 KB frames at 20 Mbit/s, 42 ms on a 42 ms interval, waited 48 ms more than
        its stages in the board's queue, for a slot and behind the upload before it, and answered
        fewer frames later than local). And where any stage takes longer than the interval, the
        option answers interval / stage of the frames
        (:func:`drop_share`): its cost is its latency over that share. Of two options that keep up,
        the faster wins as in DSC; of two that do not, the one that answers more frames wins unless
        the other is faster by more than it drops.
        """
        ms = self.predict_ms(split, batch, rate_bps)
        if self.interval_ms is None:
            return ms
        stages = self.stages_ms(split, batch, rate_bps)
        frames_ms = self.interval_ms * batch  # the camera's time for a batch's frames
        if stages["board"] >= frames_ms:
            ms += self.interval_ms / 2
        downstream = max(stages["link"], stages["host"])
        if downstream >= frames_ms:
            ms += downstream
        return ms * max(1.0, max(stages.values()) / frames_ms)

    def best(self, batch: int, rate_bps: float, allowed: Collection[str] | None = None) -> str:
        """DSC Eq. 6: the split of least predicted time (:meth:`cost_ms`: counting the frames a live
        camera's stream through it leaves unanswered), among ``allowed`` when given.

        ``allowed`` drops options (OFFLOAD under a privacy rule, DSC §3; every remote split
        without a host); names it holds that the model lacks are ignored. Ties go to the split
        listed first, so the answer is deterministic.
        """
        best_name, best_ms = None, float("inf")
        for timings in self.splits:
            if allowed is not None and timings.split not in allowed:
                continue
            ms = self.cost_ms(timings.split, batch, rate_bps)
            if ms < best_ms or best_name is None:
                best_name, best_ms = timings.split, ms
        if best_name is None:
            raise CalibrationError(
                f"none of the allowed splits ({', '.join(sorted(allowed or ())) or 'none'}) "
                f"is in the latency model ({', '.join(self._by_name)})"
            )
        return best_name

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, for calibration.json's ``model`` (``preprocess_ms`` only where it was timed)."""
        timed = {} if self.preprocess_ms is None else {"preprocess_ms": self.preprocess_ms}
        return {"rtt_ms": self.rtt_ms, **timed, "splits": [t.to_dict() for t in self.splits]}

    @classmethod
    def from_dict(cls, d: Any, where: str = "model") -> LatencyModel:
        """Read :meth:`to_dict`'s output; errors name the field under ``where``."""
        d = _fields.obj(d, where)
        path = join(where, "splits")
        raw = _fields.array(_fields.member(d, "splits", where), path)
        splits = tuple(SplitTimings.from_dict(s, f"{path}[{i}]") for i, s in enumerate(raw))
        rtt_ms = _fields.member(d, "rtt_ms", where)
        preprocess_ms = d.get("preprocess_ms")  # absent in files calibrated before it was timed
        with _fields.located(where):
            return cls(splits=splits, rtt_ms=rtt_ms, preprocess_ms=preprocess_ms)


def drop_share(camera_fps: float, answered_fps: float) -> float:
    """The part of a live camera's frames a stream answering at most ``answered_fps`` leaves
    unanswered: 1 - answered / camera, 0 when it keeps up. A live camera does not wait for the
    board (the DNN-slicing simulator's frame drop rate), so every frame beyond the slowest
    stage's rate (:meth:`LatencyModel.frames_per_s`) is dropped."""
    camera_fps = _fields.number(camera_fps, "camera_fps")
    if not answered_fps >= 0:  # also refuses NaN
        raise CalibrationError(f"answered_fps: expected a rate >= 0, got {answered_fps!r}")
    if camera_fps == 0 or answered_fps >= camera_fps:
        return 0.0
    return 1.0 - answered_fps / camera_fps
