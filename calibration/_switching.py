"""Which split to run for the next frame: the table's choice, with hysteresis.

DSC switches to the Eq. 6 optimum at every time step. On a real link the rate estimate
wobbles around the table's boundaries, and each switch has a cost the model does not see
(the host loads another tail, the pipeline drains), so a split is only left for one that is
predicted clearly faster (``margin``) and has been the table's choice for a few frames in a
row (``min_hold``). Changes forced by the link (the host went away, or an upload crossing
slower than the estimate now: ``at_once``) skip both.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import ClassVar

from calibration._latency import LatencyModel
from calibration._table import SplitTable
from splitedge import Fields, LOCAL
from splitedge.errors import CalibrationError

_fields = Fields(CalibrationError)  # field checks raising this package's error


@dataclass(frozen=True)
class Decision:
    """One choice of :meth:`SplitSelector.decide` and why: ``why`` is one of the class's words."""

    #: the table's choice for the rate ...
    TABLE: ClassVar[str] = "table"
    #: ... the current split kept against it (hysteresis: not yet ``min_hold`` calls in a row, or
    #: not predicted ``margin`` faster) ...
    HOLD: ClassVar[str] = "hold"
    #: ... the table's choice (or the current split) cannot run now: the model's best of those that can ...
    UNAVAILABLE: ClassVar[str] = "unavailable"
    #: ... or no rate estimate: LOCAL where it may run.
    NO_RATE: ClassVar[str] = "no_rate"

    split: str
    why: str
    wanted: str | None = None  # the table's choice for the rate (None without a rate)
    lo_bps: float | None = None  # the table gives ``wanted`` for rates in [lo_bps, hi_bps) at this batch
    hi_bps: float | None = None  # None: above the grid's last edge, no bound
    streak: int = 0  # HOLD: calls in a row the table has wanted ``wanted`` (it takes ``min_hold``)
    wanted_ms: float | None = None  # HOLD after ``min_hold``: ``wanted``'s predicted time ...
    current_ms: float | None = None  # ... and the split kept's: ``wanted`` is not ``margin`` faster
    margin: float | None = None


class SplitSelector:
    """Per-frame split decision; ``current`` is None until the first call, which adopts its choice."""

    def __init__(self, table: SplitTable, model: LatencyModel, margin: float = 0.1, min_hold: int = 3) -> None:
        _check_covers(table, model)
        self._margin = _fields.number(margin, "margin")
        if self._margin >= 1.0:
            raise CalibrationError(f"margin: expected a fraction below 1, got {margin!r}")
        self._min_hold = _fields.integer(min_hold, "min_hold", minimum=1)
        self._table = table
        self._model = model
        self._current: str | None = None
        self._switches = 0
        self._streak_split: str | None = None  # the table's choice on the last calls ...
        self._streak = 0  # ... and on how many consecutive ones

    @property
    def current(self) -> str | None:
        """The split the last call chose; None before the first call."""
        return self._current

    @property
    def switches(self) -> int:
        """Changes of split so far (adopting the first one is not a change)."""
        return self._switches

    def retune(self, table: SplitTable, model: LatencyModel) -> None:
        """Decide from now on with a rebuilt table and model (head times refined at run time).

        The current split, the switch count and the run of equal table choices carry over:
        retuning is not a reason to switch, and a switch under way is not restarted.
        """
        _check_covers(table, model)
        if self._current is not None and self._current not in table.splits:
            raise CalibrationError(
                f"the retuned table lacks the current split {self._current!r} (it has {', '.join(table.splits)})"
            )
        self._table = table
        self._model = model

    def choose(self, batch: int, rate_bps: float | None, available: Collection[str] | None = None) -> str:
        """The split for a frame of ``batch`` samples at the estimated ``rate_bps`` (None: no estimate).

        ``available`` is what can run now (only LOCAL while no host is connected): when the
        table's choice or the current split is not in it, the model's best (DSC Eq. 6) among
        the available splits is taken at once. Without a rate estimate the choice is LOCAL
        where the table has it, else the current split: nothing can be predicted, and
        nothing crosses the link under LOCAL.
        """
        return self.decide(batch, rate_bps, available).split

    def decide(
        self, batch: int, rate_bps: float | None, available: Collection[str] | None = None, at_once: bool = False,
    ) -> Decision:
        """:meth:`choose`, with why: the table's cell, the hysteresis holding the current split
        against the table's choice, a split that cannot run now, or no estimate (:class:`Decision`).

        ``at_once``: ``rate_bps`` is what the link carries now (an upload seen crossing slower
        than the estimate), not an estimate wobbling around a boundary: the table's choice is
        taken without the hold or the margin. Held, a remote split kept sending frames into the
        socket behind that upload (two frames answered 5 and 7 s late, issue 28)."""
        if rate_bps is None:
            self._streak_split, self._streak = None, 0  # no table choice this call: a run is broken
            return Decision(self._force(self._without_rate(batch, available)), Decision.NO_RATE)
        candidate, lo, hi = self._table.cell(batch, rate_bps)
        if candidate == self._streak_split:
            self._streak += 1
        else:
            self._streak_split, self._streak = candidate, 1
        current = self._current
        if available is not None and (candidate not in available or (current and current not in available)):
            best = self._model.best(batch, rate_bps, self._restricted(available))
            return Decision(self._force(best), Decision.UNAVAILABLE, candidate, lo, hi)
        if current is None or candidate == current or at_once:
            return Decision(self._force(candidate), Decision.TABLE, candidate, lo, hi)
        if self._streak < self._min_hold:
            return Decision(current, Decision.HOLD, candidate, lo, hi, streak=self._streak)
        candidate_ms = self._model.cost_ms(candidate, batch, rate_bps)  # what the table weighed them by
        current_ms = self._model.cost_ms(current, batch, rate_bps)
        if candidate_ms < (1.0 - self._margin) * current_ms:
            self._current = candidate
            self._switches += 1
            return Decision(candidate, Decision.TABLE, candidate, lo, hi)
        return Decision(current, Decision.HOLD, candidate, lo, hi, self._streak, candidate_ms, current_ms, self._margin)

    def _restricted(self, available: Collection[str]) -> list[str]:
        """The table's splits (it may exclude some, e.g. OFFLOAD under a privacy rule) that can run now."""
        return [s for s in self._table.splits if s in available]

    def _without_rate(self, batch: int, available: Collection[str] | None) -> str:
        allowed = self._table.splits if available is None else self._restricted(available)
        if LOCAL in allowed:
            return LOCAL
        if self._current in allowed:
            return self._current
        # No estimate and no LOCAL: assume the slowest link the table knows.
        return self._model.best(batch, self._table.rates_bps[0], allowed)

    def _force(self, split: str) -> str:
        if split != self._current:
            if self._current is not None:
                self._switches += 1
            self._current = split
        return split


def _check_covers(table: SplitTable, model: LatencyModel) -> None:
    """The selector predicts the table's choices with the model: each must be in it."""
    unknown = [s for s in table.splits if s not in model.names]
    if unknown:
        raise CalibrationError(
            f"the table's splits {', '.join(unknown)} are not in the latency model ({', '.join(model.names)})"
        )


def decision_cost_us(selector: SplitSelector, n: int = 10000) -> float:
    """Mean µs per :meth:`SplitSelector.choose` over a sweep of rates; the selector is not changed.

    The rate goes up and down across the table's whole grid (a triangle wave in the log
    domain, 200 calls a period) so the sweep crosses every boundary and exercises the
    hysteresis path, and each batch size of the table gets an equal share of the calls. A
    copy of the selector takes the calls, so the caller's state (current split, switches)
    is left as it was.
    """
    _fields.integer(n, "n", minimum=1)
    table = selector._table
    low, high = math.log10(table.rates_bps[0]), math.log10(table.rates_bps[-1])
    calls = []
    for i in range(n):
        phase = (i % 200) / 100.0
        x = phase if phase <= 1.0 else 2.0 - phase
        calls.append((table.batches[i * len(table.batches) // n], 10 ** (low + x * (high - low))))
    timed = copy.copy(selector)
    choose = timed.choose
    start = time.perf_counter()
    for batch, rate in calls:
        choose(batch, rate)
    return (time.perf_counter() - start) / n * 1e6
