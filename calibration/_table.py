"""The precomputed best split over a grid of link rates and batch sizes (DSC Eq. 6, tabulated).

DSC computes the optimal split "for each batch size and data rate" ahead of time (DSC §3,
after Eq. 6; their Fig. 2). At run time the device then only looks the answer up, once per
frame, in constant time: the rate index comes from logarithm arithmetic on an evenly
log-spaced grid, the batch row from a bisection over a handful of batch sizes.

The table is built from the whole model, the board's preprocessing included; every option
pays the same B frames' preprocessing (full offload sends the preprocessed input), so it moves
every prediction of a row by the same amount and changes no choice: it tells how long the best
split takes, and how many frames a second a stream through it can answer
(:meth:`LatencyModel.frames_per_s`), not which split is best.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from calibration._latency import LatencyModel
from splitedge import Fields, join, shown
from splitedge.errors import CalibrationError

_fields = Fields(CalibrationError)  # field checks raising this package's error

RATE_MIN_BPS = 1e5  # 0.1 Mbit/s
RATE_MAX_BPS = 1e9  # 1 Gbit/s
POINTS_PER_DECADE = 20  # adjacent grid rates differ by 12 %, a lookup is off by at most 6 %

# How far (in grid steps) a stored rate may sit from the even log grid: JSON round trips are
# exact, so anything visible at this scale was edited or computed otherwise.
_GRID_TOLERANCE = 1e-6


@dataclass(frozen=True)
class SplitTable:
    """best[batch_index][rate_index] = index into ``splits`` of the split of least predicted time."""

    batches: tuple[int, ...]  # ascending
    rates_bps: tuple[float, ...]  # evenly log-spaced, ascending
    splits: tuple[str, ...]  # names, the index space of `best`
    best: tuple[tuple[int, ...], ...]
    _log_first: float = field(init=False, repr=False, compare=False)  # log10(rates_bps[0])
    _steps_per_decade: float = field(init=False, repr=False, compare=False)
    # _cells[batch_index][rate_index] = (lo, hi): the rates around that grid rate with the same best split
    _cells: tuple[tuple[tuple[float, float | None], ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        batches = tuple(_fields.integer(b, f"batches[{i}]", minimum=1) for i, b in enumerate(self.batches))
        if not batches:
            raise CalibrationError("batches: expected at least one batch size, got none")
        for i in range(1, len(batches)):
            if batches[i] <= batches[i - 1]:
                raise CalibrationError(
                    f"batches[{i}]: expected ascending batch sizes, got {batches[i]} after {batches[i - 1]}"
                )
        rates = tuple(_fields.number(r, f"rates_bps[{i}]", minimum=1.0) for i, r in enumerate(self.rates_bps))
        if len(rates) < 2 or rates[-1] <= rates[0]:
            raise CalibrationError(f"rates_bps: expected at least two ascending rates, got {shown(rates)}")
        log_first = math.log10(rates[0])
        steps_per_decade = (len(rates) - 1) / (math.log10(rates[-1]) - log_first)
        for i, rate in enumerate(rates):
            # lookup() computes an index from the logarithm: that only holds on an even log grid.
            if abs((math.log10(rate) - log_first) * steps_per_decade - i) > _GRID_TOLERANCE:
                raise CalibrationError(f"rates_bps[{i}]: expected evenly log-spaced rates, got {rate!r}")
        splits = tuple(_fields.text(s, f"splits[{i}]") for i, s in enumerate(self.splits))
        if not splits or len(set(splits)) != len(splits):
            raise CalibrationError(f"splits: expected unique split names, at least one, got {shown(splits)}")
        best = tuple(tuple(row) for row in self.best)
        if len(best) != len(batches):
            raise CalibrationError(f"best: expected {len(batches)} rows (one per batch size), got {len(best)}")
        for b, row in enumerate(best):
            if len(row) != len(rates):
                raise CalibrationError(f"best[{b}]: expected {len(rates)} entries (one per rate), got {len(row)}")
            for r, index in enumerate(row):
                if _fields.integer(index, f"best[{b}][{r}]", minimum=0) >= len(splits):
                    raise CalibrationError(f"best[{b}][{r}]: expected an index below {len(splits)}, got {index}")
        cells = tuple(_cells(row, rates) for row in best)
        for name, value in (("batches", batches), ("rates_bps", rates), ("splits", splits), ("best", best),
                            ("_log_first", log_first), ("_steps_per_decade", steps_per_decade), ("_cells", cells)):
            object.__setattr__(self, name, value)

    @classmethod
    def build(
        cls,
        model: LatencyModel,
        batches: Sequence[int],
        rate_min_bps: float = RATE_MIN_BPS,
        rate_max_bps: float = RATE_MAX_BPS,
        points_per_decade: int = POINTS_PER_DECADE,
        allowed: Collection[str] | None = None,
    ) -> SplitTable:
        """Tabulate ``model.best`` (DSC Eq. 6) at every batch size and every grid rate.

        The grid starts at ``rate_min_bps`` and steps by 10 ** (1 / points_per_decade) up to
        ``rate_max_bps`` (or the last step below it). ``allowed`` restricts the options as in
        :meth:`LatencyModel.best`; the table's ``splits`` are then only the allowed ones.
        """
        _fields.integer(points_per_decade, "points_per_decade", minimum=1)
        low = _fields.number(rate_min_bps, "rate_min_bps", minimum=1.0)
        if not _fields.number(rate_max_bps, "rate_max_bps", minimum=1.0) > low:
            raise CalibrationError(f"rate_max_bps: expected more than rate_min_bps ({low:g}), got {rate_max_bps!r}")
        # The small epsilon keeps an exact number of decades from losing its last point to rounding.
        steps = math.floor(math.log10(rate_max_bps / low) * points_per_decade + 1e-9)
        rates = tuple(low * 10 ** (i / points_per_decade) for i in range(steps + 1))
        splits = tuple(s for s in model.names if allowed is None or s in allowed)
        index = {name: i for i, name in enumerate(splits)}
        batches = tuple(sorted(set(batches)))
        best = tuple(tuple(index[model.best(b, rate, splits)] for rate in rates) for b in batches)
        return cls(batches=batches, rates_bps=rates, splits=splits, best=best)

    def for_model(self, model: LatencyModel) -> SplitTable:
        """This table's grid (batches, rates, options) tabulated again for ``model``: what a
        board does when its measured times replace the calibrated ones."""
        index = {name: i for i, name in enumerate(self.splits)}
        best = tuple(
            tuple(index[model.best(b, rate, self.splits)] for rate in self.rates_bps) for b in self.batches
        )
        return SplitTable(batches=self.batches, rates_bps=self.rates_bps, splits=self.splits, best=best)

    def lookup(self, batch: int, rate_bps: float) -> str:
        """The tabulated best split for a frame: runs once per frame, so O(1) and a few µs.

        The rate is rounded to the nearest grid rate in the log domain and clamped to the grid
        (a dead link, rate 0, takes the lowest rate); the batch takes the row of the largest
        tabulated batch size not above it (the smallest one below the table).
        """
        b = bisect_right(self.batches, batch) - 1
        return self.splits[self.best[b if b > 0 else 0][self._index(rate_bps)]]

    def _index(self, rate_bps: float) -> int:
        """The grid index :meth:`lookup` rounds ``rate_bps`` to."""
        rates = self.rates_bps
        if rate_bps >= rates[-1]:
            return len(rates) - 1
        if rate_bps > rates[0]:
            return int((math.log10(rate_bps) - self._log_first) * self._steps_per_decade + 0.5)
        if rate_bps <= rates[0]:
            return 0
        raise CalibrationError(f"link rate must be a number, got {rate_bps!r}")  # only NaN fails all three

    def cell(self, batch: int, rate_bps: float) -> tuple[str, float, float | None]:
        """(split, lo, hi): :meth:`lookup`'s answer and the rates ``[lo, hi)`` around ``rate_bps``
        over which the table gives it for this batch, the edges as :meth:`boundaries` places them
        (0 below the grid, None above it: no edge there). What a run prints to explain a choice:
        the estimate against the rates at which the choice would change."""
        b, r = max(bisect_right(self.batches, batch) - 1, 0), self._index(rate_bps)
        return (self.splits[self.best[b][r]], *self._cells[b][r])

    def boundaries(self, batch: int) -> list[tuple[float, str, str]]:
        """Where the best split changes along the rate axis, for the row :meth:`lookup` uses.

        Each entry is (rate_bps, below, above): the log-midpoint of the two grid rates that
        straddle the change, i.e. the rate at which :meth:`lookup` switches. The model's own
        crossover, 8 * Δbytes * B / Δcompute (DSC Eq. 4 of two splits set equal), lies within
        half a grid step of it.
        """
        b = max(bisect_right(self.batches, batch) - 1, 0)
        row, rates = self.best[b], self.rates_bps
        return [
            (math.sqrt(rates[r - 1] * rates[r]), self.splits[row[r - 1]], self.splits[row[r]])
            for r in range(1, len(row))
            if row[r] != row[r - 1]
        ]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, for calibration.json's ``table`` (every grid rate stored: JSON floats round-trip exactly)."""
        return {
            "batches": list(self.batches),
            "rates_bps": list(self.rates_bps),
            "splits": list(self.splits),
            "best": [list(row) for row in self.best],
        }

    @classmethod
    def from_dict(cls, d: Any, where: str = "table") -> SplitTable:
        """Read :meth:`to_dict`'s output; errors name the field under ``where``."""
        d = _fields.obj(d, where)
        args = {
            key: _fields.array(_fields.member(d, key, where), join(where, key))
            for key in ("batches", "rates_bps", "splits", "best")
        }
        args["best"] = [_fields.array(row, f"{join(where, 'best')}[{i}]") for i, row in enumerate(args["best"])]
        with _fields.located(where):
            return cls(**args)


def _cells(row: tuple[int, ...], rates: tuple[float, ...]) -> tuple[tuple[float, float | None], ...]:
    """For each grid rate of a table row, the edges (log-midpoints, as :meth:`SplitTable.boundaries`
    places them) of the run of rates with its best split: 0 at the grid's bottom, None at its top.
    Worked out once per table, so that :meth:`SplitTable.cell` stays O(1) on the per-frame path."""
    edges = [0.0, *(math.sqrt(rates[r - 1] * rates[r]) if row[r] != row[r - 1] else None
                    for r in range(1, len(row))), None]
    cells, start = [], 0
    for r in range(1, len(row) + 1):
        if r == len(row) or row[r] != row[r - 1]:
            cells += [(edges[start], edges[r])] * (r - start)
            start = r
    return tuple(cells)
