"""Which split the next batch takes: fixed, or chosen from the calibration table as the link changes.

``available`` is what can run right now: ``local`` always, the host's splits only while a
host is connected. A split that is not available falls back to ``local`` at once, so a lost
host never costs a frame (the pipeline re-runs in-flight batches locally too).
"""

from __future__ import annotations

from typing import Collection, Protocol

from calibration import LAYER, SEMANTIC, Bandit, Calibration, RunningTimes, SplitSelector
from device_runtime.bundle import LOCAL, OFFLOAD, Bundle
from device_runtime.stream.results import FrameResult

__all__ = ["AutoPolicy", "BanditPolicy", "SplitPolicy", "StaticPolicy"]


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


class BanditPolicy:
    """SplitPlace's choice, batch by batch, between the layer split and the semantic split, from the
    batch's deadline (:class:`calibration.Bandit`: two contexts, ε-greedy while learning, D-UCB
    while running).

    The layer arm is the ``layer`` policy's choice (a fixed split or the calibration table's for
    the link: a single cut, a chain, offload or local); the semantic arm is ``semantic``. A batch
    without a deadline, or whose semantic split has no hosts now, takes the layer arm: the
    bandit's contexts are deadlines, and an arm that cannot run is no choice.

    Each answered frame is the bandit's feedback: its response time (capture to answer) against
    its deadline, and the arm's accuracy as the bundle measured it (``Split.accuracies`` of the
    semantic split: "layer" and "semantic"). A semantic answer that lacked fragments is scored
    at the semantic accuracy times the share of classes that were scored: a frame of a missing
    group cannot be right. A batch that fell back to the board counts for the arm that was
    chosen, at the full model's accuracy, as it was answered.
    """

    def __init__(self, layer: SplitPolicy, bundle: Bundle, semantic: str, bandit: Bandit) -> None:
        split = bundle.manifest.split(semantic)
        if not split.fragments:
            raise ValueError(f"split {semantic} is no semantic split")
        self.layer, self.semantic, self.bandit = layer, split, bandit
        full = bundle.manifest.model.accuracy
        self.accuracy = {LAYER: split.accuracies.get("layer", full), SEMANTIC: split.accuracies.get("semantic"),
                         LOCAL: split.accuracies.get("full", full)}
        self.labels = len(bundle.manifest.model.labels)
        self.chosen: dict[str, int] = {LAYER: 0, SEMANTIC: 0}

    @property
    def switches(self) -> int:
        return getattr(self.layer, "switches", 0)

    def choose(
        self, batch: int, rate_bps: float | None, available: Collection[str], link_busy: bool = False,
        deadline_ms: float | None = None,
    ) -> str:
        arms = [LAYER] + ([SEMANTIC] if self.semantic.id in available and not link_busy else [])
        arm = LAYER if deadline_ms is None else self.bandit.choose(deadline_ms, arms)
        self.chosen[arm] += 1
        if arm == SEMANTIC:
            return self.semantic.id
        return self.layer.choose(batch, rate_bps, [s for s in available if s != self.semantic.id], link_busy,
                                 deadline_ms)

    def observe_head(self, split: str, batch: int, head_ms: float) -> None:
        if split != self.semantic.id:
            self.layer.observe_head(split, batch, head_ms)

    def observe_result(self, result: FrameResult) -> None:
        if result.deadline_ms is None:
            return
        chosen = result.attempted or result.split
        arm = SEMANTIC if chosen == self.semantic.id else LAYER
        accuracy = self.accuracy[LOCAL if result.error else arm]
        if accuracy is None:
            return  # nothing measured to weigh the answer by: the bundle was built without test data
        if arm == SEMANTIC and result.missing:
            scored = sum(len(f.classes) for f in self.semantic.fragments if f.index not in result.missing)
            accuracy *= scored / self.labels
        self.bandit.observe(arm, result.deadline_ms, result.total_ms, accuracy)
        self.layer.observe_result(result)
