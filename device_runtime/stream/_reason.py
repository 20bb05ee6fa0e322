"""Why a batch took its split: the policy's :class:`Choice` carries a :class:`Reason`, each frame's
result and trace record carry it on, and every printed line says it.

The vocabulary (``Reason.kind``), with the fields each one fills:

* ``fixed`` — one split for the run: ``--split`` named it, or ``auto`` found no calibration
  table and holds the smallest cut.
* ``table`` — the calibration table's cell: ``batch``, the rate estimate ``rate_bps`` and the
  cell's edges ``lo_bps``/``hi_bps`` (the table gives this split for rates in [lo, hi); ``hi_bps``
  None: no edge above).
* ``refined`` — as ``table``, from the table rebuilt with the head times this run measured, which
  chose otherwise than the calibrated one (``calibrated``: its choice).
* ``hold`` — hysteresis kept the split in use while the table wanted ``wanted`` (its cell in
  ``lo_bps``/``hi_bps``): for ``streak`` batches in a row so far, fewer than it takes; or, with
  ``wanted_ms`` and ``kept_ms``, ``wanted`` is not predicted ``margin`` faster.
* ``no_rate`` — no rate estimate yet: nothing can be predicted, the board runs it.
* ``no_host`` — the split wanted (``wanted``) has no host now: the board runs it.
* ``upload_cap`` — an upload overdue, or one crossing slowly, capped the estimate and the cap
  made the choice: ``rate_bps`` is the capped rate, ``uncapped_bps`` the estimate without the
  cap, ``overdue`` whether an upload was overdue (then nothing is queued behind it: the board
  runs the batch), else the table's cell at the capped rate. Any other reason given while a cap
  held carries ``uncapped_bps`` too.
* ``fallback`` — the remote split ``wanted`` failed (``error``): the board answered; ``chosen``
  is the reason ``wanted`` had been chosen for (a reason of its own: the table's cell, ...).
* ``deadline`` — the host said it could not answer ``wanted`` by the frame's deadline
  (``deadline_ms``): the board answered; ``chosen`` as for ``fallback``.
* ``bandit`` — the layer/semantic bandit's ``arm`` and its ``score`` (the arm's mean reward in
  the batch's deadline context). Where the bandit takes the layer arm the layer policy's reason
  stands, with ``arm`` and ``score`` added.

:meth:`Reason.as_dict` is the JSON form (``kind`` and the fields set): the trace's ``reason``
object, the ``--json`` lines', and a live page's.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

__all__ = [
    "BANDIT", "Choice", "DEADLINE", "FALLBACK", "FIXED", "HOLD", "KINDS", "NO_HOST", "NO_RATE", "REFINED", "Reason",
    "TABLE", "UPLOAD_CAP",
]

FIXED, TABLE, REFINED, HOLD, NO_RATE = "fixed", "table", "refined", "hold", "no_rate"
NO_HOST, UPLOAD_CAP, FALLBACK, DEADLINE, BANDIT = "no_host", "upload_cap", "fallback", "deadline", "bandit"
KINDS = (FIXED, TABLE, REFINED, HOLD, NO_RATE, NO_HOST, UPLOAD_CAP, FALLBACK, DEADLINE, BANDIT)


@dataclass(frozen=True)
class Reason:
    """Why a batch took its split: ``kind`` (one of :data:`KINDS`) and the fields it fills
    (module docstring); the others stay None."""

    kind: str
    batch: int | None = None
    rate_bps: float | None = None  # the rate estimate the split was chosen with (capped, for upload_cap)
    lo_bps: float | None = None  # the table's cell for the split named: [lo_bps, hi_bps)
    hi_bps: float | None = None
    wanted: str | None = None  # the split the table (hold, no_host) wanted, or that failed (fallback, deadline)
    streak: int | None = None  # hold: batches in a row the table has wanted it
    wanted_ms: float | None = None  # hold: the wanted split's predicted time ...
    kept_ms: float | None = None  # ... against the kept one's
    margin: float | None = None  # ... and how much faster it must be predicted to take it
    calibrated: str | None = None  # refined: the calibrated table's choice
    uncapped_bps: float | None = None  # upload_cap: the estimate without the cap
    overdue: bool | None = None  # upload_cap: an upload was overdue (nothing queued behind it)
    error: str | None = None  # fallback, deadline: what the host or the link said
    deadline_ms: float | None = None  # deadline: the frame's
    arm: str | None = None  # bandit: the arm chosen ...
    score: float | None = None  # ... and its mean reward in the batch's context
    chosen: Reason | None = None  # fallback, deadline: why the split that failed had been chosen

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"reason kind {self.kind!r}: expected one of {', '.join(KINDS)}")

    def as_dict(self) -> dict[str, Any]:
        """``{"kind": ..., field: value, ...}`` with the fields set (``chosen`` as an object of its
        own): JSON-ready."""
        return {f.name: v.as_dict() if isinstance(v, Reason) else v
                for f in fields(self) if (v := getattr(self, f.name)) is not None}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Reason:
        """:meth:`as_dict`'s output read back (a trace's ``reason``); unknown keys are left out."""
        known = {f.name for f in fields(cls)}
        read = {k: v for k, v in d.items() if k in known}
        if isinstance(read.get("chosen"), dict):
            read["chosen"] = cls.from_dict(read["chosen"])
        return cls(**read)

    def text(self) -> str:
        """The reason in a few words, for a printed line."""
        said = {
            FIXED: lambda: "fixed split (--split, or no calibration to choose with)",
            TABLE: lambda: f"table: B={self.batch} at {_mbit(self.rate_bps)} in {self._cell()}",
            REFINED: lambda: (f"refined table: B={self.batch} at {_mbit(self.rate_bps)} in {self._cell()} (the "
                              f"head times measured in this run; the calibrated table says {self.calibrated})"),
            HOLD: self._hold,
            NO_RATE: lambda: "no rate estimate yet",
            NO_HOST: lambda: f"no host for {self.wanted}",
            UPLOAD_CAP: lambda: (f"upload cap: {_mbit(self.rate_bps)}, the estimate {_mbit(self.uncapped_bps)} "
                                 + ("capped by an overdue upload" if self.overdue else "capped by an upload crossing "
                                    f"slowly; the table's cell {self._cell()}")),
            FALLBACK: lambda: f"fell back from {self.wanted}: {self.error}",
            DEADLINE: lambda: f"{self.wanted} refused for the {self.deadline_ms:.1f} ms deadline: {self.error}",
            BANDIT: lambda: f"bandit arm {self.arm}" + (f" (score {self.score:.3f})" if self.score is not None else ""),
        }[self.kind]()
        if self.kind != UPLOAD_CAP and self.uncapped_bps is not None:
            said += f" (the estimate {_mbit(self.uncapped_bps)}, capped by an upload crossing slowly)"
        if self.kind != BANDIT and self.arm is not None:
            said += f"; bandit arm {self.arm}" + (f" (score {self.score:.3f})" if self.score is not None else "")
        return said

    def _cell(self) -> str:
        high = "∞" if self.hi_bps is None else f"{self.hi_bps / 1e6:.3g}"
        return f"[{(self.lo_bps or 0.0) / 1e6:.3g}, {high}) Mbit/s"

    def _hold(self) -> str:
        held = f"hold: the table wants {self.wanted} at {_mbit(self.rate_bps)} ({self._cell()})"
        if self.wanted_ms is not None and self.kept_ms is not None:
            return (f"{held}, predicted {self.wanted_ms:.1f} ms against {self.kept_ms:.1f} ms: not "
                    f"{100 * (self.margin or 0.0):.0f} % faster")
        return f"{held}, {self.streak} batch(es) in a row so far"


@dataclass(frozen=True)
class Choice:
    """A policy's answer for one batch: the split and why."""

    split: str
    reason: Reason


def _mbit(rate_bps: float | None) -> str:
    return "no estimate" if rate_bps is None else f"{rate_bps / 1e6:.2f} Mbit/s"
