"""Chains of hosts: what a chain costs on a placement, and the placement that costs least.

DSC's Eq. 4 prices one cut: ``T_l(B, r) = head_l(B) + 8·bytes_l·B / r + tail_l(B) + rtt``. A chain
(board → host 1 → … → host n, DESIGN.md "Chains and fragments") crosses n links: the board's own,
whose rate moves by the second, and the hosts' links to each other, which a host measures with
``ping`` and which change slowly. Extended to chains:

    T_chain(B, r) = head(B) + 8·bytes_1·B / r + rtt
                  + Σ_{k≥2} (8·bytes_k·B / r_{k-1,k} + rtt_{k-1,k})      (the hosts' links)
                  + Σ_k (stage_k(B) + queue_k(B))                       (the hosts' work)

Only the first line depends on the board's link, so for one placement everything after it is
one number per batch size: the chain is a :class:`~calibration._latency.SplitTimings` whose
``tail_ms`` is that sum, and it enters the board's latency model and rate × batch table beside
the single cuts, switched with the same hysteresis (:func:`chain_timings`). Two stages on one
host cross no link (``r = ∞``, no round trip).

``queue_k`` prices a host's advertised load (samples queued or running per worker, the TXT
record's ``load``): each waits about one sample's stage time before ours starts, so
``queue_k(B) = load · stage_k(1)``. An approximation, stated as such: it ranks a busy host below
an idle one of the same speed, which is what placement needs, without a queueing model of
batching the host does not publish.

:func:`place` tries every assignment of stages to hosts that serve them (bounded: a fleet of a
few hosts and chains of a few stages) and keeps the cheapest at a batch size and board rate;
ties go to fewer hosts, then to the order hosts were listed in, so the answer is deterministic.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from calibration._latency import SplitTimings
from splitedge.errors import CalibrationError

__all__ = ["MAX_PLACEMENTS", "ChainStage", "HostView", "Placement", "chain_timings", "place"]

#: Assignments :func:`place` may try; past it the fleet or the chain is too big to search whole.
MAX_PLACEMENTS = 4096
_MS_PER_S = 1000.0
_BITS_PER_BYTE = 8


@dataclass(frozen=True)
class ChainStage:
    """Stage k of a chain: ``name`` as hosts serve it (``<chain>#<k>``) and the bytes per sample of
    its input, the cut it starts from (what crosses the link into the host that runs it)."""

    name: str
    bytes_per_sample: int


@dataclass(frozen=True)
class HostView:
    """What the board knows of one host: its stages' measured times, its load, its links.

    ``rate_bps`` and ``rtt_ms`` are the board's own link to it (None: unknown, so the host can
    run no stage but the first… or none, when it is not reachable from the board); ``peers`` maps
    another host's address to (rate bit/s, round trip ms) as this host measured it.
    """

    address: str
    stage_ms: Mapping[str, Mapping[int, float]]  # stage name -> batch -> median ms, the host's own profile
    load: float = 0.0
    rate_bps: float | None = None
    rtt_ms: float = 0.0
    peers: Mapping[str, tuple[float, float]] = field(default_factory=dict)

    def serves(self, stage: str) -> bool:
        return stage in self.stage_ms


@dataclass(frozen=True)
class Placement:
    """Which host runs each stage, in stage order, and the chain's timings on them."""

    hosts: tuple[str, ...]
    timings: SplitTimings
    predicted_ms: float  # at the batch size and board rate it was chosen for


def _stage_ms(host: HostView, stage: str, batch: int) -> float:
    timings = SplitTimings(stage, 0, {}, dict(host.stage_ms[stage]))
    return timings.tail_at(batch) + host.load * timings.tail_at(1)


def _link_ms(rate_bps: float, rtt_ms: float, nbytes: int, batch: int) -> float:
    return _BITS_PER_BYTE * nbytes * batch * _MS_PER_S / rate_bps + rtt_ms


def chain_timings(
    chain: str, stages: Sequence[ChainStage], head_ms: Mapping[int, float], hosts: Sequence[HostView],
    batches: Sequence[int],
) -> SplitTimings | None:
    """The chain on ``hosts`` (stage k on ``hosts[k-1]``) as one split of the latency model: the
    board's link stays the model's (``bytes_per_sample`` of the first cut), and ``tail_ms`` holds the
    rest at each batch size, host links and host work together. None where a host does not serve
    its stage or no host-to-host rate is known for a hop between two hosts."""
    if len(hosts) != len(stages):
        raise CalibrationError(f"chain {chain}: {len(stages)} stages placed on {len(hosts)} hosts")
    tail: dict[int, float] = {}
    for batch in batches:
        ms = 0.0
        for k, (stage, host) in enumerate(zip(stages, hosts)):
            if not host.serves(stage.name):
                return None
            if k:
                previous = hosts[k - 1]
                if previous.address != host.address:
                    link = previous.peers.get(host.address)
                    if link is None or not link[0] > 0:
                        return None
                    ms += _link_ms(link[0], link[1], stage.bytes_per_sample, batch)
            ms += _stage_ms(host, stage.name, batch)
        tail[batch] = ms
    return SplitTimings(chain, stages[0].bytes_per_sample, dict(head_ms), tail)


def place(
    chain: str, stages: Sequence[ChainStage], head_ms: Mapping[int, float], hosts: Sequence[HostView],
    batch: int, batches: Sequence[int] | None = None,
) -> Placement | None:
    """The cheapest placement of ``chain`` at ``batch``: the first stage on a host the board reaches
    (over its own measured link to that host), every stage on a host that serves it. None when no
    placement works. ``batches`` are the sizes the returned timings hold (default: ``batch``)."""
    first = [h for h in hosts if h.rate_bps is not None and h.rate_bps > 0 and h.serves(stages[0].name)]
    rest = [[h for h in hosts if h.serves(s.name)] for s in stages[1:]]
    count = len(first) * math.prod(len(r) for r in rest)
    if count > MAX_PLACEMENTS:
        raise CalibrationError(f"chain {chain}: {count} placements over {len(hosts)} hosts; at most "
                               f"{MAX_PLACEMENTS} are searched (name the hosts with --host)")
    order = {h.address: i for i, h in enumerate(hosts)}
    best: tuple[tuple[float, int, tuple[int, ...]], Placement] | None = None
    for choice in itertools.product(first, *rest):
        timings = chain_timings(chain, stages, head_ms, choice, sorted({batch, *(batches or ())}))
        if timings is None:
            continue
        entry = choice[0]
        predicted = (timings.head_at(batch) + _link_ms(entry.rate_bps, entry.rtt_ms, stages[0].bytes_per_sample, batch)
                     + timings.tail_at(batch))
        key = (predicted, len({h.address for h in choice}), tuple(order[h.address] for h in choice))
        if best is None or key < best[0]:
            best = key, Placement(tuple(h.address for h in choice), timings, predicted)
    return None if best is None else best[1]
