"""Which split the next batch takes: fixed, or chosen from the calibration table as the link changes.

``available`` is what can run right now: ``local`` always, the host's splits only while a
host is connected. A split that is not available falls back to ``local`` at once, so a lost
host never costs a frame (the pipeline re-runs in-flight batches locally too).

Each policy answers with a :class:`~device_runtime.stream.reason.Choice`: the split and why
(:class:`~device_runtime.stream.reason.Reason`), which the frame's result, its printed line and
its trace record carry on.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Collection, Protocol

from calibration import LAYER, SEMANTIC, Bandit, Calibration, Decision, RunningTimes, SplitSelector
from device_runtime.bundle import LOCAL, OFFLOAD, Bundle
from device_runtime.stream.reason import (
    BANDIT, FIXED, HOLD, NO_HOST, NO_RATE, REFINED, TABLE, UPLOAD_CAP, Choice, Reason,
)
from device_runtime.stream.results import FrameResult

__all__ = ["AutoPolicy", "BanditPolicy", "SplitPolicy", "StaticPolicy"]


class SplitPolicy(Protocol):
    def choose(
        self, batch: int, rate_bps: float | None, available: Collection[str], link_busy: bool = False,
        deadline_ms: float | None = None, uncapped_bps: float | None = None,
    ) -> Choice:
        """The split for the next batch and why (:class:`~device_runtime.stream.reason.Reason`).

        ``rate_bps``: the rate estimate, capped while an upload is overdue or crossing slowly
        (:attr:`device_runtime.hosts.link_meter.LinkMeter.rate_bps`), ``uncapped_bps`` the estimate
        without the cap; ``link_busy``: an upload is overdue (:meth:`~device_runtime.hosts.link_meter.LinkMeter.overdue`);
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
        deadline_ms: float | None = None, uncapped_bps: float | None = None,
    ) -> Choice:
        """The fixed split, a slow link or not: the run measures that split."""
        if self.split in available:
            return Choice(self.split, Reason(FIXED))
        return Choice(LOCAL, Reason(NO_HOST, batch=batch, wanted=self.split))

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
    path's O(1) lookup). A choice the rebuilt table makes otherwise than the calibrated one
    says so (``refined``).
    """

    def __init__(self, calibration: Calibration, margin: float = 0.1, min_hold: int = 3, refine_every: int = 32) -> None:
        self.calibration = calibration
        self.base_model = calibration.model
        self.running = RunningTimes()
        self.selector = SplitSelector(calibration.table, calibration.model, margin=margin, min_hold=min_hold)
        self.refine_every = refine_every
        self._observed = 0
        self._table = calibration.table  # the one the selector decides with: rebuilt by refining

    @property
    def switches(self) -> int:
        return self.selector.switches

    def choose(
        self, batch: int, rate_bps: float | None, available: Collection[str], link_busy: bool = False,
        deadline_ms: float | None = None, uncapped_bps: float | None = None,
    ) -> Choice:
        """The table's choice; ``local`` at once while an upload is overdue: anything sent now
        would wait in the socket behind it, which DSC Eq. 4's idle link does not account for.
        While one crosses slower than the estimate (``rate_bps`` capped below ``uncapped_bps``)
        the capped rate's choice is taken at once too, without the hysteresis: that rate is the
        link's now, not an estimate's wobble. Back up, the hysteresis applies again."""
        capped = rate_bps is not None and uncapped_bps is not None and rate_bps < uncapped_bps
        decision = self.selector.decide(batch, rate_bps, (LOCAL,) if link_busy else available, at_once=capped)
        if link_busy:
            return Choice(decision.split, Reason(UPLOAD_CAP, batch=batch, rate_bps=rate_bps,
                                                 uncapped_bps=uncapped_bps, overdue=True))
        reason = self._reason(decision, batch, rate_bps)
        if capped:
            cap_chose = decision.why == Decision.TABLE and self._table.lookup(batch, uncapped_bps) != decision.split
            reason = replace(reason, kind=UPLOAD_CAP if cap_chose else reason.kind, uncapped_bps=uncapped_bps,
                             overdue=False)
        return Choice(decision.split, reason)

    def _reason(self, decision: Decision, batch: int, rate_bps: float | None) -> Reason:
        cell = {"batch": batch, "rate_bps": rate_bps, "lo_bps": decision.lo_bps, "hi_bps": decision.hi_bps}
        if decision.why == Decision.NO_RATE:
            return Reason(NO_RATE, batch=batch)
        if decision.why == Decision.UNAVAILABLE:
            return Reason(NO_HOST, batch=batch, rate_bps=rate_bps, wanted=decision.wanted)
        if decision.why == Decision.HOLD:
            return Reason(HOLD, **cell, wanted=decision.wanted, streak=decision.streak,
                          wanted_ms=decision.wanted_ms, kept_ms=decision.current_ms, margin=decision.margin)
        assert rate_bps is not None  # the table chose: it had a rate
        calibrated = self.calibration.table.lookup(batch, rate_bps)
        if self._table is not self.calibration.table and calibrated != decision.split:
            return Reason(REFINED, **cell, calibrated=calibrated)
        return Reason(TABLE, **cell)

    def observe_head(self, split: str, batch: int, head_ms: float) -> None:
        self.running.observe(split, batch, head_ms)
        self._observed += 1
        if self._observed % self.refine_every == 0:
            model = self.running.apply(self.base_model)
            self._table = self.calibration.table.for_model(model)
            self.selector.retune(self._table, model)

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
        deadline_ms: float | None = None, uncapped_bps: float | None = None,
    ) -> Choice:
        """The bandit's arm for a batch with a deadline (the semantic split, or the layer policy's
        choice, its reason then naming the arm too); the layer policy's choice without one."""
        arms = [LAYER] + ([SEMANTIC] if self.semantic.id in available and not link_busy else [])
        arm = LAYER if deadline_ms is None else self.bandit.choose(deadline_ms, arms)
        self.chosen[arm] += 1
        score = None if deadline_ms is None else self._score(deadline_ms, arm)
        if arm == SEMANTIC:
            return Choice(self.semantic.id, Reason(BANDIT, batch=batch, rate_bps=rate_bps, arm=arm, score=score))
        choice = self.layer.choose(batch, rate_bps, [s for s in available if s != self.semantic.id], link_busy,
                                   deadline_ms, uncapped_bps)
        return choice if deadline_ms is None else Choice(choice.split, replace(choice.reason, arm=arm, score=score))

    def _score(self, deadline_ms: float, arm: str) -> float:
        """What the bandit knows of ``arm`` for this deadline: its mean reward (discounted while running)."""
        stats = self.bandit.stats(self.bandit.context(deadline_ms), arm)
        return stats.mean if self.bandit.mode == "learn" else stats.discounted_mean

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
