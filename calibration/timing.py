"""Head and tail times of DSC Eq. 4, measured before (calibration) and refined while running.

Medians, not means: on a board a single frame can stall for tens of ms (thermal throttling,
the camera's own interrupts), and one such frame must not move a split's predicted time.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections import deque
from collections.abc import Callable

from calibration import _fields
from calibration.latency import LatencyModel

#: Running samples kept per (split, batch): about two seconds of frames at 30 fps.
WINDOW = 64
#: Running samples needed before they replace the calibrated time: fewer are mostly noise.
MIN_SAMPLES = 8


def measure_ms(fn: Callable[[], object], repeats: int, warmup: int = 3) -> float:
    """Median wall time in ms of ``repeats`` calls of ``fn``, after ``warmup`` untimed calls.

    The first calls pay for lazy allocation and cold caches (onnxruntime plans its memory on
    the first run), which no later frame pays.
    """
    _fields.integer(repeats, "repeats", minimum=1)
    for _ in range(_fields.integer(warmup, "warmup", minimum=0)):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000.0)
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
