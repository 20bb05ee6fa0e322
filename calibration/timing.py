"""Head and tail times of DSC Eq. 4, measured before (calibration) and refined while running.

Medians, not means: on a board a single frame can stall for tens of ms (thermal throttling,
the camera's own interrupts), and one such frame must not move a split's predicted time.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections import deque
from collections.abc import Callable

from calibration.latency import LatencyModel
from splitedge.errors import CalibrationError
from splitedge.fields import Fields

_fields = Fields(CalibrationError)  # field checks raising this package's error

#: Running samples kept per (split, batch): about two seconds of frames at 30 fps.
WINDOW = 64
#: Running samples needed before they replace the calibrated time: fewer are mostly noise.
MIN_SAMPLES = 8


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


class RunningTimes:
    """The board's head times as measured frame by frame, to keep the latency model current.

    Calibration runs once, on a cool, idle board; at run time the board may be throttled or
    busy, and DSC Eq. 6 picks the wrong split if fed the calibrated times.
    """

    def __init__(self) -> None:
        self._samples: dict[tuple[str, int], deque[float]] = {}

    def observe(self, split: str, batch: int, ms: float) -> None:
        """Record one head run of ``batch`` samples through ``split`` that took ``ms``."""
        key = (split, _fields.integer(batch, "batch", minimum=1))
        window = self._samples.get(key)
        if window is None:
            window = self._samples[key] = deque(maxlen=WINDOW)
        window.append(_fields.number(ms, "ms"))

    def median(self, split: str, batch: int) -> float | None:
        """Median of the last WINDOW samples of (split, batch); None if there are none."""
        window = self._samples.get((split, batch))
        return statistics.median(window) if window else None

    def apply(self, model: LatencyModel) -> LatencyModel:
        """``model`` with each head time that has MIN_SAMPLES running samples replaced by their median.

        Batch sizes seen at run time but not calibrated are added, which sharpens the
        interpolation between calibrated sizes. Splits the model lacks are ignored.
        """
        splits = []
        for timings in model.splits:
            head_ms = dict(timings.head_ms)
            for (split, batch), window in self._samples.items():
                if split == timings.split and len(window) >= MIN_SAMPLES:
                    head_ms[batch] = statistics.median(window)
            splits.append(dataclasses.replace(timings, head_ms=head_ms))
        return dataclasses.replace(model, splits=tuple(splits))
