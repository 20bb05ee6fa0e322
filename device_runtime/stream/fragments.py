"""A semantic split on the board: scatter the cut to its fragments' hosts, gather what comes in time, merge.

SplitPlace's semantic split (seed-004 paper, Section 2, "Semantic and Layer Splitting") runs K fragments of
the network side by side, each scoring one group of classes; their outputs are concatenated
into one prediction. The board sends its cut tensor once to each fragment's host (K hosts, or
fewer running several fragments each), and merges the logits in label order (DESIGN.md "Chains
and fragments"): fragment k's columns go to the labels of its group (``Fragment.classes``).

A fragment late for the frame's deadline is not waited for: the board answers from those that
came, the classes of a missing group scored as absent (logit −inf, probability 0 after the
softmax), and says which fragments were missing. SplitPlace's premise is an answer in time
that may be less accurate; one that arrives after its deadline is worth nothing to the task.
Only when no fragment answers does the batch fail (and the pipeline answer it on the board).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from device_runtime.bundle import Split
from device_runtime.wire import ClientPool, HostClient, InferResult
from splitedge import HostUnavailableError, RemoteError

__all__ = ["FragmentTiming", "Gathered", "gather", "merge"]


@dataclass(frozen=True)
class FragmentTiming:
    """Where one fragment ran and where its time went."""

    index: int
    address: str
    round_trip_ms: float
    queue_ms: float
    compute_ms: float


@dataclass(frozen=True)
class Gathered:
    """The merged logits of the fragments that answered in time, and what happened to the others."""

    logits: np.ndarray  # (B, labels), label order; a missing group's classes are -inf
    timings: tuple[FragmentTiming, ...]  # the fragments that answered
    missing: tuple[int, ...] = ()  # fragments without an answer in time: late or failed
    failures: dict[int, str] = field(default_factory=dict)  # fragment -> why it failed (late ones are not here)
    gone: frozenset[str] = frozenset()  # hosts whose connection failed: their fragments want another host

    @property
    def transfer_ms(self) -> float:
        """The slowest answer's round trip less its host's queue and compute: what the links cost."""
        slowest = max(self.timings, key=lambda t: t.round_trip_ms)
        return max(slowest.round_trip_ms - slowest.queue_ms - slowest.compute_ms, 0.0)


def merge(split: Split, labels: int, outputs: Mapping[int, np.ndarray], batch: int) -> np.ndarray:
    """The fragments' logits scattered into label order; classes of a fragment not in ``outputs``
    are -inf (absent). An output of the wrong shape is refused: a host serving another model's
    fragment would otherwise put its scores on the wrong labels."""
    logits = np.full((batch, labels), -np.inf, dtype=np.float32)
    for fragment in split.fragments:
        out = outputs.get(fragment.index)
        if out is None:
            continue
        if out.shape != (batch, len(fragment.classes)):
            raise HostUnavailableError(f"fragment {fragment.index} of {split.id} answered shape {out.shape}, expected "
                                       f"{(batch, len(fragment.classes))}: the host serves another bundle's fragment")
        logits[:, list(fragment.classes)] = out
    return logits


async def gather(
    pool: ClientPool, placement: Mapping[int, str], bundle_id: str, split: Split, labels: int, tensor: np.ndarray,
    wait_s: float, timeout: float, deadline_ms: float | None = None, clients: Mapping[str, HostClient] | None = None,
    **tensor_fields: float,
) -> Gathered:
    """Send ``tensor`` to each fragment's host (``placement``: fragment index -> ``host:port``) at
    once, wait at most ``wait_s`` for the answers, and merge those that came. ``clients`` are
    connections already open (the board's connected host), used before the pool's. A host that
    fails is dropped from the pool, so the next batch connects again. Raises
    :class:`HostUnavailableError` when no fragment answered, naming why each did not."""
    clients = clients or {}

    async def one(index: int, address: str) -> InferResult:
        client = clients.get(address) or await pool.client(address)
        try:
            return await client.infer(bundle_id, split.id, tensor, timeout, deadline_ms, stage=index, **tensor_fields)
        except HostUnavailableError:
            await pool.drop(address)
            raise

    tasks = {index: asyncio.ensure_future(one(index, address)) for index, address in placement.items()}
    try:
        await asyncio.wait(tasks.values(), timeout=wait_s)
    finally:
        for task in tasks.values():
            task.cancel()  # the late ones: their replies are not waited for
        await asyncio.gather(*tasks.values(), return_exceptions=True)
    outputs, timings, failures, gone = {}, [], {}, set()
    for index, task in tasks.items():
        if task.cancelled():
            continue
        error = task.exception()
        if isinstance(error, (HostUnavailableError, RemoteError)):
            failures[index] = f"{placement[index]}: {error}"
            if isinstance(error, HostUnavailableError):
                gone.add(placement[index])
            continue
        if error is not None:
            raise error
        result = task.result()
        outputs[index] = result.output
        timings.append(FragmentTiming(index, placement[index], result.round_trip_ms, result.queue_ms,
                                      result.compute_ms))
    if not outputs:
        why = "; ".join(f"fragment {k}: {failures.get(k, f'no answer within {wait_s * 1000:.0f} ms')}" for k in tasks)
        raise HostUnavailableError(f"semantic split {split.id}: no fragment answered ({why})")
    logits = merge(split, labels, outputs, len(tensor))
    missing = tuple(sorted(set(tasks) - set(outputs)))
    return Gathered(logits, tuple(timings), missing, failures, frozenset(gone))
