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
import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import numpy as np

from calibration.chains import HostView
from calibration.fragments import place_fragments
from device_runtime.bundle import Split, stage_id
from device_runtime.hosts import HostLink, LinkMeter
from device_runtime.stream._board_engine import BoardEngine
from device_runtime.stream._config import PipelineConfig
from device_runtime.stream._handoff import HeadDone, InFlight
from device_runtime.stream._results import FrameResult
from device_runtime.link import ClientPool, Credentials, Deadline, HostClient, InferResult, Leg
from splitedge.errors import HostUnavailableError, RemoteError

__all__ = ["FragmentAnswers", "FragmentRequest", "FragmentTiming", "Gathered", "merge"]

log = logging.getLogger("splitedge.device")


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


@dataclass(frozen=True)
class FragmentRequest:
    """One cut for every fragment of a semantic split: what each fragment's host is sent."""

    bundle_id: str
    split: Split
    labels: int  # the model's labels: the merged logits' width
    tensor: np.ndarray
    timeout: float  # each request's (s): a host silent this long is gone
    deadline_ms: float | None = None
    fields: Mapping[str, float] = field(default_factory=dict)  # the cut's quantization fields

    async def gather(
        self, pool: ClientPool, placement: Mapping[int, str], wait_s: float,
        clients: Mapping[str, HostClient] | None = None,
    ) -> Gathered:
        """Send the cut to each fragment's host (``placement``: fragment index -> ``host:port``) at
        once, wait at most ``wait_s`` for the answers, and merge those that came. ``clients`` are
        connections already open (the board's connected host), used before the pool's. A host that
        fails is dropped from the pool, so the next batch connects again. Raises
        :class:`HostUnavailableError` when no fragment answered, naming why each did not."""
        clients = clients or {}
        split = self.split

        async def one(index: int, address: str) -> InferResult:
            client = clients.get(address) or await pool.client(address)
            try:
                deadline = None if self.deadline_ms is None else Deadline(self.deadline_ms)
                return await client.infer(self.bundle_id, split.id, self.tensor, self.timeout, deadline, Leg(index),
                                          **self.fields)
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
            why = "; ".join(f"fragment {k}: {failures.get(k, f'no answer within {wait_s * 1000:.0f} ms')}"
                            for k in tasks)
            raise HostUnavailableError(f"semantic split {split.id}: no fragment answered ({why})")
        logits = merge(split, self.labels, outputs, len(self.tensor))
        missing = tuple(sorted(set(tasks) - set(outputs)))
        return Gathered(logits, tuple(timings), missing, failures, frozenset(gone))


class FragmentAnswers:
    """Answers a semantic split's heads from its fragments' hosts, and places the fragments: where
    the config says, then wherever they were moved to after their host went away."""

    def __init__(
        self, engine: BoardEngine, hosts: HostLink | None, meter: LinkMeter, config: PipelineConfig,
        in_flight: InFlight,
    ) -> None:
        self.engine, self.hosts, self.meter, self.config, self.in_flight = engine, hosts, meter, config, in_flight
        # Connections to the fragment hosts other than the connected one, and where fragments were
        # moved to after their host went away.
        self._pool = ClientPool(hosts.credentials if hosts is not None else Credentials(), config.request_timeout_s,
                                what="fragment host")
        self._placed: dict[str, dict[int, str]] = {}

    def servable(self, split: str, served: Collection[str], connected: str) -> bool:
        """Whether the host at ``connected``, serving ``served``, serves the fragments placed on it."""
        return all(stage_id(split, k) in served for k, a in self.placement(split).items() if a == connected)

    def placement(self, split: str) -> dict[int, str]:
        """Fragment index -> its host's address: where they were moved to, else where the config
        says (all on the connected host where it says ())."""
        if split in self._placed:
            return self._placed[split]
        fragments = self.engine.runner.bundle.manifest.split(split).fragments
        assert self.hosts is not None and self.hosts.client is not None
        addresses = self.config.fragments[split] or (self.hosts.client.address,) * len(fragments)
        return {f.index: address for f, address in zip(fragments, addresses)}

    async def answer(self, done: HeadDone, client: HostClient) -> list[FrameResult]:
        """The cut to every fragment's host at once, merged from those that answer by the frame's
        deadline (the request timeout without one); none answering runs it here."""
        ticket = self.meter.sending(done.tensor.nbytes)
        timeout = self.config.request_timeout_s
        wait_s = timeout if done.deadline is None else done.deadline / 1000.0
        manifest = self.engine.runner.bundle.manifest
        request = FragmentRequest(self.engine.runner.bundle.id, manifest.split(done.split), len(manifest.model.labels),
                                  done.tensor, timeout, done.deadline, done.fields)
        try:
            gathered = await request.gather(self._pool, self.placement(done.split), wait_s,
                                            clients={client.address: client})
        except HostUnavailableError as exc:
            self._move(done.split, set(self.placement(done.split).values()) - {client.address})
            return await self.engine.fallback(done, exc)
        finally:
            self.meter.settled(ticket)
            self.in_flight.give_back()
        if gathered.gone:
            self._move(done.split, gathered.gone)
        slowest = max(gathered.timings, key=lambda t: t.round_trip_ms)
        return done.answered(
            " | ".join(dict.fromkeys(t.address for t in gathered.timings)), transfer_ms=gathered.transfer_ms,
            tail_ms=slowest.compute_ms, host_queue_ms=slowest.queue_ms, missing=gathered.missing,
        ).results(done.batch, gathered.logits, self.engine.runner.labels)

    def _move(self, split: str, gone: Collection[str]) -> None:
        """Fragments whose host went away, placed again over the hosts still in view that serve them
        (:func:`calibration.place_fragments`: least loaded, spread, the others kept where they were).
        Where none serves one, it stays put and its classes are scored absent until its host is back."""
        placement = self.placement(split)
        assert self.hosts is not None and self.hosts.client is not None
        bundle_id = self.engine.runner.bundle.id
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

    async def close(self) -> None:
        await self._pool.close()
