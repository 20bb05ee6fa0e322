"""Which split the next batch takes: fixed, or chosen from the calibration table as the link changes.

``available`` is what can run right now: ``local`` always, the host's splits only while a
host is connected. A split that is not available falls back to ``local`` at once, so a lost
host never costs a frame (the pipeline re-runs in-flight batches locally too).
"""

from __future__ import annotations

from typing import Collection, Protocol

from calibration import Calibration, RunningTimes, SplitSelector
from device_runtime.bundle import LOCAL, OFFLOAD, Bundle
from device_runtime.stream.results import FrameResult

__all__ = ["AutoPolicy", "SplitPolicy", "StaticPolicy"]


class SplitPolicy(Protocol):
    def choose(
        self, batch: int, rate_bps: float | None, available: Collection[str], link_busy: bool = False,
        deadline_ms: float | None = None,
    ) -> str:
        """``link_busy``: an upload is overdue (:meth:`device_runtime.hosts.link_meter.LinkMeter.overdue`);
        ``deadline_ms``: the batch's deadline, capture to answer (None: none)."""
        ...

    def observe_head(self, split: str, batch: int, head_ms: float) -> None: ...

    def observe_result(self, result: FrameResult) -> None:
        """Each answered frame, as it comes out of the stream."""
        ...


class StaticPolicy:
    """One split for the whole run (``--split ID``), ``local`` while no host can take it."""

    def __init__(self, split: str, bundle: Bundle) -> None:
        if split not in (LOCAL, OFFLOAD):
            bundle.manifest.split(split)  # an unknown split fails before the camera starts
        self.split = split

    def choose(
        self, batch: int, rate_bps: float | None, available: Collection[str], link_busy: bool = False,
        deadline_ms: float | None = None,
    ) -> str:
        """The fixed split, a slow link or not: the run measures that split."""
        return self.split if self.split in available else LOCAL

    def observe_head(self, split: str, batch: int, head_ms: float) -> None:
        """A fixed split learns nothing from its timings."""

    def observe_result(self, result: FrameResult) -> None:
        """Nor from its answers."""


class AutoPolicy:
    """DSC's dynamic split computing: the table's best split for (batch, rate), with hysteresis.

    While an upload is overdue the link is taken to be slower than its bytes over the time
    it has been out (the rate the pipeline passes is capped so), and the batch runs here.

    The head times measured at calibration are refined by the ones measured as the stream
    runs (a board warms up, throttles, shares its CPU): every ``refine_every`` batches the
    model takes the running medians and the table is rebuilt (a few ms, off the per-frame
    path's O(1) lookup).
    """

    def __init__(self, calibration: Calibration, margin: float = 0.1, min_hold: int = 3, refine_every: int = 32) -> None:
        self.calibration = calibration
        self.base_model = calibration.model
        self.running = RunningTimes()
        self.selector = SplitSelector(calibration.table, calibration.model, margin=margin, min_hold=min_hold)
        self.refine_every = refine_every
        self._observed = 0

    @property
    def switches(self) -> int:
        return self.selector.switches

    def choose(
        self, batch: int, rate_bps: float | None, available: Collection[str], link_busy: bool = False,
        deadline_ms: float | None = None,
    ) -> str:
        """The table's choice; ``local`` at once while an upload is overdue: anything sent now
        would wait in the socket behind it, which DSC Eq. 4's idle link does not account for."""
        return self.selector.choose(batch, rate_bps, (LOCAL,) if link_busy else available)

    def observe_head(self, split: str, batch: int, head_ms: float) -> None:
        self.running.observe(split, batch, head_ms)
        self._observed += 1
        if self._observed % self.refine_every == 0:
            model = self.running.apply(self.base_model)
            self.selector.retune(self.calibration.table.for_model(model), model)

    def observe_result(self, result: FrameResult) -> None:
        """The table learns from head times (:meth:`observe_head`), not from answers."""
