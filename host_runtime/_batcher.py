"""Dynamic batching per tail, a bounded host-wide queue, and deadlines.

A tail's time per sample falls as its batch grows (onnxruntime keeps more of the machine
busy with one larger call), so requests for the same tail — same bundle, same split — that
arrive close together run as one batch: concatenated along the batch axis, run once, and
each request gets its own slice of the output back. The oldest waiting request waits at
most ``max_wait_ms`` for company; a batch of ``max_batch`` samples goes at once; while every
worker is busy, requests gather anyway and the next free worker takes up to ``max_batch``
of them, from the tail whose oldest request has waited longest (first come, first run, across
tails as within one). With ``share`` (the CPU's) and no wait for company, a worker takes at
most its share of that tail's queue, ``ceil(queued / workers)``: the next worker to come free
finds work waiting rather than idling while the boards the last batch answered send again, and
two free workers split a queue rather than one running it all beside an idle core.
``max_batch = 1`` turns batching off. With ``buckets`` (a GPU's), a batch is padded
with zeros up to the next bucket size (:func:`~host_runtime._tails.run_batch`) and each request
still gets only its own rows back.

Admission is decided at once, on the event loop, so a refusal costs the device one round
trip rather than a timeout:

- more than ``max_queue`` samples would be waiting across the host → ``overloaded``. The
  queue is bounded so latency cannot grow without bound; the host recovers by itself as
  soon as the queue drains.
- the deadline cannot be met given the samples already queued for the tail, at the tail's
  measured time per sample (an EWMA of ``compute / batch`` over its past runs) →
  ``deadline_exceeded``. Before a tail's first run there is no estimate and the request
  is admitted.

A request whose deadline passes while still queued is answered ``deadline_exceeded`` at
that moment (one timer per tail, for the soonest deadline queued) and never runs. One whose deadline passes while its batch runs is answered
normally: the work is done, and the device can still use the answer or drop it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Executor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Union

import numpy as np

from device_runtime.engine import Backend
from device_runtime.wire import ErrorCode, dequantize
from device_runtime.wire.coding import CodedCut, CutCoding
from device_runtime.wire.ops import Quantization
from host_runtime._tails import bucket_for, can_pad, run_batch
from splitedge.errors import ProtocolError

log = logging.getLogger("splitedge.host")

TailKey = tuple[str, str]  # (bundle id, split id)

#: Weight of the newest run in a tail's time-per-sample estimate.
EWMA_ALPHA = 0.2

#: How early a deadline timer may fire and still refuse what it was armed for: the event loop's
#: timers have a millisecond's grain (uvloop's libuv rounds to whole ms).
TIMER_SLACK_S = 1e-3


@dataclass(frozen=True)
class BatchConfig:
    max_batch: int = 8  # samples per tail run; 1 turns batching off
    # How long the oldest request waits for company. 0: requests that arrive while a batch runs
    # form the next one anyway, and a lone board is not delayed (2 ms halved its throughput,
    # docs/benchmarks.md "Host under load").
    max_wait_ms: float = 0.0
    max_queue: int = 256  # samples waiting across the host before requests are refused
    # Batch sizes a batch is padded up to (host_runtime._tails.bucket_sizes); () runs every batch at its own size.
    buckets: tuple[int, ...] = ()
    # A batch takes at most its worker's share of its tail's queue, ceil(queued / workers). For
    # the CPU, where a sample costs about as much at batch 8 as at 16: a host of 2 workers on 2
    # cores served 2-7 % more at 32 closed-loop boards, its p99 a quarter lower
    # (docs/benchmarks.md, issue 32). Not for CUDA, where a launch costs about as much whatever
    # its batch. None: the host decides by its tails' device (HostServer). Only with max_wait_ms
    # 0: a host told to wait for company wants its batches whole.
    share: bool | None = None

    def __post_init__(self) -> None:
        assert self.max_batch >= 1, f"max_batch must be at least 1, got {self.max_batch}"
        assert list(self.buckets) == sorted(set(self.buckets)) and all(b >= 1 for b in self.buckets), (
            f"buckets must be distinct positive sizes in ascending order, got {self.buckets}")
        assert self.max_wait_ms >= 0, f"max_wait_ms must not be negative, got {self.max_wait_ms}"
        assert self.max_queue >= 1, f"max_queue must be at least 1, got {self.max_queue}"

    @property
    def shares(self) -> bool:
        """Whether a worker takes only its share of the queue: told or decided so, and not waiting for company."""
        return bool(self.share) and not self.max_wait_ms


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs a microsecond per request
class BatchResult:
    """One request's share of a batch run: what its reply carries."""

    output: np.ndarray  # this request's slice of the batch output, (B, ...)
    queue_ms: float  # request fully received → its batch started
    compute_ms: float  # the whole batch's tail time
    batch: int  # samples in the batch that ran


#: How a request ends, told to the callback it was submitted with: its share of the batch, the
#: :class:`ProtocolError` it failed with, or None where the host stopped before it ran.
Outcome = Union["BatchResult", ProtocolError, None]


@dataclass(frozen=True, slots=True)
class Arrival:
    """A request's input as it came off the wire, and how a worker makes it the float32 the tail
    takes: uint8 dequantized, a coded cut's bits unpacked and dequantized (issue 47), float32 as it
    came. Made on the worker, never on the event loop: a 9.6 MB uint8 frame dequantized there held
    every other connection's ping for 78-160 ms (issue 45)."""

    tensor: np.ndarray  # as it came: float32, uint8, or a coded cut's packed bits (one dimension)
    shape: tuple[int, ...]  # (B, ...) as the tail takes it: the tensor's own, or what its bits unpack to
    real: Callable[[np.ndarray], np.ndarray] | None = None  # on a worker; None: the tensor is what the tail takes

    @classmethod
    def of(cls, tensor: np.ndarray, quantization: Quantization | None = None) -> Arrival:
        """A float32 tensor, or an affine uint8 one with its ``quantization``."""
        if quantization is None:
            return cls(tensor, tensor.shape)
        return cls(tensor, tensor.shape, partial(dequantize, scale=quantization.scale, zero_point=quantization.zero_point))

    @classmethod
    def coded(cls, bits: np.ndarray, cut: CodedCut, coding: CutCoding) -> Arrival:
        """A cut's packed bits in ``coding``, the split's coding ``cut`` names; its shape checked
        against the coding here, so that nothing a worker decodes can fail."""
        coding.check(cut.shape)
        return cls(bits, cut.shape, partial(coding.decode, shape=cut.shape))

    def seen(self) -> np.ndarray:
        """What the tail will take, for checking its shape and dtype: the tensor itself, or a
        float32 view of one value at the shape it will have (nothing computed, nothing allocated)."""
        return self.tensor if self.real is None else np.broadcast_to(np.float32(0), self.shape)


@dataclass(eq=False, slots=True)  # identity equality: deque.remove must find this request, not compare arrays
class _Request:
    arrival: Arrival
    received: float  # perf_counter when the frame was fully read
    deadline: float | None  # perf_counter; None for none
    done: Callable[[Outcome], Any]  # called once, on the event loop, with how the request ended

    @property
    def samples(self) -> int:
        return int(self.arrival.shape[0])

    def real(self) -> np.ndarray:
        """The tensor the tail takes, made on a worker."""
        arrival = self.arrival
        return arrival.tensor if arrival.real is None else arrival.real(arrival.tensor)


@dataclass(eq=False)
class _Tail:
    key: TailKey
    backend: Backend
    queue: deque[_Request] = field(default_factory=deque)
    queued: int = 0  # samples in ``queue``
    ms_per_sample: float | None = None
    buckets: tuple[int, ...] = ()  # the batcher's, or none for a tail whose shape cannot be padded
    # One timer per tail, for the soonest deadline queued (not one per request: arming one cost
    # a host 6 µs a request, issue 32); ``expires_at`` is when it fires, None while none is armed.
    expiry: asyncio.TimerHandle | None = None
    expires_at: float | None = None

    def work_ahead_ms(self, samples: int) -> float:
        """Estimated ms until ``samples`` more would be done, behind what is queued."""
        return 0.0 if self.ms_per_sample is None else (self.queued + samples) * self.ms_per_sample


class LoadMeter:
    """Time-weighted mean of a level (samples queued or running) between two reads.

    A mean over the interval rather than the level at the instant of reading: a host that
    is busy 90% of a second must not advertise itself as idle because it happened to be
    between bursts when its record was refreshed.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.level = 0
        self._since = self._window = clock()
        self._area = 0.0

    def set(self, level: int) -> None:
        now = self.clock()
        self._area += self.level * (now - self._since)
        self.level, self._since = level, now

    def read(self) -> float:
        """The mean level since the previous read (the level itself if no time has passed)."""
        self.set(self.level)
        elapsed = self._since - self._window
        mean = self._area / elapsed if elapsed > 0 else float(self.level)
        self._area, self._window = 0.0, self._since
        return mean


class Batcher:
    """Queues and batches infer requests per tail and runs them on ``workers`` threads."""

    def __init__(self, config: BatchConfig, executor: Executor, workers: int, on_batch: Callable[[int], Any],
                 on_padding: Callable[[int], Any] = lambda rows: None) -> None:
        self.config = config
        self.executor = executor
        self.workers = workers
        self.on_batch = on_batch  # called with each batch's sample count (the batch-size histogram)
        self.on_padding = on_padding  # called with the zero rows a batch was padded with, when any
        self.tails: dict[TailKey, _Tail] = {}
        self.queued = 0  # samples waiting, all tails
        self.running = 0  # samples in batches on a worker
        self.pending = 0  # requests admitted and not yet answered
        self.other = 0  # samples of the host's own work running beside the tails (a profile's batch)
        self.free = workers  # workers not running a batch
        # Batches are formed by callbacks, not a task per tail: a batch cost the loop a task's turn,
        # an event's and a semaphore's futures and run_in_executor's two chained futures (issue 32).
        # And a worker that ends a batch takes the next itself, if one may go: through the loop, it
        # waited 0.5-1 ms a batch (the loop's turn, the replies, the executor's wake-up) with
        # requests queued, on a host of 2 cores at 32 boards. The queues, and the counts of what
        # they hold, are shared with the workers under this lock.
        self._lock = threading.Lock()
        self._forming = False  # a call of _form is scheduled for the loop's next turn
        self._company: asyncio.TimerHandle | None = None  # when a waiting batch's max_wait_ms is up
        self._closed = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._load = LoadMeter()

    def submit(self, key: TailKey, backend: Backend, arrival: Arrival, received: float, deadline: float | None,
               done: Callable[[Outcome], Any]) -> None:
        """Admit a request or refuse it at once (:class:`ProtocolError` with the reply's code).

        ``deadline`` is perf_counter time, None for none; one already past is refused
        (``deadline_exceeded``), as is one the work queued ahead of it would miss.

        ``arrival`` is (B, ...) and already fits ``backend`` (once made float32 on the worker that
        runs it, where it must be); ``done`` is called once, on the event
        loop, with the request's :class:`BatchResult`, a ``deadline_exceeded`` or ``internal``
        :class:`ProtocolError`, or None if the host stops first. A callback, not a future per
        request: a batch's requests are answered in one pass over them, not one loop turn each.
        """
        samples = int(arrival.shape[0])
        if samples < 1:
            raise ProtocolError("infer needs at least one sample in the batch axis", code=ErrorCode.BAD_REQUEST)
        self._check_room(samples)
        tail = self._tail(key, backend)
        now = time.perf_counter()
        ahead_ms = tail.work_ahead_ms(samples)
        if deadline is not None and now + ahead_ms / 1000.0 > deadline:
            raise ProtocolError(
                f"deadline cannot be met: {max(deadline - now, 0.0) * 1000:.1f} ms left, about {ahead_ms:.1f} ms of "
                f"work on tail {'/'.join(key)} ahead of it and in it",
                code=ErrorCode.DEADLINE_EXCEEDED,
            )
        with self._lock:
            tail.queue.append(_Request(arrival, received, deadline, done))
            self._move(tail, samples, 0)
        self._settle(1)
        # the requests of one board come with deadlines later than those queued: rarely a new timer
        if deadline is not None and (tail.expires_at is None or deadline < tail.expires_at):
            self._arm(tail, deadline, now)
        self._form_soon()

    def _check_room(self, samples: int) -> None:
        """Refuse (``overloaded``) work of ``samples`` that the queue could not take now, or ever."""
        if samples > self.config.max_queue:  # no retry can help: say so rather than "later"
            raise ProtocolError(
                f"a request of {samples} samples can never fit this host's queue of {self.config.max_queue}; "
                "send fewer samples per request",
                code=ErrorCode.OVERLOADED,
            )
        if self.queued + samples > self.config.max_queue:
            raise ProtocolError(
                f"host queue is full: {self.queued} samples waiting, {samples} more would pass the limit of "
                f"{self.config.max_queue}; retry later or use another host",
                code=ErrorCode.OVERLOADED,
            )

    @contextmanager
    def other_work(self, samples: int) -> Iterator[None]:
        """Work of the host's own beside the tails (a ``profile``): admitted as an infer of ``samples``
        would be (refused ``overloaded`` when the queue is full) and counted in the load it announces
        while it runs, so that boards choose another host meanwhile."""
        self._check_room(samples)
        with self._lock:
            self.other += samples
            self._count_load()
        try:
            yield
        finally:
            with self._lock:
                self.other -= samples
                self._count_load()

    def _count_load(self) -> None:
        self._load.set(self.queued + self.running + self.other)

    def load(self) -> float:
        """Mean samples queued or running per worker since the previous call (what zeroconf announces)."""
        with self._lock:
            return self._load.read() / self.workers

    async def close(self, timeout: float) -> None:
        """Let admitted requests finish (at most ``timeout`` s), then stop; what is left is cancelled."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            log.warning("%d requests still pending after %g s; cancelling them", self.pending, timeout)
        with self._lock:
            self._closed = True
            left = [request for tail in self.tails.values() for request in tail.queue]
        if self._company is not None:
            self._company.cancel()
        for tail in self.tails.values():
            if tail.expiry is not None:
                tail.expiry.cancel()
        for request in left:
            _tell(request, None)

    def _tail(self, key: TailKey, backend: Backend) -> _Tail:
        tail = self.tails.get(key)
        if tail is None:
            tail = _Tail(key, backend, buckets=self.config.buckets if self.config.buckets and can_pad(backend) else ())
            with self._lock:  # a worker may be looking over the tails for its next batch
                self.tails[key] = tail
        return tail

    def _settle(self, pending: int) -> None:
        """Count requests admitted (+) or answered (-), on the loop: what :meth:`close` waits for."""
        self.pending += pending
        if self.pending:
            self._idle.clear()
        else:
            self._idle.set()

    def _move(self, tail: _Tail, queued: int, running: int) -> None:
        """Move the counts of samples queued and running that the queue bound, the gauges and the
        load read (the caller holds the lock: on the loop or a worker)."""
        tail.queued += queued
        self.queued += queued
        self.running += running
        self._count_load()

    def _form_soon(self) -> None:
        """Form batches on the loop's next turn (once): requests read in this one join them."""
        if self.free and not self._forming:
            self._forming = True
            asyncio.get_running_loop().call_soon(self._form)

    def _form(self) -> None:
        """Give each free worker a batch (:meth:`_pick`); called on the turn after a request comes
        and whenever a worker stops for want of one. While every worker is busy, requests gather."""
        self._forming = False
        if self._company is not None:
            self._company.cancel()
            self._company = None
        until = math.inf
        while self.free:
            with self._lock:
                tail, batch, late, until = self._pick(time.perf_counter())
            for request in late:
                self._refuse_late(tail, request)  # type: ignore[arg-type]  # late requests come with their tail
            if batch:
                self._launch(tail, batch)  # type: ignore[arg-type]  # a batch comes with its tail
            elif tail is None:
                break
        if self.free and until != math.inf:
            self._company = asyncio.get_running_loop().call_later(max(until - time.perf_counter(), 0.0), self._form)

    def _pick(self, now: float) -> tuple[_Tail | None, list[_Request], list[_Request], float]:
        """Take the next batch out of the queues (under the lock): of the tails whose batch may go
        (``max_batch`` samples waiting, or the oldest request has waited ``max_wait_ms`` for
        company), the one whose oldest request has waited longest; whole requests, oldest first, up
        to ``max_batch`` samples, or to this worker's share of the queue (``share``), at least
        one request however large, all of one sample shape.
        Returns the tail, the batch, the requests found past their deadline (taken out, to be
        refused on the loop), and the soonest a batch not yet ready may go (inf: none waits)."""
        wait_s = self.config.max_wait_ms / 1000.0
        until, chosen = math.inf, None
        if self._closed:
            return None, [], [], until
        for tail in self.tails.values():
            if not tail.queue:
                continue
            oldest = tail.queue[0].received
            if tail.queued < self.config.max_batch and oldest + wait_s > now:
                until = min(until, oldest + wait_s)
            elif chosen is None or oldest < chosen.queue[0].received:
                chosen = tail
        if chosen is None:
            return None, [], [], until
        batch: list[_Request] = []
        late: list[_Request] = []
        samples = taken = 0
        limit = self.config.max_batch
        if self.config.shares:
            limit = min(limit, -(-chosen.queued // self.workers))
        queue = chosen.queue
        while queue:
            request = queue[0]
            if batch and (
                samples + request.samples > limit or request.arrival.shape[1:] != batch[0].arrival.shape[1:]
            ):
                break
            queue.popleft()
            taken += request.samples
            if request.deadline is not None and request.deadline <= now:  # due, the tail's timer not run yet
                late.append(request)
                continue
            batch.append(request)
            samples += request.samples
        self._move(chosen, -taken, samples)
        return chosen, batch, late, until

    def _arm(self, tail: _Tail, deadline: float, now: float) -> None:
        """Have the tail's timer fire at ``deadline`` (perf_counter time), replacing a later one."""
        if tail.expiry is not None:
            tail.expiry.cancel()
        tail.expires_at = deadline
        tail.expiry = asyncio.get_running_loop().call_later(max(deadline - now, 0.0), self._expire, tail)

    def _expire(self, tail: _Tail) -> None:
        """Refuse every queued request of ``tail`` whose deadline has come (the loop's timers may
        fire up to a millisecond early: ``TIMER_SLACK_S``), then arm the timer for the soonest left.
        A pass over the queue (at most ``max_queue`` requests) each time a deadline comes, instead
        of a timer per request; requests taken into batches meanwhile are simply no longer there."""
        tail.expiry, tail.expires_at = None, None
        now = time.perf_counter()
        due = now + TIMER_SLACK_S
        with self._lock:
            late = [request for request in tail.queue if request.deadline is not None and request.deadline <= due]
            if late:
                tail.queue = deque(request for request in tail.queue if request.deadline is None or request.deadline > due)
                self._move(tail, -sum(request.samples for request in late), 0)
            soonest = min((request.deadline for request in tail.queue if request.deadline is not None), default=None)
        for request in late:
            self._refuse_late(tail, request)
        if soonest is not None:
            self._arm(tail, soonest, now)

    def _refuse_late(self, tail: _Tail, request: _Request) -> None:
        """Answer a request whose deadline passed in the queue (and was taken out of it), without running it."""
        waited_ms = (time.perf_counter() - request.received) * 1000.0
        self._settle(-1)
        _tell(request, ProtocolError(f"deadline passed after {waited_ms:.1f} ms in the queue of tail {'/'.join(tail.key)}",
                                     code=ErrorCode.DEADLINE_EXCEEDED))

    def _launch(self, tail: _Tail, batch: list[_Request]) -> None:
        self.free -= 1
        self.executor.submit(self._run, asyncio.get_running_loop(), tail, batch)

    def _run(self, loop: asyncio.AbstractEventLoop, tail: _Tail, batch: list[_Request]) -> None:
        """On a worker: run the batch, hand what came of it back to the loop, and go on with the
        next batch that may go, if any (the loop forms one when a request comes while none does)."""
        while True:
            try:
                bucket = bucket_for(sum(r.samples for r in batch), tail.buckets)
                outcome: tuple[np.ndarray, float, float] | BaseException = run_batch(
                    tail.backend, [r.real() for r in batch], bucket)
            except BaseException as exc:  # told to the batch's requests, on the loop
                outcome = exc
            with self._lock:
                following, nxt, late, _ = self._pick(time.perf_counter())
            try:
                loop.call_soon_threadsafe(self._finished, tail, batch, outcome, following, nxt, late)
            except RuntimeError:  # the loop has closed: the host stopped without waiting for this batch
                return
            if not nxt:
                return
            tail, batch = following, nxt  # type: ignore[assignment]  # a batch comes with its tail

    def _finished(self, tail: _Tail, batch: list[_Request], outcome: tuple[np.ndarray, float, float] | BaseException,
                  following: _Tail | None, nxt: list[_Request], late: list[_Request]) -> None:
        """Answer each request its slice of the batch output (or the batch's failure), and those
        the worker found past their deadline; a worker that took no next batch is free again."""
        samples = sum(r.samples for r in batch)
        with self._lock:
            self._move(tail, 0, -samples)
        self._settle(-len(batch))
        for request in late:
            self._refuse_late(following, request)  # type: ignore[arg-type]  # late requests come with their tail
        if not nxt:
            self.free += 1
        try:
            self._answer(tail, batch, samples, outcome)
        finally:
            if not nxt:
                self._form_soon()

    def _answer(self, tail: _Tail, batch: list[_Request], samples: int,
                outcome: tuple[np.ndarray, float, float] | BaseException) -> None:
        if isinstance(outcome, BaseException):
            error = outcome
            log.error("tail %s failed on a batch of %d samples", "/".join(tail.key), samples, exc_info=error)
            for request in batch:
                _tell(request, ProtocolError(f"tail {'/'.join(tail.key)} failed: {error}", code=ErrorCode.INTERNAL))
            return
        output, started, compute_ms = outcome
        self.on_batch(samples)
        padded = bucket_for(samples, tail.buckets) - samples
        if padded:
            self.on_padding(padded)
        per_sample = compute_ms / samples
        tail.ms_per_sample = per_sample if tail.ms_per_sample is None else (
            (1 - EWMA_ALPHA) * tail.ms_per_sample + EWMA_ALPHA * per_sample
        )
        offset = 0
        for request in batch:
            rows = request.samples
            _tell(request, BatchResult(output[offset : offset + rows], (started - request.received) * 1000.0, compute_ms,
                                       samples))
            offset += rows


def _tell(request: _Request, outcome: Outcome) -> None:
    """Call ``request``'s callback with how it ended; one that raises is logged and does not keep
    the rest of its batch from theirs."""
    try:
        request.done(outcome)
    except Exception:
        log.exception("answering a request failed")
