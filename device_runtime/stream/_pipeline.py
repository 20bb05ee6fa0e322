"""The board's stream: capture, head, transfer and the host's tail overlap; no frame is lost.

Stages, each its own worker so that they overlap::

    camera ─▶ [FrameQueue] ─▶ batch ─▶ preprocess ─▶ choose ─▶ head ─▶ hand off ─▶ answer, in order
    (capture    drops by policy          (the board's engine thread)     (up to ``in_flight`` remote)
     thread)

While batch *n* travels and runs on the host, batch *n+1* is already in the head, and the
camera keeps filling the queue; throughput is that of the slowest stage, not of their sum.
Frames are preprocessed after the queue has decided which of them to keep: a camera faster
than the head has most of its frames dropped, and those never cost a resize.
A full queue drops frames by policy (newest wins for a live camera) and every drop is
reported as a result of its own. A remote batch that fails (host gone, timeout, refusal)
is run again here with the full model, so every captured frame gets an answer; the host is
looked for again in the background and the stream goes back to offloading when it answers.
Only remote batches count against ``in_flight``: the board keeps running local batches
while the link is slow, and a live source's results come out as soon as each is known
(a recorded source's in capture order).

This module is the loop. A finished head leaves it as one :class:`~device_runtime.stream._handoff.HeadDone`
for whoever answers it: the connected host, a chain's with its route
(:class:`~device_runtime.stream._remote.HostAnswers`), or a semantic split's fragments' hosts
(:class:`~device_runtime.stream._fragments.FragmentAnswers`); the board answers what they could not
(:class:`~device_runtime.stream._board_engine.BoardEngine`), and the link is probed while idle
(:class:`~device_runtime.stream._probing.LinkProber`).

Which split each batch takes is the policy's (:mod:`device_runtime.stream._policy`): fixed, or the
calibration table's choice for the current rate estimate (:mod:`device_runtime.hosts._link_meter`),
which comes from the stream's own transfers and, while nothing is offloaded, from probes. The
policy says why (:class:`~device_runtime.stream._reason.Reason`), and each frame's result carries
it; a batch the board answers instead says so (``fallback``, ``deadline``, ``no_host``).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import AsyncIterator

import numpy as np

from device_runtime.bundle import LOCAL, OFFLOAD, stage_id
from device_runtime.engine import DeviceRunner
from device_runtime.hosts import HostLink, LinkMeter
from device_runtime.stream._board_engine import BoardEngine
from device_runtime.stream._camera import Frame, FrameSource
from device_runtime.stream._config import PipelineConfig
from device_runtime.stream._fragments import FragmentAnswers
from device_runtime.stream._frame_queue import FrameQueue
from device_runtime.stream._handoff import Answer, Captured, HeadDone, InFlight
from device_runtime.stream._policy import SplitPolicy
from device_runtime.stream._probing import LinkProber
from device_runtime.stream._reason import NO_HOST, Reason
from device_runtime.stream._remote import HostAnswers
from device_runtime.stream._results import DROP_QUEUE_FULL, FrameResult
from device_runtime.link import HostClient

__all__ = ["Pipeline", "PipelineConfig", "PipelineStats"]

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
        self._engine = BoardEngine(runner, config.pace)  # the board's one inference engine
        self._camera = ThreadPoolExecutor(1, thread_name_prefix="capture")
        self._in_flight = InFlight(config.in_flight)  # remote batches outstanding
        self._deadline_ms: float | None = None  # each frame's, for the source being run, unless the frame has its own
        self._failure: Exception | None = None  # the first stage's failure, raised after the results before it
        self._host = HostAnswers(self._engine, policy, hosts, self.meter, config, self._in_flight)
        self._fragments = FragmentAnswers(self._engine, hosts, self.meter, config, self._in_flight)
        self._prober = LinkProber(hosts, self.meter, config, self._in_flight)

    def available(self) -> frozenset[str]:
        """Splits that can run now: ``local`` always, the host's while one is connected (a split's
        coded options among them, ``SPLIT@k4``, where the host decodes them), a chain with a route
        whose first stage the connected host serves, and a semantic split with its fragments' hosts
        (those on the connected host served by it)."""
        if self.hosts is None or self.hosts.client is None:
            return frozenset((LOCAL,))
        served = self.hosts.served()
        address = self.hosts.client.address
        chains = {chain for chain in self.config.routes
                  if stage_id(chain, 1) in served and not self._host.refused(chain, address)}
        semantic = {split for split in self.config.fragments if self._fragments.servable(split, served, address)}
        return served | chains | semantic | {LOCAL}

    async def probe(self, client: HostClient) -> None:
        """Measure the link to ``client`` into the meter (:meth:`LinkProber.probe`)."""
        await self._prober.probe(client)

    async def run(
        self, source: FrameSource, frames: int | None = None, stop: asyncio.Event | None = None
    ) -> AsyncIterator[FrameResult]:
        """One result per captured frame (dropped ones included), in order within each kind,
        until the source ends, ``frames`` were captured, or ``stop`` is set."""
        out: asyncio.Queue[object] = asyncio.Queue()
        queue: FrameQueue[Frame] = FrameQueue(*self.config.frame_queue(source.live))
        jobs: asyncio.Queue[asyncio.Future[list[FrameResult]] | None] = asyncio.Queue()
        self._in_flight.open()
        self._deadline_ms = self.config.deadline_for(source)
        if self.hosts is not None and self.hosts.client is not None:
            await self.probe(self.hosts.client)  # a first rate estimate before the first choice
        workers = [
            asyncio.ensure_future(self._capture(source, queue, frames, stop, out)),
            asyncio.ensure_future(self._process(queue, jobs)),
            asyncio.ensure_future(self._emit(jobs, out, ordered=not source.live)),
        ]
        prober = asyncio.ensure_future(self._prober.when_idle())
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
            await self._fragments.close()
            self._engine.shutdown()
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

    async def _process(self, queue: FrameQueue[Frame], jobs: asyncio.Queue) -> None:
        """Batch, preprocess, choose the split, run the head; remote batches go on while the next head runs.

        Frames are preprocessed here, in the head's thread, once the queue has kept them: a dropped
        frame is never resized. Preprocessing no longer overlaps with the previous head; for a
        live camera that is the price of the freshest frame (one taken from the queue early is older)."""
        try:
            while True:
                frames = await queue.get_batch(self.config.batch)
                if not frames:
                    return
                batch = await self._engine.call(self._engine.preprocess, frames, self._deadline_ms)
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

    async def _start(self, batch: list[Captured]) -> asyncio.Future[list[FrameResult]]:
        """Choose the batch's split and run its head; a local batch is answered here, a remote one
        handed off (:class:`HeadDone`) to whoever answers its split, once an ``in_flight`` slot is free."""
        x = np.concatenate([c.x for c in batch])
        client = self.hosts.client if self.hosts is not None else None
        self.meter.crossing = client.crossing if client is not None else None
        rate = self.meter.rate_bps  # capped by an overdue upload, or one crossing slowly, if one is
        deadline = self._deadline(batch)
        for captured in batch:  # board compute whatever the split: the board's speed now
            self.policy.observe_preprocess(captured.preprocess_ms, sending=self._in_flight.count > 0)
        self.policy.observe_batch(batch[-1].frame.index)
        choice = self.policy.choose(len(batch), rate, self.available(), link_busy=self.meter.overdue() is not None,
                                    deadline_ms=deadline, uncapped_bps=self.meter.estimator.rate_bps)
        split, reason = choice.split, choice.reason
        if split == LOCAL or client is None:
            if split != LOCAL:  # the host went in the meantime
                reason = Reason(NO_HOST, batch=len(batch), wanted=split)
            logits, ms = await self._engine.full(batch, x)
            self.policy.observe_head(LOCAL, len(batch), ms, sending=self._in_flight.count > 0)
            done: asyncio.Future[list[FrameResult]] = asyncio.get_running_loop().create_future()
            done.set_result(Answer(LOCAL, rate, reason, ms, started=time.monotonic() - ms / 1e3).results(
                batch, logits, self.runner.labels))
            return done
        if split == OFFLOAD:
            (tensor, fields), head_ms = self.runner.payload(split, x), 0.0
        else:  # the head, and the cut made what crosses the link (a coded option's encoding: its time too)
            (tensor, fields), head_ms = await self._engine.on(batch, split, partial(self.runner.board_part, split, x))
            self.policy.observe_head(split, len(batch), head_ms, sending=self._in_flight.count > 0)
        started = time.monotonic() - head_ms / 1e3  # the head's start: the frames' queueing ends there
        slot_ms = await self._in_flight.take()  # given back by whoever answers, when its request settles
        head = HeadDone(batch, x, split, tensor, fields, head_ms, rate, reason, started, slot_ms, deadline)
        answers = self._fragments if split in self.config.fragments else self._host
        return asyncio.ensure_future(answers.answer(head, client))

    def _deadline(self, batch: list[Captured]) -> float | None:
        """The batch's deadline (ms): the tightest of its frames' own, else the run's."""
        own = [c.frame.deadline_ms for c in batch if c.frame.deadline_ms is not None]
        return min(own) if own else self._deadline_ms


def _dropped(frame: Frame) -> FrameResult:
    return FrameResult(
        index=frame.index, name=frame.name, label=None, probability=None, split="", captured=frame.captured,
        total_ms=(time.monotonic() - frame.captured) * 1000.0, dropped=True, drop_reason=DROP_QUEUE_FULL,
    )

