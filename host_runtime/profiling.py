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
  that each check a stop flag first, so a stopping host ends a profile within one run.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from calibration import measure_ms
from device_runtime.engine import Backend
from device_runtime.wire import ProfileRequest
from host_runtime.tails import TailRegistry
from splitedge import ProtocolError

#: Untimed runs before each batch size's timed ones (onnxruntime plans its memory on the first).
PROFILE_WARMUP = 3
#: Samples one request may run in all (tails × Σ batches × (repeats + warm-up)). A board's
#: default calibration (batches 1, 2, 4, 8, 16; 20 repeats) is 713 samples a tail, so 11 tails
#: fit; the full MobileNetV2 on one core of the build machine takes about 17 ms a sample, so
#: the bound is about two minutes of one core at worst, on a thread of its own.
MAX_PROFILE_SAMPLES = 8192


class ProfileStopped(ProtocolError):
    """The host is stopping: the profile ends after the tail run in progress."""

    def __init__(self) -> None:
        super().__init__("the host is shutting down: profile stopped; use another host", code="overloaded")


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
    tails = {split_id: registry.lookup(bundle_id, split_id) for split_id in (served[bundle_id] if splits is None else splits)}
    for split_id, tail in tails.items():
        if not all(isinstance(d, int) for d in tail.input_shape[1:]):
            raise ProtocolError(f"tail of split {split_id} has a dynamic shape {list(tail.input_shape)}: "
                                "cannot profile it", code="internal")
    plan = ProfilePlan(tails, tuple(dict.fromkeys(batches)), repeats)
    if plan.samples > MAX_PROFILE_SAMPLES:
        raise ProtocolError(
            f"profile of {plan.samples} samples ({len(tails)} tails × {sum(plan.batches)} batch samples × "
            f"({repeats} repeats + {PROFILE_WARMUP} warm-up)) exceeds the limit of {MAX_PROFILE_SAMPLES} per request; "
            "ask for fewer splits, batch sizes or repeats, in several requests if need be",
            code="bad_request",
        )
    return plan


def run_profile(plan: ProfilePlan, stop: threading.Event) -> dict[str, dict[str, float]]:
    """Median ms of each tail at each batch size (split id → str(batch) → ms), on seeded noise
    of the tail's shape (convolution and matmul time do not depend on the values). Raises
    :class:`ProfileStopped` before the next tail run once ``stop`` is set."""
    rng = np.random.default_rng(0)
    times: dict[str, dict[str, float]] = {}
    for split_id, tail in plan.tails.items():
        times[split_id] = {}
        for batch in plan.batches:
            x = rng.standard_normal((batch, *tail.input_shape[1:])).astype(tail.input_dtype)

            def run(tail: Backend = tail, x: np.ndarray = x) -> None:
                if stop.is_set():
                    raise ProfileStopped()
                tail.run(x)

            times[split_id][str(batch)] = measure_ms(run, plan.repeats, warmup=PROFILE_WARMUP)
    return times


class Profiler:
    """Runs one profile at a time on a thread of its own; :meth:`close` stops it within one tail run."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="profile")
        self._stop = threading.Event()
        self._running: asyncio.Future[dict[str, dict[str, float]]] | None = None

    @property
    def busy(self) -> bool:
        return self._running is not None

    async def run(self, plan: ProfilePlan) -> dict[str, dict[str, float]]:
        """The plan's times; ``overloaded`` at once if a profile is running or the host is stopping."""
        if self._stop.is_set():
            raise ProfileStopped()
        if self._running is not None:
            raise ProtocolError("another profile is running on this host (one at a time); retry when it ends",
                                code="overloaded")
        self._running = asyncio.get_running_loop().run_in_executor(self._executor, run_profile, plan, self._stop)
        try:
            return await self._running
        finally:
            self._running = None

    async def close(self, timeout: float) -> None:
        """Stop the profile running, if any: it ends after its current tail run (waited for at most ``timeout`` s)."""
        self._stop.set()
        if self._running is not None:
            await asyncio.wait([self._running], timeout=timeout)
        self._executor.shutdown(wait=False, cancel_futures=True)
