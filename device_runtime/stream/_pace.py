"""Run at the speed of the board that recorded a trace: a replay's board held to the trial's times.

A replay decides as its trial did (``--head-times``) but its latency is still its own board's: a
workstation replaying a Pi's trial answers in a fraction of the Pi's time, and even the same
emulated board ran 5-18 % faster or slower from one run to the next on a shared machine
(docs/benchmarks.md, "Replaying a trial's link"). With a pace, each stage the board runs
(preprocessing a frame, a head, the full model) is held on the board's engine until it has taken as
long as it took in the trial, frame by frame: the engine stays busy meanwhile, as the slower board's
would, so frames queue behind it as they did there.

Which recorded time a stage is held to: the trial's own for the same frame, where the trial ran the
same split at the same batch size there; else the median of the trial's times for that split and
batch size; else none (a split the trial never ran). Frames the trial answered locally after a
remote failure (``fallback``, ``deadline``) are left out: their time is a head and the full model
together. A board slower than the trial's cannot be sped up: such runs are counted (``slower``) and
the run's summary says so.

A trace is untrusted input: no stage is held past :data:`MAX_HOLD_MS` (a ``head_ms`` of 1e9 held the
engine 11 days, deaf to SIGTERM; 1e300 overflowed ``time.sleep``). A recorded time past it, or one
that is no time (negative, NaN, a string), is left out and counted (``left_out``), and the summary
says so; a hold ends early when the pace is stopped (:meth:`BoardPace.stop`).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from device_runtime.stream._reason import DEADLINE, FALLBACK
from device_runtime.stream.trace import read_records
from splitedge import SplitEdgeError

__all__ = ["BoardPace", "MAX_HOLD_MS", "PREPROCESS", "read_pace"]

#: The stage name of preprocessing in a pace (heads go by their split's id, the full model by ``local``).
PREPROCESS = "preprocess"
#: The longest a stage is held (ms): longer than a Pi Zero's full model, and short enough that a run
#: told to stop mid-hold still ends within SIGTERM's 5 s.
MAX_HOLD_MS = 4_000.0

T = TypeVar("T")


@dataclass
class BoardPace:
    """The trial's stage times: per frame (``frames``: (index, stage) -> (batch, ms)) and per stage
    and batch size (``medians``), with the count of runs held and of runs that were slower here."""

    frames: Mapping[tuple[int, str], tuple[int, float]]
    medians: Mapping[tuple[str, int], float]
    source: str = ""
    held: int = 0  # stage runs held to the recorded time
    slower: int = 0  # stage runs that took longer here than there: not held
    left_out: int = 0  # recorded stage times past MAX_HOLD_MS, or no time at all: paced to no one
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _stopped: threading.Event = field(default_factory=threading.Event, repr=False)

    @classmethod
    def from_records(cls, records: Iterable[Mapping[str, Any]], source: str = "") -> BoardPace:
        """From a trace's frame records (dicts as :func:`~device_runtime.stream.frame_record` writes them)."""
        frames: dict[tuple[int, str], tuple[int, float]] = {}
        spread: dict[tuple[str, int], list[float]] = defaultdict(list)
        left_out = 0
        for record in records:
            if record.get("type", "frame") != "frame" or record.get("dropped"):
                continue
            index, split, batch = record.get("index"), record.get("split"), record.get("batch")
            if not (isinstance(index, int) and isinstance(split, str) and isinstance(batch, int) and batch >= 1):
                continue
            preprocess = record.get("preprocess_ms")
            left_out += preprocess is not None and not _time(preprocess)
            if _time(preprocess):
                frames[index, PREPROCESS] = (1, preprocess)
                spread[PREPROCESS, 1].append(preprocess)
            head = record.get("head_ms")
            reason = record.get("reason")
            if reason is not None and not isinstance(reason, Mapping):
                reason = None
            left_out += head is not None and not _time(head)
            if _time(head) and (reason or {}).get("kind") not in (FALLBACK, DEADLINE) and head > 0:
                frames[index, split] = (batch, head)
                spread[split, batch].append(head)
        return cls(frames, {key: statistics.median(times) for key, times in spread.items()}, source,
                   left_out=left_out)

    def target_ms(self, index: int, stage: str, batch: int) -> float | None:
        """The time the trial's board took for ``stage`` of the batch starting at frame ``index``."""
        recorded = self.frames.get((index, stage))
        if recorded is not None and recorded[0] == batch:
            return recorded[1]
        return self.medians.get((stage, batch))

    def hold(self, target_ms: float | None, run: Callable[[], tuple[T, float]]) -> tuple[T, float]:
        """``run()`` (a stage: its result and its ms), then hold the calling thread (the board's
        engine) until ``target_ms`` have passed; the time returned is the whole of it."""
        out, ms = run()
        if target_ms is None or self._stopped.is_set():
            return out, ms
        target_ms = min(target_ms, MAX_HOLD_MS)
        if ms >= target_ms:
            with self._lock:
                self.slower += ms > target_ms
            return out, ms
        start = time.perf_counter()
        self._stopped.wait((target_ms - ms) / 1000.0)  # a stop ends the hold
        with self._lock:
            self.held += 1
        return out, ms + (time.perf_counter() - start) * 1000.0

    def stop(self) -> None:
        """End every hold now and hold nothing more: the run is stopping."""
        self._stopped.set()

    def summary(self) -> str:
        """One line for the end of the run."""
        line = f"held to the times of {self.source or 'the recorded board'}: {self.held} stage runs"
        if self.slower:
            line += (f"; {self.slower} ran slower here than there (this board is slower than the one that "
                     "recorded them: their latency is this board's)")
        if self.left_out:
            line += (f"; {self.left_out} recorded stage times left out (past {MAX_HOLD_MS / 1000.0:g} s, or not a "
                     "time): no stage is held longer")
        return line


def read_pace(path: str | Path) -> BoardPace:
    """The pace of the trace at ``path`` (``split-device run --pace``); a trace without a frame to
    pace to is an error that says so."""
    pace = BoardPace.from_records((record for _, record in read_records(path)[1:]), str(path))
    if not pace.medians:
        raise SplitEdgeError(f"{path}: no frame with its stage times to pace this board to; give the trace of a run "
                             "that answered frames")
    return pace


def _time(value: Any) -> bool:
    """A stage time a pace holds to: a number of ms from 0 to :data:`MAX_HOLD_MS` (NaN fails the comparison)."""
    return type(value) in (int, float) and 0 <= value <= MAX_HOLD_MS
