"""A semantic split's fragments on hosts: where each runs, and what the split then costs.

A semantic split (SplitPlace §3, DESIGN.md "Chains and fragments") runs the trunk on the board
up to the cut, then sends the cut's tensor to K fragments (``<split>#<k>``, k = 1..K), each
producing the logits of its class group; the board waits for all K. DSC's Eq. 4 prices one cut;
extended to fragments in parallel it takes the slowest:

    T_sem(B) = head(B) + max_k (8·bytes·B / r_k + rtt_k + fragment_k(B) + queue_k(B))

with r_k and rtt_k the board's measured link to fragment k's host, ``queue_k(B) = load ·
fragment_k(1)`` as :mod:`calibration.chains` prices a busy host (the same helpers compute both),
and fragment_k the host's own profile. Two fragments on one host are not parallel: the board
sends the tensor once per fragment and the host runs them one after the other, so a host's term
is the sum over its fragments (one round trip). Each host's link is taken as its own: where the
board's radio is the narrow part, K uploads share it and the last lands later than the max says
(K·bytes/r); what a Pi's Wi-Fi sees is for a field trial to measure.

Placement (issue 18): fragments go to the least loaded hosts that serve them and that the board
reaches, spread so that no two share a host while a host serving one of them is free; among
placements equally loaded, the least predicted time, then the order hosts were listed in. When a
host goes away its fragments are placed again over the hosts still in view, and every other
fragment stays where it was (``previous``), so its connection is not torn down. Load ranks before
speed because every host advertises its load, whereas a host's profile of a fragment may be
missing (not yet measured); a placement with a missing time is still made, with no prediction.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from calibration.chains import MAX_PLACEMENTS, HostView, _link_ms, _stage_ms
from calibration._latency import SplitTimings
from splitedge import Fields
from splitedge.errors import CalibrationError

__all__ = ["FragmentPlacement", "fragment_names", "place_fragments", "semantic_cost_ms", "semantic_timings",
           "unserved"]

_fields = Fields(CalibrationError)  # field checks raising this package's error


@dataclass(frozen=True)
class FragmentPlacement:
    """Which host runs each fragment, in fragment order, and what the split costs there.

    ``moved`` names the fragments whose host differs from the ``previous`` placement given
    (their connections change); ``timings`` and ``predicted_ms`` are None where a chosen host
    has no time for its fragment.
    """

    hosts: tuple[str, ...]
    moved: tuple[str, ...]
    timings: SplitTimings | None
    predicted_ms: float | None  # at the batch size it was chosen for


def fragment_names(split: str, count: int) -> tuple[str, ...]:
    """``<split>#1`` … ``<split>#K``: the names hosts serve a semantic split's fragments under."""
    _fields.integer(count, "fragments", minimum=1)
    return tuple(f"{split}#{k}" for k in range(1, count + 1))


def _reachable(host: HostView) -> bool:
    return host.rate_bps is not None and host.rate_bps > 0  # also refuses NaN


def _profiled(host: HostView, fragment: str) -> bool:
    return bool(host.stage_ms.get(fragment))


def _groups(fragments: Sequence[str], hosts: Sequence[HostView]) -> dict[str, tuple[HostView, list[str]]]:
    """Fragments by host address, in the order hosts first appear."""
    if len(hosts) != len(fragments):
        raise CalibrationError(f"{len(fragments)} fragments placed on {len(hosts)} hosts")
    groups: dict[str, tuple[HostView, list[str]]] = {}
    for fragment, host in zip(fragments, hosts):
        groups.setdefault(host.address, (host, []))[1].append(fragment)
    return groups


def _usable(groups: Mapping[str, tuple[HostView, list[str]]]) -> bool:
    return all(_reachable(h) and all(h.serves(f) and _profiled(h, f) for f in fs) for h, fs in groups.values())


def semantic_cost_ms(
    fragments: Sequence[str], bytes_per_sample: int, head_ms: Mapping[int, float], hosts: Sequence[HostView],
    batch: int,
) -> float | None:
    """T_sem at ``batch`` with fragment k on ``hosts[k]`` over the board's measured link to each
    (module docstring). None where a host is not reachable, does not serve its fragment or has
    no time for it."""
    _fields.integer(bytes_per_sample, "bytes_per_sample", minimum=0)
    groups = _groups(fragments, hosts)
    if not _usable(groups):
        return None
    head = SplitTimings("head", 0, dict(head_ms), {}).head_at(batch)
    return head + max(
        _link_ms(h.rate_bps, h.rtt_ms, len(fs) * bytes_per_sample, batch) + sum(_stage_ms(h, f, batch) for f in fs)
        for h, fs in groups.values()
    )


def semantic_timings(
    split: str, fragments: Sequence[str], bytes_per_sample: int, head_ms: Mapping[int, float],
    hosts: Sequence[HostView], batches: Sequence[int],
) -> SplitTimings | None:
    """The split on ``hosts`` (fragment k on ``hosts[k]``) as one split of the latency model, as
    :func:`calibration.chains.chain_timings` makes a chain one: the board's link stays the model's
    (one copy of the cut, at the rate the board estimates now, and the model's round trip) and
    ``tail_ms`` holds, at each batch size, the slowest host's work plus the further copies a
    host running several fragments receives (at the board's measured rate to it). None as for
    :func:`semantic_cost_ms`."""
    _fields.integer(bytes_per_sample, "bytes_per_sample", minimum=0)
    groups = _groups(fragments, hosts)
    if not _usable(groups):
        return None
    tail = {
        batch: max(
            _link_ms(h.rate_bps, 0.0, (len(fs) - 1) * bytes_per_sample, batch)
            + sum(_stage_ms(h, f, batch) for f in fs)
            for h, fs in groups.values()
        )
        for batch in batches
    }
    return SplitTimings(split, bytes_per_sample, dict(head_ms), tail)


def unserved(fragments: Sequence[str], hosts: Sequence[HostView]) -> tuple[str, ...]:
    """The fragments no host in view both serves and is reachable from the board: while any is
    listed the semantic split cannot run (:func:`place_fragments` gives None)."""
    return tuple(f for f in fragments if not any(_reachable(h) and h.serves(f) for h in hosts))


def place_fragments(
    split: str, fragments: Sequence[str], bytes_per_sample: int, head_ms: Mapping[int, float],
    hosts: Sequence[HostView], batch: int, previous: Mapping[str, str] | None = None,
    batches: Sequence[int] | None = None,
) -> FragmentPlacement | None:
    """Place ``fragments`` on ``hosts`` (the rules in the module docstring); None when a fragment
    has no host (:func:`unserved`).

    ``previous`` maps fragments to the address they ran on: each whose host is still in view,
    reachable and serving it stays there; the others are placed anew around them. ``batches``
    are the sizes the returned timings hold (default: ``batch``).
    """
    if not fragments or len(set(fragments)) != len(fragments):
        raise CalibrationError(f"{split}: expected distinct fragments, at least one, got {list(fragments)}")
    order = {h.address: i for i, h in enumerate(hosts)}
    by_address = {h.address: h for h in hosts}
    previous = previous or {}
    kept: dict[str, HostView] = {}
    for fragment in fragments:
        host = by_address.get(previous.get(fragment, ""))
        if host is not None and _reachable(host) and host.serves(fragment):
            kept[fragment] = host
    todo = [f for f in fragments if f not in kept]
    options = {f: [h for h in hosts if _reachable(h) and h.serves(f)] for f in todo}
    if any(not hs for hs in options.values()):
        return None
    # Bounded search: only a fragment's m best options by (load, its own time there, listing
    # order) can win, m = the hosts kept fragments use + the fragments to place. One of those m is
    # always free, and moving a fragment there from a worse option keeps the rules and lowers the
    # loads or, at equal loads, does not raise the time (alone there, it costs its own time).
    m = len({h.address for h in kept.values()}) + len(todo)
    pruned = {}
    for f, hs in options.items():
        def rank(h: HostView, f: str = f) -> tuple[float, float, int]:
            own = _link_ms(h.rate_bps, h.rtt_ms, bytes_per_sample, batch) + _stage_ms(h, f, batch)
            return h.load, own if _profiled(h, f) else math.inf, order[h.address]
        pruned[f] = sorted(hs, key=rank)[:m]
    count = math.prod(len(hs) for hs in pruned.values())
    if count > MAX_PLACEMENTS:
        raise CalibrationError(f"{split}: {count} placements of {len(todo)} fragments over {len(hosts)} hosts; "
                               f"at most {MAX_PLACEMENTS} are searched (name the hosts with --host)")
    best: tuple[tuple[list[float], float, tuple[int, ...]], tuple[HostView, ...]] | None = None
    for choice in itertools.product(*(pruned[f] for f in todo)):
        chosen = dict(zip(todo, choice))
        placed = [kept.get(f) or chosen[f] for f in fragments]
        if not _spread(todo, chosen, placed, options):
            continue
        cost = semantic_cost_ms(fragments, bytes_per_sample, head_ms, placed, batch)
        key = (sorted((h.load for h in choice), reverse=True), math.inf if cost is None else cost,
               tuple(order[h.address] for h in choice))
        if best is None or key < best[0]:
            best = key, tuple(placed)
    if best is None:  # unreachable: moving a crowded fragment to a free host always keeps the rules
        return None
    placed = best[1]
    moved = tuple(f for f, h in zip(fragments, placed) if f in previous and previous[f] != h.address)
    timings = semantic_timings(split, fragments, bytes_per_sample, head_ms, placed, sorted({batch, *(batches or ())}))
    predicted = semantic_cost_ms(fragments, bytes_per_sample, head_ms, placed, batch)
    return FragmentPlacement(tuple(h.address for h in placed), moved, timings, predicted)


def _spread(
    todo: Sequence[str], chosen: Mapping[str, HostView], placed: Sequence[HostView],
    options: Mapping[str, Sequence[HostView]],
) -> bool:
    """No fragment placed now shares its host while one of its hosts is free (kept ones may)."""
    used: dict[str, int] = {}
    for host in placed:
        used[host.address] = used.get(host.address, 0) + 1
    for f in todo:
        if used[chosen[f].address] > 1 and any(h.address not in used for h in options[f]):
            return False
    return True
