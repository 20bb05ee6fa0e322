"""Head and tail times of DSC Eq. 4, measured before (calibration) and refined while running.

Medians, not means: on a board a single frame can stall for tens of ms (thermal throttling,
the camera's own interrupts), and one such frame must not move a split's predicted time.
Beside each median, calibration keeps the spread (p10, p50, p90): a wide one says the board
was not quiet while it was timed, which no median can show.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from calibration._latency import LatencyModel
from splitedge import Fields, join
from splitedge.errors import CalibrationError

_fields = Fields(CalibrationError)  # field checks raising this package's error

K = TypeVar("K", bound=Hashable)

#: A spread is wide when its p90 is more than this many times its p10 ...
WIDE_RATIO = 1.5
#: ... and more than this many ms above it: sub-ms runs jitter by whole multiples (the
#: scheduler's tick, a cache miss) without saying anything about the board.
WIDE_MIN_MS = 1.0

#: Running samples kept per (split, batch): about two seconds of frames at 30 fps.
WINDOW = 64
#: Running samples needed before they replace the calibrated time: fewer are mostly noise.
MIN_SAMPLES = 8
#: The board's last runs (heads of any split, frames' preprocessing) whose ratios to their calibrated
#: times give its speed now.
RECENT = 16
#: A (split, batch)'s own running median stands while it ran within the board's last this many runs;
#: older, the board may have sped up or slowed down since, and the board's factor stands instead.
FRESH = 64
#: (split, batch) keys kept at most: a board's splits times its batch sizes are far fewer.
MAX_KEYS = 256
#: What :class:`RunningTimes` calls a frame's preprocessing among the board's runs (no split is named so).
PREPROCESS = "preprocess"


def measure_ms(
    fn: Callable[[], object], repeats: int, warmup: int = 3, fps: float = 0.0,
    clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], object] = time.sleep,
) -> float:
    """Median wall time in ms of ``repeats`` calls of ``fn``, after ``warmup`` untimed calls.

    The first calls pay for lazy allocation and cold caches (onnxruntime plans its memory on
    the first run), which no later frame pays. With ``fps`` > 0 each call starts 1/``fps`` s
    after the one before (or at once, when that one took longer), as a camera's frames would:
    a board idle between frames runs the next one at another speed than back to back (its
    governor has clocked the CPU down, its caches have gone cold, a CPU quota has refilled),
    and the latency model must predict the stream it will run. ``clock`` (seconds) and ``sleep``
    time and pace the calls: a test passes a clock it drives, and asserts on exact times.
    """
    _fields.integer(repeats, "repeats", minimum=1)
    fps = _fields.number(fps, "fps")
    interval = 1.0 / fps if fps > 0 else 0.0
    started = -math.inf
    times = []
    for i in range(_fields.integer(warmup, "warmup", minimum=0) + repeats):
        delay = started + interval - clock()
        if delay > 0:
            sleep(delay)
        started = clock()
        fn()
        if i >= warmup:
            times.append((clock() - started) * 1000.0)
    return statistics.median(times)


@dataclass(frozen=True)
class Spread:
    """p10, p50 (the median: what the latency model uses) and p90 of repeated timings, in ms.

    Deciles by linear interpolation (``statistics.quantiles(..., method="inclusive")``, numpy's
    default), so one sample is all three, and two are their ends and middle.
    """

    p10: float
    p50: float
    p90: float

    def __post_init__(self) -> None:
        for name in ("p10", "p50", "p90"):
            object.__setattr__(self, name, _fields.number(getattr(self, name), name))
        if not self.p10 <= self.p50 <= self.p90:
            raise CalibrationError(f"expected p10 <= p50 <= p90, got {self.p10!r}, {self.p50!r}, {self.p90!r}")

    @classmethod
    def of(cls, samples: Sequence[float]) -> Spread:
        """The spread of ``samples`` (at least one)."""
        if not samples:
            raise CalibrationError("a spread needs at least one sample")
        if len(samples) == 1:
            return cls(samples[0], samples[0], samples[0])
        deciles = statistics.quantiles(samples, n=10, method="inclusive")
        # Clamped to the median: interpolation of floats may land a hair past it.
        median = statistics.median(samples)
        return cls(min(deciles[0], median), median, max(deciles[8], median))

    def plus(self, other: Spread) -> Spread:
        """Two stages run one after the other (a head and its cut's encoding), each decile the
        sum of theirs: an estimate, the two timed apart, that holds where one of them is small."""
        return Spread(self.p10 + other.p10, self.p50 + other.p50, self.p90 + other.p90)

    @property
    def ratio(self) -> float:
        """p90 / p10: 1.0 for a board that ran every repeat alike."""
        if self.p10 > 0:
            return self.p90 / self.p10
        return 1.0 if self.p90 == 0 else math.inf

    def wide(self, ratio: float = WIDE_RATIO, min_ms: float = WIDE_MIN_MS) -> bool:
        """Whether p90 exceeds p10 by more than ``ratio`` times and by more than ``min_ms``."""
        return self.ratio > ratio and self.p90 - self.p10 > min_ms

    def to_dict(self) -> dict[str, float]:
        return {"p10": self.p10, "p50": self.p50, "p90": self.p90}

    @classmethod
    def from_dict(cls, d: Any, where: str) -> Spread:
        """Read :meth:`to_dict`'s output; errors name the field under ``where``."""
        d = _fields.obj(d, where)
        args = {name: _fields.number(_fields.member(d, name, where), join(where, name)) for name in ("p10", "p50", "p90")}
        if not args["p10"] <= args["p50"] <= args["p90"]:
            raise CalibrationError(f"{where}: expected p10 <= p50 <= p90, got {args['p10']!r}, {args['p50']!r}, {args['p90']!r}")
        return cls(**args)


def measure_round_robin(
    calls: Mapping[K, Callable[[], object]], repeats: int, warmup: int = 3, fps: float = 0.0,
    clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], object] = time.sleep,
    on_cycle: Callable[[int], object] | None = None,
) -> dict[K, list[float]]:
    """Wall times in ms of ``repeats`` calls of every option in ``calls``, taken round robin.

    Every cycle runs every option once, so a slow spell of the machine (another program, a
    thermal throttle, a cron job) lands on all options alike instead of on whichever one was
    being timed then, and the table compares options measured under the same conditions. The
    order rotates by one option per cycle, so no option always runs right after the same
    other one (whose weights have just pushed its own out of the cache). ``warmup`` untimed
    cycles come first (see :func:`measure_ms`); ``fps``, ``clock`` and ``sleep`` pace and time
    each call as there. ``on_cycle(i)`` is called after timed cycle i (1-based), for progress.
    Returns each option's samples in the order they were taken.
    """
    _fields.integer(repeats, "repeats", minimum=1)
    warmup = _fields.integer(warmup, "warmup", minimum=0)
    fps = _fields.number(fps, "fps")
    interval = 1.0 / fps if fps > 0 else 0.0
    keys = list(calls)
    if not keys:
        raise CalibrationError("nothing to time: no options given")
    samples: dict[K, list[float]] = {key: [] for key in keys}
    started = -math.inf
    for cycle in range(warmup + repeats):
        shift = cycle % len(keys)
        for key in keys[shift:] + keys[:shift]:
            delay = started + interval - clock()
            if delay > 0:
                sleep(delay)
            started = clock()
            calls[key]()
            if cycle >= warmup:
                samples[key].append((clock() - started) * 1000.0)
        if cycle >= warmup and on_cycle is not None:
            on_cycle(cycle - warmup + 1)
    return samples


def widest(spreads: Mapping[K, Spread], ratio: float = WIDE_RATIO, min_ms: float = WIDE_MIN_MS) -> tuple[K, Spread] | None:
    """The option whose spread is widest (largest p90 / p10) among the wide ones; None if none is wide."""
    wide = [(key, spread) for key, spread in spreads.items() if spread.wide(ratio, min_ms)]
    if not wide:
        return None
    return max(wide, key=lambda item: item[1].ratio)


class RunningTimes:
    """The board's head times as measured frame by frame, to keep every option's time current.

    Calibration runs once; at run time the board may be throttled or shared, and DSC Eq. 6
    picks the wrong split if fed the calibrated times. Only the option in use is timed, though,
    and refining it alone misleads as much as not refining at all: a field trial (issue 43) kept a
    cut at 77 ms while local, never tried since calibration, would have taken 34, and another
    fled a re-measured local (439 ms) to a cut whose calibrated time (kept, 543 ms in truth) said
    it was faster. What slows one network on a board slows the others alike (a neighbour's share
    of the CPU, the clock's governor), so the board's recent head runs, whichever split ran them,
    give its speed against calibration (:meth:`factor`), and every option not timed lately is
    predicted at its calibrated time times that factor; an option timed lately keeps its own
    median (:meth:`apply`).
    """

    def __init__(self) -> None:
        self._samples: dict[tuple[str, int], deque[float]] = {}
        self._recent: deque[tuple[str, int, float]] = deque(maxlen=RECENT)  # the board's last runs
        self._last_seen: dict[tuple[str, int], int] = {}  # key -> the count of head runs at its latest
        self._count = 0
        self._tails: deque[tuple[str, int, float]] = deque(maxlen=RECENT)  # the host's last tail runs

    def observe(self, split: str, batch: int, ms: float, sending: bool = False) -> None:
        """Record one head run of ``batch`` samples through ``split`` that took ``ms``; ``sending``:
        the board's own uploads were in flight meanwhile (see :meth:`factor`)."""
        key = (split, _fields.integer(batch, "batch", minimum=1))
        ms = _fields.number(ms, "ms")
        window = self._samples.get(key)
        if window is None:
            if len(self._samples) >= MAX_KEYS:
                return  # a board has a handful of splits and batch sizes: past that, nothing new
            window = self._samples[key] = deque(maxlen=WINDOW)
        window.append(ms)
        if not sending:
            self._recent.append((split, key[1], ms))
        self._count += 1
        self._last_seen[key] = self._count

    def observe_preprocess(self, ms: float, sending: bool = False) -> None:
        """Record one frame's preprocessing that took ``ms``: board compute like a head's, and the only
        compute a board running locally between uploads may do for a while, so its speed against
        calibration is kept current through it too."""
        ms = _fields.number(ms, "ms")
        if not sending:
            self._recent.append((PREPROCESS, 1, ms))
        self._count += 1

    def observe_tail(self, split: str, batch: int, ms: float) -> None:
        """Record the host's compute for one request of ``batch`` samples through ``split``'s tail
        (its reply says it): the host's speed against calibration (:meth:`host_factor`)."""
        self._tails.append((split, _fields.integer(batch, "batch", minimum=1), _fields.number(ms, "ms")))

    def median(self, split: str, batch: int) -> float | None:
        """Median of the last WINDOW samples of (split, batch); None if there are none."""
        window = self._samples.get((split, batch))
        return statistics.median(window) if window else None

    def factor(self, model: LatencyModel) -> float | None:
        """The board's speed now against ``model``'s (calibrated) times: the median ratio of its
        last RECENT runs (heads, whichever splits ran them, and frames' preprocessing) to their
        calibrated times; None with fewer than MIN_SAMPLES of them that ``model`` times.

        Runs made while the board's own uploads were in flight (``sending``) are left out: the
        kernel's work of sending them runs on the board's CPU too, so they measure the option that
        sends as much as the board. On a quarter core offloading 150 KB frames, preprocessing took
        2x its calibrated time and the heads 1.5x, the factor took it for the board's speed, priced
        local at twice its time and kept offloading; local, once run, ran as calibrated. That cost is
        the sending option's own, and its own running medians (:meth:`apply`) hold it."""
        names = set(model.names)
        ratios = []
        for split, batch, ms in self._recent:
            if split == PREPROCESS:
                calibrated = model.preprocess_ms or 0.0
            elif split in names and model.timings(split).head_ms:
                calibrated = model.timings(split).head_at(batch)
            else:
                continue
            if calibrated > 0:
                ratios.append(ms / calibrated)
        return statistics.median(ratios) if len(ratios) >= MIN_SAMPLES else None

    def host_factor(self, model: LatencyModel) -> float | None:
        """The host's speed now against ``model``'s calibrated tail times, as :meth:`factor` is the
        board's: a host shared with other boards or programs runs every tail alike slower (a field
        trial's host ran its tails at 3x the calibrated times beside two busy processes), and a
        board that chose with the calibrated tails offloaded to it as if it were idle."""
        names = set(model.names)
        ratios = [ms / calibrated for split, batch, ms in self._tails
                  if split in names and (calibrated := model.timings(split).tail_at(batch)) > 0]
        return statistics.median(ratios) if len(ratios) >= MIN_SAMPLES else None

    def apply(self, model: LatencyModel) -> LatencyModel:
        """``model`` with every option's head times current: a (split, batch) with MIN_SAMPLES running
        samples, the latest of them within the board's last FRESH runs, takes their median;
        every other head time is the calibrated one times the board's :meth:`factor` (as it was,
        without one); every tail time the calibrated one times the host's :meth:`host_factor`.

        Batch sizes seen at run time but not calibrated are added, which sharpens the
        interpolation between calibrated sizes. Splits the model lacks are ignored.
        """
        factor, host = self.factor(model), self.host_factor(model)
        splits = []
        for timings in model.splits:
            head_ms = {b: ms * factor for b, ms in timings.head_ms.items()} if factor is not None \
                else dict(timings.head_ms)
            if host is not None:
                timings = dataclasses.replace(timings, tail_ms={b: ms * host for b, ms in timings.tail_ms.items()})
            for (split, batch), window in self._samples.items():
                if split == timings.split and len(window) >= MIN_SAMPLES and self.fresh(split, batch):
                    head_ms[batch] = statistics.median(window)
            splits.append(dataclasses.replace(timings, head_ms=head_ms))
        return dataclasses.replace(model, splits=tuple(splits))

    def fresh(self, split: str, batch: int) -> bool:
        """Whether (split, batch) ran within the board's last FRESH runs: its own median still
        says how this board runs it now."""
        seen = self._last_seen.get((split, batch))
        return seen is not None and self._count - seen < FRESH
