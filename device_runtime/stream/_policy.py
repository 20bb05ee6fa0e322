"""Which split the next batch takes: fixed, or chosen from the calibration table as the link changes.

``available`` is what can run right now: ``local`` always, the host's splits only while a
host is connected. A split that is not available falls back to ``local`` at once, so a lost
host never costs a frame (the pipeline re-runs in-flight batches locally too).

Each policy answers with a :class:`~device_runtime.stream._reason.Choice`: the split and why
(:class:`~device_runtime.stream._reason.Reason`), which the frame's result, its printed line and
its trace record carry on.

:class:`AutoPolicy` also says what it decides with (:class:`HeadTimes`: the board's head times
and the table's edges they give), at the start and at each change, for the trace; given the head
times a trace recorded, it decides with those instead of its own, each from the same frame as
the traced run did (``split-device run --head-times``: a replay that differs from its trial only
where the link or the host made it differ).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, Callable, Collection, Mapping, Protocol, Sequence

from calibration import Decision, LatencyModel, RunningTimes, SplitSelector, SplitTable
from calibration.bandit import Bandit, LAYER, SEMANTIC
from calibration.calibration_file import Calibration
from device_runtime.bundle import LOCAL, OFFLOAD, Bundle
from device_runtime.stream._reason import (
    BANDIT, FIXED, HOLD, NO_HOST, NO_RATE, REFINED, TABLE, UPLOAD_CAP, Choice, Reason,
)
from device_runtime.stream._results import FrameResult
from splitedge import Fields, SplitEdgeError

__all__ = ["AutoPolicy", "BanditPolicy", "CALIBRATED", "HeadTimes", "RECORDED", "REFINED_TIMES", "SplitPolicy",
           "StaticPolicy"]

#: Where the head times :class:`AutoPolicy` decides with came from (:attr:`HeadTimes.source`): the
#: calibration (at the start), the running medians this board measured, or a trace's records.
CALIBRATED, REFINED_TIMES, RECORDED = "calibrated", "refined", "recorded"
_SOURCES = (CALIBRATED, REFINED_TIMES, RECORDED)
_fields = Fields(SplitEdgeError)
#: The board's speed against calibration moving by this factor rebuilds the table at once, ...
SPEED_STEP = 1.15
#: ... looked at every this many of the board's runs ...
SPEED_EVERY = 4
#: ... and rebuilt at most once this many seconds: a rebuild costs a few ms here and about 30 on a quarter
#: of a core beside busy neighbours, and rebuilt every few frames it took a sixth of the board's CPU.
REFINE_MIN_S = 1.0


@dataclass(frozen=True)
class HeadTimes:
    """The head times :class:`AutoPolicy` decides with, and from where in the stream.

    ``head_ms``: split -> batch -> ms, every split's of the latency model (empty for offload);
    ``edges``: batch -> the rates where the table they give changes split, ``(rate_bps, below,
    above)`` (:meth:`calibration.SplitTable.boundaries`), for a person or a page to read;
    ``index``: the last frame of the batch after whose head they were taken up, so they chose for
    the batches after it (None: from the start); ``observed``: the head runs timed by then;
    ``tail_ms``: split -> batch -> ms, the host's tail times it decided with (the host's speed kept
    current too: :meth:`calibration.RunningTimes.host_factor`; empty in a trace written before).
    """

    source: str
    index: int | None
    observed: int
    head_ms: Mapping[str, Mapping[int, float]]
    edges: Mapping[int, tuple[tuple[float, str, str], ...]]
    tail_ms: Mapping[str, Mapping[int, float]] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, source: str, index: int | None, observed: int, model: LatencyModel, table: SplitTable) -> HeadTimes:
        return cls(source, index, observed, {t.split: dict(t.head_ms) for t in model.splits},
                   {batch: tuple(table.boundaries(batch)) for batch in table.batches},
                   {t.split: dict(t.tail_ms) for t in model.splits})

    def applied_to(self, model: LatencyModel) -> LatencyModel:
        """``model`` with these head (and tail) times in place of its own; a split they lack keeps its
        own (a slice of the bundle they were recorded with has fewer), one the model lacks is left out."""
        return dataclasses.replace(model, splits=tuple(
            dataclasses.replace(t, head_ms=dict(self.head_ms.get(t.split, t.head_ms)),
                                tail_ms=dict(self.tail_ms.get(t.split, t.tail_ms)))
            for t in model.splits))

    def as_dict(self) -> dict[str, Any]:
        """The JSON form (batches as strings: JSON's keys), a trace's ``head_times`` record's fields."""
        return {
            "source": self.source, "index": self.index, "observed": self.observed,
            "head_ms": {split: {str(b): ms for b, ms in times.items()} for split, times in self.head_ms.items()},
            "edges": {str(b): [list(edge) for edge in edges] for b, edges in self.edges.items()},
            "tail_ms": {split: {str(b): ms for b, ms in times.items()} for split, times in self.tail_ms.items()},
        }

    @classmethod
    def from_dict(cls, d: Any, where: str) -> HeadTimes:
        """:meth:`as_dict`'s output read back; a malformed one is an error naming ``where``."""
        d = _fields.obj(d, where)
        index = d.get("index")
        head_ms = _fields.obj(_fields.member(d, "head_ms", where), f"{where} head_ms")
        edges = _fields.obj(d.get("edges", {}), f"{where} edges")
        return cls(
            source=_fields.choice(_fields.member(d, "source", where), f"{where} source", _SOURCES),
            index=None if index is None else _fields.integer(index, f"{where} index", minimum=0),
            observed=_fields.integer(d.get("observed", 0), f"{where} observed", minimum=0),
            head_ms=_times(head_ms, f"{where} head_ms"),
            edges={_batch(b, f"{where} edges"): tuple(_edge(e, f"{where} edges.{b}")
                                                      for e in _fields.array(row, f"{where} edges.{b}"))
                   for b, row in edges.items()},
            tail_ms=_times(_fields.obj(d.get("tail_ms", {}), f"{where} tail_ms"), f"{where} tail_ms"),
        )


def _times(times: Mapping[str, Any], where: str) -> dict[str, dict[int, float]]:
    """split -> batch -> ms, as :meth:`HeadTimes.as_dict` writes head and tail times."""
    return {split: {_batch(b, f"{where}.{split}"): _fields.number(ms, f"{where}.{split}.{b}")
                    for b, ms in _fields.obj(by_batch, f"{where}.{split}").items()}
            for split, by_batch in times.items()}


def _edge(value: Any, where: str) -> tuple[float, str, str]:
    """``[rate_bps, below, above]``, as :meth:`calibration.SplitTable.boundaries` gives it."""
    edge = _fields.array(value, where)
    if len(edge) != 3:
        raise SplitEdgeError(f"{where}: expected [rate_bps, below, above], got {edge!r}")
    return _fields.number(edge[0], where), _fields.text(edge[1], where), _fields.text(edge[2], where)


def _batch(key: str, where: str) -> int:
    try:
        return _fields.integer(int(key), where, minimum=1)
    except ValueError:
        raise SplitEdgeError(f"{where}: a batch size must be a whole number, got {key!r}") from None


class SplitPolicy(Protocol):
    def choose(
        self, batch: int, rate_bps: float | None, available: Collection[str], link_busy: bool = False,
        deadline_ms: float | None = None, uncapped_bps: float | None = None,
    ) -> Choice:
        """The split for the next batch and why (:class:`~device_runtime.stream._reason.Reason`).

        ``rate_bps``: the rate estimate, capped while an upload is overdue or crossing slowly
        (:attr:`device_runtime.hosts._link_meter.LinkMeter.rate_bps`), ``uncapped_bps`` the estimate
        without the cap; ``link_busy``: an upload is overdue (:meth:`~device_runtime.hosts._link_meter.LinkMeter.overdue`);
        ``deadline_ms``: the batch's deadline, capture to answer (None: none)."""
        ...

    def observe_batch(self, last: int) -> None:
        """Before each :meth:`choose`: the batch it chooses for ends with frame ``last`` (its index):
        where in the stream the choice is."""
        ...

    def observe_head(self, split: str, batch: int, head_ms: float, sending: bool = False) -> None:
        """A head's time; ``sending``: the board's own uploads were in flight meanwhile."""
        ...

    def observe_preprocess(self, ms: float, sending: bool = False) -> None:
        """Each frame's preprocessing, as the batch it is in is chosen for: board compute too."""
        ...

    def observe_tail(self, split: str, batch: int, ms: float) -> None:
        """The host's compute for a batch it answered (its reply says it)."""
        ...

    def alternative(self, batch: int) -> tuple[str, float] | None:
        """What the board would do with a batch the host refused, and its ms: the host weighs a
        deadline against it (:attr:`~device_runtime.wire.InferRequest.give_up_ms`). None: unknown."""
        ...

    def observe_result(self, result: FrameResult) -> None:
        """Each answered frame, as it comes out of the stream."""
        ...


class StaticPolicy:
    """One split for the whole run (``--split ID``), ``local`` while no host can take it."""

    def __init__(self, split: str, bundle: Bundle) -> None:
        if split not in (LOCAL, OFFLOAD):
            bundle.manifest.option(split)  # an unknown split or coding fails before the camera starts
        self.split = split

    def choose(
        self, batch: int, rate_bps: float | None, available: Collection[str], link_busy: bool = False,
        deadline_ms: float | None = None, uncapped_bps: float | None = None,
    ) -> Choice:
        """The fixed split, a slow link or not: the run measures that split."""
        if self.split in available:
            return Choice(self.split, Reason(FIXED))
        return Choice(LOCAL, Reason(NO_HOST, batch=batch, wanted=self.split))

    def observe_batch(self, last: int) -> None:
        """A fixed split is the same wherever the stream is."""

    def observe_head(self, split: str, batch: int, head_ms: float, sending: bool = False) -> None:
        """A fixed split learns nothing from its timings."""

    def observe_preprocess(self, ms: float, sending: bool = False) -> None:
        """Nor from its preprocessing's."""

    def observe_tail(self, split: str, batch: int, ms: float) -> None:
        """Nor from the host's."""

    def alternative(self, batch: int) -> tuple[str, float] | None:
        """Nothing measured the board's full model: the host goes by the deadline alone."""
        return None

    def observe_result(self, result: FrameResult) -> None:
        """Nor from its answers."""


class AutoPolicy:
    """DSC's dynamic split computing: the table's best split for (batch, rate), with hysteresis.

    While an upload is overdue the link is taken to be slower than its bytes over the time
    it has been out (the rate the pipeline passes is capped so), and the batch runs here.

    The head times measured at calibration are refined by the ones measured as the stream
    runs (a board warms up, throttles, shares its CPU): every ``refine_every`` batches, or as
    soon as the board's speed against calibration moves (:meth:`calibration.RunningTimes.factor`),
    the model takes the running times of every option (:meth:`calibration.RunningTimes.apply`)
    and the table is rebuilt (a few ms, off the per-frame path's O(1) lookup); ``refine_every``
    None decides with the calibration alone. A choice the rebuilt table makes otherwise than the
    calibrated one says so (``refined``).

    Given ``recorded`` (a trace's :class:`HeadTimes`, :func:`~device_runtime.stream.trace.read_head_times`),
    it measures nothing: it starts with the recorded start's head times (where there is one) and
    takes up each later record before choosing for the first batch past the record's frame, as
    the recorded run did, whatever this board's heads take. :meth:`watch` hears of every change.
    """

    def __init__(
        self, calibration: Calibration, margin: float = 0.1, min_hold: int = 3, refine_every: int | None = 32,
        recorded: Sequence[HeadTimes] | None = None, refine_min_s: float = REFINE_MIN_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.calibration = calibration
        self.base_model = calibration.model
        self.model = calibration.model  # what it decides with now: refined, or recorded
        self.running = RunningTimes()
        self.selector = SplitSelector(calibration.table, calibration.model, margin=margin, min_hold=min_hold)
        self.refine_every = refine_every
        self._observed = 0  # head runs
        self._runs = 0  # the board's runs: heads and frames' preprocessing
        self.refine_min_s, self._clock = refine_min_s, clock
        self._refined_s = -math.inf  # clock time of the last rebuild
        self._refined_at = 0  # the runs observed when the table was last rebuilt ...
        # ... and the board's and the host's speed factors then (None: calibrated)
        self._refined_factor: tuple[float | None, float | None] | None = None
        self._last: int | None = None  # the last frame of the batch being chosen for (observe_batch)
        self._table = calibration.table  # the one the selector decides with: rebuilt by refining
        self._listeners: list[Callable[[HeadTimes], object]] = []
        #: What it decides with now (:meth:`watch`).
        self.head_times = HeadTimes.of(CALIBRATED, None, 0, calibration.model, calibration.table)
        # The recorded head times still to take up, in stream order (the start's first).
        self._recorded = None if recorded is None else deque(
            sorted(recorded, key=lambda times: -1 if times.index is None else times.index))
        if self._recorded and self._recorded[0].index is None:
            self._take_up(self._recorded.popleft())

    @property
    def replaying(self) -> bool:
        """Whether it decides with recorded head times rather than this board's."""
        return self._recorded is not None

    def watch(self, listener: Callable[[HeadTimes], object]) -> None:
        """Call ``listener`` with the head times it decides with now, and again at each change
        (a refinement, or a recorded one taken up): what a trace records."""
        self._listeners.append(listener)
        listener(self.head_times)

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

    def observe_batch(self, last: int) -> None:
        """Where the stream is; recorded head times due before this batch are taken up now."""
        self._last = last
        while self._recorded and self._recorded[0].index is not None and self._recorded[0].index < last:
            self._take_up(self._recorded.popleft())

    def observe_head(self, split: str, batch: int, head_ms: float, sending: bool = False) -> None:
        """A head's time, into the running medians; every ``refine_every`` of them the table is
        rebuilt with those (none of it while replaying recorded head times)."""
        if self.replaying or self.refine_every is None:  # None: decides with the calibration alone
            return
        self.running.observe(split, batch, head_ms, sending)
        self._observed += 1
        self._runs += 1
        self._maybe_refine()

    def observe_preprocess(self, ms: float, sending: bool = False) -> None:
        """A frame's preprocessing, into the board's speed (:meth:`calibration.RunningTimes.observe_preprocess`)."""
        if self.replaying or self.refine_every is None:
            return
        self.running.observe_preprocess(ms, sending)
        self._runs += 1
        self._maybe_refine()

    def observe_tail(self, split: str, batch: int, ms: float) -> None:
        """The host's compute for a batch, into the host's speed (:meth:`calibration.RunningTimes.host_factor`):
        every remote option's tail follows it."""
        if self.replaying or self.refine_every is None:
            return
        self.running.observe_tail(split, batch, ms)
        self._runs += 1
        self._maybe_refine()

    def _maybe_refine(self) -> None:
        """Rebuild the table every ``refine_every`` runs seen (heads, preprocessing, the host's
        replies), or as soon as a speed moved (:meth:`_speed_moved`); at most once a ``refine_min_s``."""
        since = self._runs - self._refined_at
        if since < min(SPEED_EVERY, self.refine_every):
            return
        now = self._clock()
        if now - self._refined_s < self.refine_min_s:
            return  # a rebuild costs a quarter core about 30 ms: not more than one a refine_min_s
        if not (since >= self.refine_every or self._speed_moved()):  # the speeds only when a rebuild may follow
            return
        self._refined_s = now
        model = self.running.apply(self.base_model)
        self._refined_at, self._refined_factor = self._runs, self._factors()
        self._retune(model, lambda table: HeadTimes.of(REFINED_TIMES, self._last, self._observed, model, table))

    def _speed_moved(self) -> bool:
        """Whether the board's or the host's speed against calibration (:meth:`_factors`) moved by
        more than SPEED_STEP since the table was last rebuilt: a neighbour took or left the board's
        CPU (or the host's), and waiting ``refine_every`` runs (seconds on a quarter of a core) would
        keep choosing with the old speed meanwhile."""
        before = self._refined_factor or (None, None)
        return any(now is not None and now > 0 and abs(math.log(now / (then or 1.0))) > math.log(SPEED_STEP)
                   for now, then in zip(self._factors(), before))

    def _factors(self) -> tuple[float | None, float | None]:
        """The board's and the host's speeds against calibration, now."""
        return self.running.factor(self.base_model), self.running.host_factor(self.base_model)

    def pace(self, interval_ms: float | None) -> None:
        """Choose for a live camera with frames ``interval_ms`` apart (None: unpaced): an option whose
        slowest stage cannot keep up with it is weighed by the frames it would leave unanswered
        (:meth:`calibration.LatencyModel.cost_ms`), and the table is rebuilt so."""
        self.base_model = self.base_model.paced(interval_ms)
        model = self.model.paced(interval_ms)
        now = self.head_times
        self._retune(model, lambda table: HeadTimes.of(now.source, now.index, now.observed, model, table))

    def alternative(self, batch: int) -> tuple[str, float] | None:
        """The board's full model, at the time the model decides with now (refined as it runs)."""
        if LOCAL not in self.model.names:
            return None
        return LOCAL, self.model.timings(LOCAL).head_at(batch)

    def _take_up(self, recorded: HeadTimes) -> None:
        model = recorded.applied_to(self.base_model)
        self._retune(model, lambda table: HeadTimes.of(RECORDED, recorded.index, recorded.observed, model, table))

    def _retune(self, model: LatencyModel, times: Callable[[SplitTable], HeadTimes]) -> None:
        self._table = self.calibration.table.for_model(model)
        self.model = model
        self.selector.retune(self._table, model)
        self.head_times = times(self._table)
        for listener in self._listeners:
            listener(self.head_times)

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

    def observe_batch(self, last: int) -> None:
        self.layer.observe_batch(last)

    def observe_head(self, split: str, batch: int, head_ms: float, sending: bool = False) -> None:
        if split != self.semantic.id:
            self.layer.observe_head(split, batch, head_ms, sending)

    def observe_preprocess(self, ms: float, sending: bool = False) -> None:
        self.layer.observe_preprocess(ms, sending)

    def observe_tail(self, split: str, batch: int, ms: float) -> None:
        if split != self.semantic.id:
            self.layer.observe_tail(split, batch, ms)

    def alternative(self, batch: int) -> tuple[str, float] | None:
        return self.layer.alternative(batch)

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
