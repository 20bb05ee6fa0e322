"""The board's stream: capture, head, transfer and the host's tail overlap; no frame is lost.

Stages, each its own worker so that they overlap::

    camera ─▶ [FrameQueue] ─▶ batch ─▶ preprocess ─▶ head ─▶ send ─▶ host: tail ─▶ reply
    (capture    drops by policy          (compute thread)           (up to ``in_flight`` batches)
     thread)

While batch *n* travels and runs on the host, batch *n+1* is already in the head, and the
camera keeps filling the queue; throughput is that of the slowest stage, not of their sum.
Frames are preprocessed after the queue has decided which of them to keep: a camera faster
than the head has most of its frames dropped, and those never cost a resize.
A full queue drops frames by policy (newest wins for a live camera) and every drop is
reported as a result of its own. A remote batch that fails (host gone, timeout, refusal)
is run again here with the full model, so every captured frame gets an answer; the host is
looked for again in the background and the stream goes back to offloading when it answers.
Each request carries the frame's budget as its deadline (a live camera's frame interval):
a host whose queue would answer later refuses it at once, and the batch runs here; only a
host silent for ``request_timeout_s`` is taken for gone.
Only remote batches count against ``in_flight``: the board keeps running local batches
while the link is slow, and a live source's results come out as soon as each is known
(a recorded source's in capture order).

A chain (several cuts, its stages on a row of hosts) is sent to the connected host as stage 1
with the route of the stages after it (``PipelineConfig.routes``); the host passes it on and the
reply says where the time went; a chain that breaks anywhere is answered here, like any split.
A semantic split's cut goes to each of its fragments' hosts at once (``PipelineConfig.fragments``,
:mod:`device_runtime.stream.fragments`): the answer merges those that came by the frame's
deadline, and only a batch no fragment answered is run here.

Which split each batch takes is the policy's (:mod:`device_runtime.stream.policy`): fixed, or the
calibration table's choice for the current rate estimate (:mod:`device_runtime.hosts.link_meter`),
which comes from the stream's own transfers and, while nothing is offloaded, from probes. The
policy says why (:class:`~device_runtime.stream.reason.Reason`), and each frame's result carries
it; a batch the board answers instead says so (``fallback``, ``deadline``, ``no_host``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import AsyncIterator, Callable, Collection, Mapping, TypeVar

import numpy as np

from calibration import HostView, place_fragments
from device_runtime.bundle import LOCAL, OFFLOAD, stage_id
from device_runtime.engine import AUTO, DeviceRunner
from device_runtime.wire import Credentials, HostClient, InferResult
from device_runtime.hosts import HostLink, LinkMeter, probe_bytes
from device_runtime.wire import ClientPool
from device_runtime.stream.camera import Frame, FrameSource
from device_runtime.stream.fragments import gather
from device_runtime.stream.frame_queue import FrameQueue
from device_runtime.stream.pace import PREPROCESS, BoardPace
from device_runtime.stream.policy import SplitPolicy
from device_runtime.stream.reason import DEADLINE, FALLBACK, NO_HOST, Reason
from device_runtime.stream.results import DROP_QUEUE_FULL, FrameResult, top1
from device_runtime.wire import ErrorCode, Hop
from splitedge import HostUnavailableError, RemoteError

__all__ = ["Pipeline", "PipelineConfig", "PipelineStats"]

T = TypeVar("T")

log = logging.getLogger("splitedge.device")


@dataclass(frozen=True)
class PipelineConfig:
    batch: int = 1  # frames per head run (``--batch``)
    # Frames waiting for the head before the drop policy applies. None: one batch when the
    # newest frames win (a live camera: the head always takes the freshest frames, and a
    # board that only just keeps up cannot carry a standing backlog — with 4 frames queued,
    # ResNet-18 at 5 fps on the emulated board answered 0.9 s late after a link stall, for
    # good), else 4.
    queue: int | None = None
    in_flight: int = 2  # remote batches outstanding: one crosses while the next waits in the socket
    drop: str | None = None  # newest | none; None: newest for a live source, none for a recorded one
    request_timeout_s: float = 5.0  # a host silent this long is gone: the batch runs here instead
    # The host's share of each batch, its queue and tail (ms), sent as the request's deadline: a
    # host that cannot answer in time says ``deadline_exceeded`` (at once, when its queue shows
    # it) and the batch runs here. AUTO: a live source's frame interval (the next frame is due
    # then, and a host slower than that only lets frames pile up); none for a source without one.
    # None: no deadline. A number is above 0: a budget of 0 would be spent before it was sent.
    deadline_ms: float | str | None = AUTO
    probe_every_s: float = 1.0  # probe the link when the rate estimate is older than this
    # A chain's id -> the addresses (host:port) of the hosts of its stages 2..n, in order; the
    # connected host runs stage 1, and () puts every stage on it. A chain runs only with a route.
    routes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # A semantic split's id -> the addresses of the hosts of its fragments 1..K, in order; () puts
    # every fragment on the connected host. A semantic split runs only with an entry here. A
    # fragment whose host goes away is placed again on the others (calibration.place_fragments).
    fragments: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # A trial's stage times to hold the board to (``--pace``: a replay run at the trial's board's
    # speed, :mod:`device_runtime.stream.pace`); None: the board runs at its own.
    pace: BoardPace | None = None

    def __post_init__(self) -> None:
        for name in ("batch", "queue", "in_flight"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        deadline = self.deadline_ms
        if deadline is not None and deadline != AUTO and not (isinstance(deadline, (int, float)) and deadline > 0):
            raise ValueError(f"deadline_ms must be above 0 ms (None: none; AUTO: a live source's frame interval), "
                             f"got {self.deadline_ms!r}")

    def frame_queue(self, live: bool) -> tuple[int, str]:
        """(capacity, drop policy) of the queue before the head, for a live source or a recorded one."""
        drop = self.drop or ("newest" if live else "none")
        capacity = self.queue or (1 if drop == "newest" else 4)
        return max(capacity, self.batch), drop

    def deadline_for(self, source: FrameSource) -> float | None:
        """Each request's deadline (ms) for frames of ``source``; None for none."""
        if self.deadline_ms != AUTO:
            return self.deadline_ms
        interval = source.frame_interval_s if source.live else None
        return None if interval is None else interval * 1000.0


@dataclass
class PipelineStats:
    """What happened to the frames: the run summary ``split-device run`` prints at the end."""

    frames: int = 0
    dropped: int = 0
    fallbacks: int = 0  # frames of remote batches answered locally after a failure
    per_split: Counter[str] = field(default_factory=Counter)

    @property
    def drop_rate(self) -> float:
        return self.dropped / self.frames if self.frames else 0.0


@dataclass(frozen=True)
class _Answer:
    """How one batch was answered: the split that answered it, its stages' times (ms), the host
    (None: here) and the waits apart from its stages; every frame of the batch shares them."""

    split: str
    rate: float | None  # the rate estimate the split was chosen with (bit/s)
    reason: Reason  # why the split answered it
    head_ms: float
    transfer_ms: float = 0.0
    tail_ms: float = 0.0
    sent_bytes: int = 0
    host: str | None = None
    error: str | None = None  # why a remote answer fell back here
    started: float | None = None  # monotonic s when the batch's head started
    slot_ms: float = 0.0
    host_queue_ms: float = 0.0
    missing: tuple[int, ...] = ()  # semantic fragments that did not answer in time
    attempted: str | None = None  # the split tried before a fallback


@dataclass(frozen=True)
class _Captured:
    frame: Frame
    x: np.ndarray  # (1, *input) preprocessed
    preprocess_ms: float


_END = object()


class Pipeline:
    """Runs a frame source through a :class:`DeviceRunner` with a split policy and an optional host.

    One pipeline serves one :meth:`run`: its worker threads end with it.
    """

    def __init__(
        self,
        runner: DeviceRunner,
        policy: SplitPolicy,
        hosts: HostLink | None = None,
        config: PipelineConfig = PipelineConfig(),
        meter: LinkMeter | None = None,
    ) -> None:
        self.runner, self.policy, self.hosts, self.config = runner, policy, hosts, config
        self.meter = meter or LinkMeter()
        self.stats = PipelineStats()
        self._compute = ThreadPoolExecutor(1, thread_name_prefix="compute")  # the board's one inference engine
        self._camera = ThreadPoolExecutor(1, thread_name_prefix="capture")
        self._remote = 0  # remote batches in flight
        self._slots: asyncio.Semaphore | None = None  # ... at most ``in_flight`` of them (made in run's loop)
        self._deadline_ms: float | None = None  # each frame's, for the source being run, unless the frame has its own
        self._failure: Exception | None = None  # the first stage's failure, raised after the results before it
        # Connections to a semantic split's fragment hosts other than the connected one, and where
        # fragments were moved to after their host went away.
        self._placed: dict[str, dict[int, str]] = {}
        # (chain, host) pairs whose host refused the chain's route (``unauthorized``: a next hop it
        # may not dial). That is the host's configuration, which no retry changes: the chain is left
        # out while that host is the one connected, instead of falling back frame after frame.
        self._refused_routes: set[tuple[str, str]] = set()
        self._pool = ClientPool(hosts.credentials if hosts is not None else Credentials(), config.request_timeout_s,
                                what="fragment host")

    def available(self) -> frozenset[str]:
        """Splits that can run now: ``local`` always, the host's while one is connected, a chain
        with a route whose first stage the connected host serves, and a semantic split with its
        fragments' hosts (those on the connected host served by it)."""
        if self.hosts is None or self.hosts.client is None:
            return frozenset((LOCAL,))
        served = self.hosts.served()
        address = self.hosts.client.address
        chains = {chain for chain in self.config.routes
                  if stage_id(chain, 1) in served and (chain, address) not in self._refused_routes}
        semantic = {split for split in self.config.fragments
                    if all(stage_id(split, k) in served for k, a in self._placement(split).items()
                           if a == self.hosts.client.address)}
        return served | chains | semantic | {LOCAL}

    async def run(
        self, source: FrameSource, frames: int | None = None, stop: asyncio.Event | None = None
    ) -> AsyncIterator[FrameResult]:
        """One result per captured frame (dropped ones included), in order within each kind,
        until the source ends, ``frames`` were captured, or ``stop`` is set."""
        out: asyncio.Queue[object] = asyncio.Queue()
        queue: FrameQueue[Frame] = FrameQueue(*self.config.frame_queue(source.live))
        jobs: asyncio.Queue[asyncio.Future[list[FrameResult]] | None] = asyncio.Queue()
        self._slots = asyncio.Semaphore(self.config.in_flight)
        self._deadline_ms = self.config.deadline_for(source)
        if self.hosts is not None and self.hosts.client is not None:
            await self.probe(self.hosts.client)  # a first rate estimate before the first choice
        workers = [
            asyncio.ensure_future(self._capture(source, queue, frames, stop, out)),
            asyncio.ensure_future(self._process(queue, jobs)),
            asyncio.ensure_future(self._emit(jobs, out, ordered=not source.live)),
        ]
        prober = asyncio.ensure_future(self._probe_when_idle())
        try:
            while True:
                item = await out.get()
                if item is _END:
                    break
                if isinstance(item, BaseException):
                    raise item
                assert isinstance(item, FrameResult)
                self._count(item)
                yield item
        finally:
            for task in (*workers, prober):
                task.cancel()
            await asyncio.gather(*workers, prober, return_exceptions=True)
            await self._pool.close()
            self._compute.shutdown(wait=False, cancel_futures=True)
            self._camera.shutdown(wait=False, cancel_futures=True)

    def _count(self, result: FrameResult) -> None:
        self.stats.frames += 1
        if result.dropped:
            self.stats.dropped += 1
        else:
            self.stats.per_split[result.split] += 1
        if result.error:
            self.stats.fallbacks += 1
        if not result.dropped:
            self.policy.observe_result(result)

    async def _capture(
        self, source: FrameSource, queue: FrameQueue[Frame], frames: int | None, stop: asyncio.Event | None,
        out: asyncio.Queue[object],
    ) -> None:
        """The camera, in its own thread: it overlaps with the head."""
        loop = asyncio.get_running_loop()
        captured = iter(source)
        count = 0
        try:
            while (frames is None or count < frames) and not (stop is not None and stop.is_set()):
                frame = await loop.run_in_executor(self._camera, next, captured, None)
                if frame is None:
                    break
                count += 1
                victim = await queue.put(frame)
                if victim is not None:
                    out.put_nowait(_dropped(victim))
        except Exception as exc:  # a dead camera: reported after the frames already taken are answered
            self._fail(exc)
        finally:
            queue.close()

    def _preprocess(self, frames: list[Frame]) -> list[_Captured]:
        return [_Captured(frame, *self._engine(frame.index, 1, PREPROCESS, partial(self._timed_preprocess, frame)))
                for frame in frames]

    def _timed_preprocess(self, frame: Frame) -> tuple[np.ndarray, float]:
        start = time.perf_counter()
        x = self.runner.preprocess(frame.image)
        return x, (time.perf_counter() - start) * 1000.0

    async def _on_engine(self, batch: list[_Captured], stage: str, run: Callable[[], tuple[T, float]]) -> tuple[T, float]:
        """:meth:`_engine` for a batch, on the board's engine thread."""
        return await asyncio.get_running_loop().run_in_executor(self._compute, self._engine, batch[0].frame.index,
                                                                len(batch), stage, run)

    def _engine(self, index: int, batch: int, stage: str, run: Callable[[], tuple[T, float]]) -> tuple[T, float]:
        """``run`` a stage of the batch of ``batch`` frames from frame ``index`` on the board's engine
        (this thread): with a pace, held to the time the trial's board took for it."""
        pace = self.config.pace
        return run() if pace is None else pace.hold(pace.target_ms(index, stage, batch), run)

    async def _process(self, queue: FrameQueue[Frame], jobs: asyncio.Queue) -> None:
        """Batch, preprocess, choose the split, run the head; remote batches go on while the next head runs.

        Frames are preprocessed here, in the head's thread, once the queue has kept them: a dropped
        frame is never resized. Preprocessing no longer overlaps with the previous head; for a
        live camera that is the price of the freshest frame (one taken from the queue early is older)."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                frames = await queue.get_batch(self.config.batch)
                if not frames:
                    return
                batch = await loop.run_in_executor(self._compute, self._preprocess, frames)
                jobs.put_nowait(await self._start(batch))  # bounded by the head's pace and the remote slots
        except Exception as exc:  # a head that fails, a bundle that cannot send: end the stream with it
            self._fail(exc)
        finally:
            await jobs.put(None)

    async def _emit(self, jobs: asyncio.Queue, out: asyncio.Queue[object], ordered: bool) -> None:
        """Each batch's results: in batch order when ``ordered``, else as soon as the batch is done
        (a local batch run while a remote one crosses a slow link is not held back behind it)."""
        delivering: list[asyncio.Future[bool]] = []
        while (job := await jobs.get()) is not None:
            if ordered:
                if not await self._deliver(job, out):
                    break
            else:
                delivering = [d for d in delivering if not d.done()]
                delivering.append(asyncio.ensure_future(self._deliver(job, out)))
        await asyncio.gather(*delivering)
        out.put_nowait(self._failure if self._failure is not None else _END)

    async def _deliver(self, job: asyncio.Future[list[FrameResult]], out: asyncio.Queue[object]) -> bool:
        """The batch's results into ``out``; False (and the failure recorded) if it failed."""
        try:
            results = await job
        except Exception as exc:
            self._fail(exc)
            return False
        for result in results:
            out.put_nowait(result)
        return True

    def _fail(self, exc: Exception) -> None:
        """The first failure ends the stream; the results before it have been delivered."""
        if self._failure is None:
            self._failure = exc

    async def _start(self, batch: list[_Captured]) -> asyncio.Future[list[FrameResult]]:
        loop = asyncio.get_running_loop()
        x = np.concatenate([c.x for c in batch])
        client = self.hosts.client if self.hosts is not None else None
        self.meter.crossing = client.crossing if client is not None else None
        rate = self.meter.rate_bps  # capped by an overdue upload, or one crossing slowly, if one is
        deadline = self._deadline(batch)
        for captured in batch:  # board compute whatever the split: the board's speed now
            self.policy.observe_preprocess(captured.preprocess_ms, sending=self._remote > 0)
        self.policy.observe_batch(batch[-1].frame.index)
        choice = self.policy.choose(len(batch), rate, self.available(), link_busy=self.meter.overdue() is not None,
                                    deadline_ms=deadline, uncapped_bps=self.meter.estimator.rate_bps)
        split, reason = choice.split, choice.reason
        if split == LOCAL or client is None:
            if split != LOCAL:  # the host went in the meantime
                reason = Reason(NO_HOST, batch=len(batch), wanted=split)
            logits, ms = await self._on_engine(batch, LOCAL, partial(self.runner.run_full, x))
            self.policy.observe_head(LOCAL, len(batch), ms, sending=self._remote > 0)
            done: asyncio.Future[list[FrameResult]] = loop.create_future()
            done.set_result(self._results(batch, logits, _Answer(LOCAL, rate, reason, ms,
                                                                 started=time.monotonic() - ms / 1e3)))
            return done
        if split == OFFLOAD:
            cut, head_ms = x, 0.0
        else:
            cut, head_ms = await self._on_engine(batch, split, partial(self.runner.run_head, split, x))
            self.policy.observe_head(split, len(batch), head_ms, sending=self._remote > 0)
        started = time.monotonic() - head_ms / 1e3  # the head's start: the frames' queueing ends there
        tensor, fields = self.runner.payload(split, cut)
        assert self._slots is not None
        waiting = time.monotonic()
        await self._slots.acquire()  # released by _send when the reply (or the failure) comes
        waits = {"started": started, "slot_ms": (time.monotonic() - waiting) * 1e3}
        self._remote += 1
        return asyncio.ensure_future(self._offload(batch, x, choice.split, tensor, fields, head_ms, rate, reason, client,
                                                   waits, deadline))

    def _deadline(self, batch: list[_Captured]) -> float | None:
        """The batch's deadline (ms): the tightest of its frames' own, else the run's."""
        own = [c.frame.deadline_ms for c in batch if c.frame.deadline_ms is not None]
        return min(own) if own else self._deadline_ms

    async def _offload(
        self, batch: list[_Captured], x: np.ndarray, split: str, tensor: np.ndarray, fields: dict[str, float],
        head_ms: float, rate: float | None, reason: Reason, client: HostClient, waits: dict[str, float],
        deadline: float | None,
    ) -> list[FrameResult]:
        """Send the cut and wait for the tail; on any failure answer the batch here instead."""
        if split in self.config.fragments:
            return await self._gather(batch, x, split, tensor, fields, head_ms, rate, reason, client, waits, deadline)
        try:
            result = await self._send(client, split, tensor, fields, deadline)
        except (HostUnavailableError, RemoteError) as exc:
            if isinstance(exc, HostUnavailableError) and self.hosts is not None:
                await self.hosts.lost(client, exc)
            elif isinstance(exc, RemoteError) and exc.code == ErrorCode.UNAUTHORIZED and split in self.config.routes:
                self._refuse_route(split, client.address, exc)
            return await self._locally(batch, x, split, head_ms, rate, reason, exc, waits, deadline)
        self.meter.observe_reply(tensor.nbytes, result)
        hops = result.hops  # a chain's later hosts: their stages, queues and links are the tail's too
        self.policy.observe_tail(split, len(batch), result.compute_ms + sum(h.compute_ms for h in hops))
        return self._results(batch, result.output, _Answer(
            split, rate, reason, head_ms,
            transfer_ms=result.transfer_ms + sum(h.link_ms for h in hops),
            tail_ms=result.compute_ms + sum(h.compute_ms for h in hops),
            host_queue_ms=result.queue_ms + sum(h.queue_ms for h in hops), sent_bytes=tensor.nbytes,
            host=" > ".join((client.address, *(h.address for h in hops))), **waits,
        ))

    async def _locally(
        self, batch: list[_Captured], x: np.ndarray, split: str, head_ms: float, rate: float | None, chosen: Reason,
        exc: Exception, waits: dict[str, float], deadline: float | None,
    ) -> list[FrameResult]:
        """A remote batch that failed, answered here with the full model: no frame is lost. Its
        reason says so: ``deadline`` where the host refused it for the frame's deadline, else
        ``fallback``, with the reason ``split`` was ``chosen`` for."""
        logits, ms = await self._on_engine(batch, LOCAL, partial(self.runner.run_full, x))
        refused = isinstance(exc, RemoteError) and exc.code == ErrorCode.DEADLINE_EXCEEDED
        reason = Reason(DEADLINE if refused else FALLBACK, batch=len(batch), rate_bps=rate, wanted=split,
                        error=str(exc), deadline_ms=deadline if refused else None, chosen=chosen)
        return self._results(batch, logits, _Answer(LOCAL, rate, reason, head_ms + ms, error=f"{split}: {exc}",
                                                    attempted=split, **waits))

    def _refuse_route(self, chain: str, address: str, exc: Exception) -> None:
        """Leave ``chain`` out while ``address`` is the connected host (:meth:`available`), saying so once."""
        if (chain, address) not in self._refused_routes:
            self._refused_routes.add((chain, address))
            log.warning("chain %s left out of this run while host %s is the one connected: %s", chain, address, exc)

    def _placement(self, split: str) -> dict[int, str]:
        """Fragment index -> its host's address: where they were moved to, else where the config
        says (all on the connected host where it says ())."""
        if split in self._placed:
            return self._placed[split]
        fragments = self.runner.bundle.manifest.split(split).fragments
        assert self.hosts is not None and self.hosts.client is not None
        addresses = self.config.fragments[split] or (self.hosts.client.address,) * len(fragments)
        return {f.index: address for f, address in zip(fragments, addresses)}

    def _move(self, split: str, gone: Collection[str]) -> None:
        """Fragments whose host went away, placed again over the hosts still in view that serve them
        (:func:`calibration.place_fragments`: least loaded, spread, the others kept where they were).
        Where none serves one, it stays put and its classes are scored absent until its host is back."""
        placement = self._placement(split)
        assert self.hosts is not None and self.hosts.client is not None
        bundle_id = self.runner.bundle.id
        views = []
        for address in dict.fromkeys((self.hosts.client.address, *placement.values())):
            client = self.hosts.client if address == self.hosts.client.address else self._pool.connected(address)
            if address in gone or client is None or client.hello is None:
                continue
            served = client.hello.bundles.get(bundle_id, ())
            views.append(HostView(address, {name: {1: 0.0} for name in served}, rate_bps=1.0))
        names = {stage_id(split, k): k for k in placement}
        previous = {name: placement[k] for name, k in names.items()}
        moved = place_fragments(split, list(names), 0, {1: 0.0}, views, batch=1, previous=previous)
        if moved is not None and moved.moved:
            self._placed[split] = {names[name]: host for name, host in zip(names, moved.hosts)}
            log.info("fragments %s of %s moved off %s", ", ".join(moved.moved), split, ", ".join(gone))

    async def _gather(
        self, batch: list[_Captured], x: np.ndarray, split: str, tensor: np.ndarray, fields: dict[str, float],
        head_ms: float, rate: float | None, reason: Reason, client: HostClient, waits: dict[str, float],
        deadline: float | None,
    ) -> list[FrameResult]:
        """A semantic split: the cut to every fragment's host at once, merged from those that answer
        by the frame's deadline (the request timeout without one); none answering runs it here."""
        ticket = self.meter.sending(tensor.nbytes)
        wait_s = self.config.request_timeout_s if deadline is None else deadline / 1000.0
        manifest = self.runner.bundle.manifest
        try:
            gathered = await gather(
                self._pool, self._placement(split), self.runner.bundle.id, manifest.split(split),
                len(manifest.model.labels), tensor, wait_s, self.config.request_timeout_s, deadline,
                clients={client.address: client}, **fields,
            )
        except HostUnavailableError as exc:
            self._move(split, set(self._placement(split).values()) - {client.address})
            return await self._locally(batch, x, split, head_ms, rate, reason, exc, waits, deadline)
        finally:
            self.meter.settled(ticket)
            self._remote -= 1
            assert self._slots is not None
            self._slots.release()
        if gathered.gone:
            self._move(split, gathered.gone)
        slowest = max(gathered.timings, key=lambda t: t.round_trip_ms)
        return self._results(batch, gathered.logits, _Answer(
            split, rate, reason, head_ms, transfer_ms=gathered.transfer_ms,
            tail_ms=slowest.compute_ms, host_queue_ms=slowest.queue_ms, sent_bytes=tensor.nbytes,
            host=" | ".join(dict.fromkeys(t.address for t in gathered.timings)), missing=gathered.missing, **waits,
        ))

    async def _send(
        self, client: HostClient, split: str, tensor: np.ndarray, fields: dict[str, float], deadline: float | None,
    ) -> InferResult:
        """One remote request, holding one of the ``in_flight`` slots and known to the meter until it
        settles. One that fails or is refused tells the meter how (:meth:`LinkMeter.failed`): an
        overdue upload that never got its reply bounds the link, or the field trial's board sent
        150 KB frames into a link collapsed to 0.5 Mbit/s on an estimate still at 49."""
        ticket = self.meter.sending(tensor.nbytes)
        route = self._route(split, client.address)
        # What the board would do instead, and its time: the host holds the request to the later of the
        # two (InferRequest.give_up_ms), and so may have held a refused one that long.
        alternative = None if deadline is None else self.policy.alternative(int(tensor.shape[0]))
        try:
            return await client.infer(
                self.runner.bundle.id, split, tensor, self.config.request_timeout_s, deadline,
                stage=None if route is None else 1, route=route or (), alternative=alternative, **fields,
            )
        except (HostUnavailableError, RemoteError) as exc:
            held_ms = deadline if deadline is None or alternative is None else max(deadline, alternative[1])
            self.meter.failed(ticket, exc, held_ms)
            raise
        finally:
            self.meter.settled(ticket)
            self._remote -= 1
            assert self._slots is not None
            self._slots.release()

    def _route(self, split: str, first: str) -> tuple[Hop, ...] | None:
        """A chain's hops after its first host ``first`` (None: ``split`` is no chain)."""
        addresses = self.config.routes.get(split)
        if addresses is None:
            return None
        stages = self.runner.bundle.manifest.split(split).stages[1:]
        return tuple(Hop(address, split, stage.index) for address, stage in zip(addresses or (first,) * len(stages), stages))

    def _results(self, batch: list[_Captured], logits: np.ndarray, answer: _Answer) -> list[FrameResult]:
        """One result per frame; each frame waited in the queue from its preprocessing's end until
        the batch's head started (``answer.started``)."""
        now = time.monotonic()
        results = []
        for captured, row in zip(batch, logits):
            label, probability = top1(row, self.runner.labels)
            results.append(FrameResult(
                index=captured.frame.index, name=captured.frame.name, label=label, probability=probability,
                split=answer.split, preprocess_ms=captured.preprocess_ms, head_ms=answer.head_ms,
                transfer_ms=answer.transfer_ms, tail_ms=answer.tail_ms,
                total_ms=(now - captured.frame.captured) * 1000.0, captured=captured.frame.captured,
                queue_ms=0.0 if answer.started is None else max(
                    (answer.started - captured.frame.captured) * 1000.0 - captured.preprocess_ms, 0.0),
                slot_ms=answer.slot_ms, host_queue_ms=answer.host_queue_ms,
                batch=len(batch), bytes=answer.sent_bytes // len(batch), rate_bps=answer.rate,
                where="local" if answer.host is None else "remote", host=answer.host, error=answer.error,
                missing=answer.missing, attempted=answer.attempted, reason=answer.reason,
                deadline_ms=captured.frame.deadline_ms if captured.frame.deadline_ms is not None else self._deadline_ms,
            ))
        return results

    async def _probe_when_idle(self) -> None:
        """While nothing is offloaded the estimate ages: refresh it so the policy can come back."""
        while True:
            await asyncio.sleep(self.config.probe_every_s)
            client = self.hosts.client if self.hosts is not None else None
            if client is not None and self._remote == 0 and self.meter.stale(self.config.probe_every_s):
                await self.probe(client)

    async def probe(self, client: HostClient) -> None:
        """A small ping (round trip) and a payload ping (rate), sized for the current estimate.

        A payload crossing much faster than the estimate said is too short to measure the link
        (fixed costs dominate it), so one longer payload follows when the first one's own rate
        asks for a probe twice its size: on a 1 Gbit/s link the first, 64 KB, probe read
        ~300 Mbit/s from the board. Its own rate, not the estimate after it: a short sample
        barely moves the estimate (or none, crossing within a bare ping's time), and after a
        link that was 0.5 Mbit/s came back, 16 KB probes alone held the estimate there for
        seconds on end.
        """
        try:
            self.meter.observe_probe(0, await client.ping(0, timeout=self.config.request_timeout_s))
            size = probe_bytes(self.meter.rate_bps)
            measured = await self._payload_probe(client, size)
            longer = probe_bytes(measured)
            if longer >= 2 * size:
                await self._payload_probe(client, longer)
        except HostUnavailableError as exc:
            if self.hosts is not None:
                await self.hosts.lost(client, exc)
        except RemoteError:
            return

    async def _payload_probe(self, client: HostClient, size: int) -> float | None:
        """One payload probe into the estimate; returns its own rate (:meth:`LinkMeter.observe_probe`).

        While it crosses it holds the link as an upload does: a frame sent meanwhile waits
        behind it in the socket, so an overdue probe caps the estimate too. Unseen by the meter,
        a 1 MB probe sized for loopback that went up as the link dropped to 0.5 Mbit/s (17 s to
        cross) let the next frames go remote on the stale estimate, to wait behind it until their
        10 s timeout (issue 28). One that times out bounds the link as a failed upload does
        (:meth:`LinkMeter.failed`).
        """
        ticket = self.meter.sending(size)
        try:
            probe = await client.probe(size, timeout=self.config.request_timeout_s)
        except (HostUnavailableError, RemoteError) as exc:
            self.meter.failed(ticket, exc)
            raise
        finally:
            self.meter.settled(ticket)
        return self.meter.observe_probe(size, probe.round_trip_ms, probe.upload)


def _dropped(frame: Frame) -> FrameResult:
    return FrameResult(
        index=frame.index, name=frame.name, label=None, probability=None, split="", captured=frame.captured,
        total_ms=(time.monotonic() - frame.captured) * 1000.0, dropped=True, drop_reason=DROP_QUEUE_FULL,
    )

