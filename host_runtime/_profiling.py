"""The ``profile`` request: a board's calibration times the host's tails where they run.

A board cannot measure the host's compute, so it asks the host to (DSC's latency table needs
both sides). Probing the running host found one request could stop every ``infer`` for
minutes: its bounds were per entry, not per request (``splits: [offload]*3, batches:
[64]*3, repeats: 50``), and it ran on the tail workers. So:

- a request's whole work is bounded: every tail, at every batch size, ``repeats`` timed runs
  after :data:`PROFILE_WARMUP` untimed ones is at most :data:`MAX_PROFILE_SAMPLES` samples;
  past it the request is ``bad_request`` naming the limit, before anything runs;
- it runs on a thread of its own, never on the tail workers: infers keep every worker;
- one profile runs at a time on the host; another, or one while the host is stopping or its
  queue is full, is ``overloaded`` (retry later), like any work the host cannot take now;
- the work is cut into single tail runs (at most :data:`MAX_PROFILE_BATCH` samples each)
  that each check a stop flag first, so a stopping host ends a profile within one run;
- and it is bounded in time: a 90-byte request under the sample cap once burned more than 91 s
  of host CPU. Each request may spend ``budget_s`` of the host's CPU time in tail runs
  (``--profile-budget-ms``, 100 ms; measured as the process's CPU time, so a busy host charges it more):
  the host predicts each run from what a sample of that tail cost before (each tail is probed
  with one sample when the host starts, its one-time set-up paid then), trims the repeats to fit, and refuses (``bad_request``, naming the flag) a
  request whose every batch size, run once after one warm-up, would not fit. A run that
  overshoots its prediction stops the profile before the next one. What is spent is the
  process's CPU from the profile's start, not the sum of its runs: with onnxruntime's default
  pool, its threads spinning between runs and the inputs made cost a third again (an 88-byte
  request took 120-180 ms of a 100 ms budget, issue 45). The pool's threads also spin on after
  the last run (45-50 ms of CPU after each run with onnxruntime's default pool on the build
  machine, whatever the run's size): the host's probe measures that trail once per tail
  (:meth:`Costs.trail`), and the runs stop that much before :data:`STOP_SHARE` of the budget.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Iterable
from typing import Any
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from device_runtime.engine import Backend
from device_runtime.wire import ErrorCode
from device_runtime.wire.ops import ProfileRequest
from host_runtime._tails import TailRegistry
from splitedge.errors import ProtocolError

#: Untimed runs before each batch size's timed ones (onnxruntime plans its memory on the first).
PROFILE_WARMUP = 1
#: Samples one request may run in all (tails × Σ batches × (repeats + warm-up)). A board's
#: default calibration (batches 1, 2, 4, 8, 16; 20 repeats) is 713 samples a tail, so 11 tails
#: fit; the full MobileNetV2 on one core of the build machine takes about 17 ms a sample, so
#: the bound is about two minutes of one core at worst, on a thread of its own.
MAX_PROFILE_SAMPLES = 8192
#: Tail-run seconds one ``profile`` request may spend (issue 27: a 1 KB request never buys more than 100 ms).
DEFAULT_PROFILE_BUDGET_S = 0.1
#: What of the budget the repeats are planned to fill: runs vary, and one costlier than predicted
#: must not leave a batch size unmeasured.
PLANNED_SHARE = 0.8
#: What of the budget the runs (and the trail they leave) may reach: the reply is encoded on the rest.
STOP_SHARE = 0.9
#: How long the probe watches the process's CPU after a tail's run, for the pool's spin after it:
#: onnxruntime's spinning threads give up within milliseconds of wall time when quiet.
TRAIL_WINDOW_S = 0.2


class ProfileStopped(ProtocolError):
    """The host is stopping: the profile ends after the tail run in progress."""

    def __init__(self) -> None:
        super().__init__("the host is shutting down: profile stopped; use another host", code=ErrorCode.OVERLOADED)


@dataclass(frozen=True)
class ProfilePlan:
    """A checked ``profile`` request: the tails to time, the batch sizes and the repeats."""

    tails: dict[str, Backend]  # split id → its tail, each split once
    batches: tuple[int, ...]  # each size once
    repeats: int

    @property
    def samples(self) -> int:
        """Samples the request runs in all, warm-up included: what :data:`MAX_PROFILE_SAMPLES` bounds."""
        return len(self.tails) * sum(self.batches) * (self.repeats + PROFILE_WARMUP)


def plan_profile(registry: TailRegistry, request: ProfileRequest) -> ProfilePlan:
    """Check a ``profile`` request against this host (typed :class:`ProtocolError` if it names what is
    not served, or is too big; its fields' types and ranges are checked by its parser).

    Splits and batch sizes named twice are timed once: the reply has one figure for each.
    """
    bundle_id, splits, batches, repeats = request.bundle, request.splits, request.batches, request.repeats
    served = registry.served()
    if bundle_id not in served:
        registry.lookup(bundle_id, None)  # raises unknown_bundle with the list
    tails = {split_id: registry.profiled(bundle_id, split_id) for split_id in (served[bundle_id] if splits is None else splits)}
    for split_id, tail in tails.items():
        if not all(isinstance(d, int) for d in tail.input_shape[1:]):
            raise ProtocolError(f"tail of split {split_id} has a dynamic shape {list(tail.input_shape)}: "
                                "cannot profile it", code=ErrorCode.INTERNAL)
    plan = ProfilePlan(tails, tuple(dict.fromkeys(batches)), repeats)
    if plan.samples > MAX_PROFILE_SAMPLES:
        raise ProtocolError(
            f"profile of {plan.samples} samples ({len(tails)} tails × {sum(plan.batches)} batch samples × "
            f"({repeats} repeats + {PROFILE_WARMUP} warm-up)) exceeds the limit of {MAX_PROFILE_SAMPLES} per request; "
            "ask for fewer splits, batch sizes or repeats, in several requests if need be",
            code=ErrorCode.BAD_REQUEST,
        )
    return plan


class Costs:
    """Seconds one sample of each tail took when last run (what a run is predicted from), and the
    CPU seconds its session's pool spins on after a run (its trail, measured by :func:`probe`)."""

    def __init__(self) -> None:
        self.per_sample: dict[Backend, float] = {}
        self.trails: dict[Backend, float] = {}

    def trail(self, tails: Iterable[Backend]) -> float:
        """The CPU the last run of these tails may leave behind: the longest of their trails."""
        return max((self.trails.get(tail, 0.0) for tail in tails), default=0.0)

    def predict(self, tail: Backend, batch: int) -> float:
        return self.per_sample[tail] * batch

    def ran(self, tail: Backend, batch: int, seconds: float) -> None:
        self.per_sample[tail] = seconds / batch


def _timed(tail: Backend, x: np.ndarray, stop: threading.Event, cpu: Callable[[], float]) -> float:
    if stop.is_set():
        raise ProfileStopped()
    started = cpu()  # the host's CPU, all its threads (onnxruntime's own included); not
    tail.run(x)      # wall time, which other processes on a busy machine stretch
    return cpu() - started


def pool_cpu() -> float:
    """CPU seconds of this process's threads that are not Python's (onnxruntime's pools), from
    /proc (10 ms ticks); the process's CPU where there is no /proc. The Python threads' CPU (the
    event loop, other startup work) is left out: it is no trail of a run."""
    python = {thread.native_id for thread in threading.enumerate()}
    ticks = 0
    try:
        for task in os.scandir("/proc/self/task"):
            if int(task.name) in python:
                continue
            try:
                fields = Path(task.path, "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # the thread ended meanwhile
                continue
            ticks += int(fields[11]) + int(fields[12])
    except OSError:
        return time.process_time()
    return ticks / os.sysconf("SC_CLK_TCK")


def probe(tails: Iterable[Backend], stop: threading.Event, costs: Costs,
          cpu: Callable[[], float] = time.process_time, wait: Callable[[float], Any] = time.sleep,
          trail_cpu: Callable[[], float] = pool_cpu) -> float:
    """One sample through each tail not costed yet, twice: the first run pays the tail's one-time
    set-up (half a second for the full model), the second is what a sample costs; then the CPU
    the pool's threads spend in the :data:`TRAIL_WINDOW_S` after it (:func:`pool_cpu`) is the
    tail's trail. Done when the host starts, so that no request pays for the set-up. Returns the
    seconds spent."""
    spent = 0.0
    for tail in tails:
        if tail in costs.per_sample or not all(isinstance(d, int) for d in tail.input_shape[1:]):
            continue
        x = np.random.default_rng(0).standard_normal((1, *tail.input_shape[1:])).astype(tail.input_dtype)
        for _ in range(2):
            if stop.is_set():  # stopping: a profile waiting behind raises ProfileStopped itself
                return spent
            seconds = _timed(tail, x, stop, cpu)
            spent += seconds
        costs.ran(tail, 1, seconds)
        before = trail_cpu()
        wait(TRAIL_WINDOW_S)
        costs.trails[tail] = trail_cpu() - before
    return spent


def run_profile(
    plan: ProfilePlan, stop: threading.Event, budget_s: float, costs: Costs,
    cpu: Callable[[], float] = time.process_time,
) -> tuple[dict[str, dict[str, float]], float]:
    """Median ms of each tail at each batch size (split id → str(batch) → ms), on one sample of
    seeded noise of the tail's shape repeated (convolution and matmul time do not depend on the
    values), within ``budget_s`` of tail runs. Raises :class:`ProfileStopped` before the next tail
    run once ``stop`` is set, and :class:`ProtocolError` when the request cannot fit its budget:
    before any input is made (noise for 154 samples of the full model took 0.5 s of CPU). Tight
    budgets drop repeats first, then the warm-up run (each tail's set-up was paid by its probe),
    down to one timed run of each batch size. ``cpu``: the process's CPU clock, what is spent is
    read from. Returns the times and the seconds spent (the probe's set-up included)."""
    entries = [(split_id, batch) for split_id in plan.tails for batch in plan.batches]
    # Tails the host's own probe has not costed yet (it runs when the host starts; a tail swapped
    # since, or a request that came first): their set-up is the host's, not the request's budget.
    setup = probe(plan.tails.values(), stop, costs, cpu)
    if stop.is_set():  # the probe gave up on a tail it had not costed: nothing to predict from
        raise ProfileStopped()
    began = cpu()
    trail = costs.trail(plan.tails.values())
    usable = STOP_SHARE * budget_s - trail  # what the runs may spend: the trail of the last follows them
    one_round = sum(costs.predict(plan.tails[s], b) for s, b in entries)
    if one_round > 0:  # planned within a share of the budget; one run of each, if that is all, within all of it
        rounds = max(int(PLANNED_SHARE / STOP_SHARE * usable / one_round) or int(usable / one_round), 0)
    else:
        rounds = plan.repeats + PROFILE_WARMUP
    warmup = PROFILE_WARMUP if rounds > PROFILE_WARMUP else 0
    repeats = min(plan.repeats, rounds - warmup)
    if repeats < 1:
        raise ProtocolError(
            f"profile: one run of each batch size would take about "
            f"{(one_round + trail) * 1000:.0f} ms of this host's time, over its budget of "
            f"{budget_s * 1000:g} ms a request (--profile-budget-ms); ask for fewer splits or smaller batches per request",
            code=ErrorCode.BAD_REQUEST,
        )
    inputs: dict[tuple[str, int], np.ndarray] = {}
    runs: dict[tuple[str, int], list[float]] = {entry: [] for entry in entries}
    for round_ in range(warmup + repeats):  # round-robin: stopped early, every batch size has as many runs
        for split_id, batch in entries:
            tail = plan.tails[split_id]
            spent = cpu() - began
            if spent + costs.predict(tail, batch) > usable:
                if round_ > warmup:  # each has a timed run: answer with what was measured
                    return _medians(runs), setup + spent
                raise ProtocolError(f"profile: stopped at {spent * 1000:.0f} ms, its budget is {budget_s * 1000:g} ms "
                                    "a request (--profile-budget-ms); this host is slower now than it was",
                                    code=ErrorCode.OVERLOADED)
            x = inputs.get((split_id, batch))
            if x is None:
                sample = np.random.default_rng(0).standard_normal((1, *tail.input_shape[1:])).astype(tail.input_dtype)
                x = inputs[split_id, batch] = np.repeat(sample, batch, axis=0)
            seconds = _timed(tail, x, stop, cpu)
            costs.ran(tail, batch, seconds)
            if round_ >= warmup:
                runs[split_id, batch].append(seconds)
    return _medians(runs), setup + cpu() - began


def _medians(runs: dict[tuple[str, int], list[float]]) -> dict[str, dict[str, float]]:
    times: dict[str, dict[str, float]] = {}
    for (split_id, batch), seconds in runs.items():
        times.setdefault(split_id, {})[str(batch)] = float(np.median(seconds)) * 1000.0
    return times


class Profiler:
    """Runs one profile at a time on a thread of its own; :meth:`close` stops it within one tail run."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="profile")
        self._stop = threading.Event()
        self.costs = Costs()
        self._running: asyncio.Future[tuple[dict[str, dict[str, float]], float]] | None = None
        self._probing: asyncio.Future[float] | None = None

    def start_probing(self, tails: Iterable[Backend]) -> None:
        """Cost every tail on the profiler's thread, in the background (:func:`probe`)."""
        self._probing = asyncio.get_running_loop().run_in_executor(self._executor, probe, list(tails), self._stop,
                                                                   self.costs)

    @property
    def busy(self) -> bool:
        return self._running is not None

    async def run(
        self, plan: ProfilePlan, budget_s: float = DEFAULT_PROFILE_BUDGET_S,
    ) -> tuple[dict[str, dict[str, float]], float]:
        """The plan's times within ``budget_s`` of tail runs, and the seconds spent; ``overloaded``
        at once if a profile is running or the host is stopping."""
        if self._stop.is_set():
            raise ProfileStopped()
        if self._running is not None:
            raise ProtocolError("another profile is running on this host (one at a time); retry when it ends",
                                code=ErrorCode.OVERLOADED)
        self._running = asyncio.get_running_loop().run_in_executor(self._executor, run_profile, plan, self._stop,
                                                                        budget_s, self.costs)
        try:
            return await self._running
        finally:
            self._running = None

    async def close(self, timeout: float) -> None:
        """Stop the profile running, if any: it ends after its current tail run (waited for at most ``timeout`` s)."""
        self._stop.set()
        running = [f for f in (self._running, self._probing) if f is not None]
        if running:
            await asyncio.wait(running, timeout=timeout)
        self._executor.shutdown(wait=False, cancel_futures=True)
