"""Rate schedules: "1:10,50:10,5:10", rates and durations driven onto a kernel link or a relay,
and written into the trace of the run beside them (:func:`trace_steps`), so its report can draw
the link's real rate against the board's estimate."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from testbed._kernel_link import EmulatedLink, _checked_rate
from testbed._relay import DelayRelay


@dataclass(frozen=True)
class RateStep:
    """Hold ``rate_mbit`` for ``duration_s`` seconds."""

    duration_s: float
    rate_mbit: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.duration_s) and self.duration_s > 0):
            raise ValueError(f"duration_s must be a positive number of seconds, not {self.duration_s!r}")
        _checked_rate(self.rate_mbit)


class RateSchedule:
    """A sequence of rates over time, to replay a measured Wi-Fi trace or a stress pattern."""

    def __init__(self, steps: Sequence[RateStep], repeat: bool = False) -> None:
        if not steps:
            raise ValueError("a rate schedule needs at least one step")
        self.steps = tuple(steps)
        self.repeat = repeat

    @classmethod
    def parse(cls, text: str, repeat: bool = False) -> RateSchedule:
        """``"1:10,50:10,5:10"``: 1 Mbit/s for 10 s, then 50 Mbit/s for 10 s, then 5 for 10 s."""
        steps = []
        parts = text.split(",")
        for number, part in enumerate(parts, 1):
            where = f"step {number} {part.strip()!r} of {text!r}"
            fields = part.split(":")
            if len(fields) != 2:
                raise ValueError(f"{where}: expected RATE_MBIT:DURATION_S, like 5:10")
            values = []
            for label, field in zip(("rate", "duration"), fields):
                try:
                    values.append(float(field))
                except ValueError:
                    raise ValueError(f"{where}: {label} {field.strip()!r} is not a number") from None
            rate, duration = values
            if not (math.isfinite(rate) and rate > 0):
                raise ValueError(f"{where}: rate must be a positive number of Mbit/s")
            if not (math.isfinite(duration) and duration > 0):
                raise ValueError(f"{where}: duration must be a positive number of seconds")
            steps.append(RateStep(duration_s=duration, rate_mbit=rate))
        return cls(steps, repeat=repeat)

    @property
    def duration_s(self) -> float:
        """Length of one pass through the steps."""
        return sum(step.duration_s for step in self.steps)

    def rate_at(self, elapsed_s: float) -> float:
        """The rate ``elapsed_s`` after the start; past the end, the last rate (or the pattern again if repeating)."""
        if elapsed_s < 0:
            raise ValueError(f"elapsed_s must be >= 0, not {elapsed_s!r}")
        if self.repeat:
            elapsed_s %= self.duration_s
        boundary = 0.0
        for step in self.steps:
            boundary += step.duration_s
            if elapsed_s < boundary:
                return step.rate_mbit
        return self.steps[-1].rate_mbit

    async def drive(self, link: EmulatedLink | DelayRelay,
                    on_change: Callable[[float, float], None] | None = None) -> None:
        """Apply each step's rate at its time; return after the last step, or never when repeating.

        Times are measured from the start, not chained from sleep to sleep, so a late wake-up
        does not push later steps back. The last rate stays in force after the schedule, and
        after a cancellation the current one does. ``on_change(elapsed_s, rate_mbit)`` is
        called after each rate is applied.
        """
        loop = asyncio.get_running_loop()
        start = loop.time()
        boundary = 0.0
        while True:
            for step in self.steps:
                if isinstance(link, EmulatedLink):  # tc takes milliseconds: keep it off the loop
                    await asyncio.to_thread(link.set_rate, step.rate_mbit)
                else:
                    link.set_rate(step.rate_mbit)
                if on_change is not None:
                    on_change(loop.time() - start, step.rate_mbit)
                boundary += step.duration_s
                remaining = start + boundary - loop.time()
                if remaining > 0:
                    await asyncio.sleep(remaining)
            if not self.repeat:
                return


#: What a schedule's trace records say set the rate.
SET_BY = "testbed schedule"
_BITS_PER_MBIT = 1e6


def trace_steps(trace: str | Path, set_by: str = SET_BY) -> Callable[[float, float], None]:
    """An ``on_change`` for :meth:`RateSchedule.drive` that writes each rate applied into the trace
    a ``split-device run --trace`` is writing beside it: the board only estimates the link's rate,
    and a report can judge the estimate only against what the link really did. ``set_by``: what
    the records say set the rate (a replay names the trace it replays)."""
    # Imported here: `make` builds the board in a box with the system's python3, which has only the
    # standard library, and `python -m testbed.board_box` imports this package's face.
    from device_runtime.stream.trace import append_link_rate

    def on_change(elapsed_s: float, rate_mbit: float) -> None:
        append_link_rate(trace, rate_mbit * _BITS_PER_MBIT, set_by)

    return on_change
