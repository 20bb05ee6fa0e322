"""A semantic split's fragments on hosts: spread, least loaded, moved when a host goes, priced by hand."""

from __future__ import annotations

import pytest

from calibration.chains import HostView
from calibration.fragments import (
    fragment_names, place_fragments, semantic_cost_ms, semantic_timings, unserved,
)
from splitedge.errors import CalibrationError

SPLIT = "s"
F1, F2, F3 = fragment_names(SPLIT, 3)
BYTES = 10_000  # 80 kbit: 1 ms a copy at 80 Mbit/s, 2 ms at 40 Mbit/s
HEAD = {1: 5.0}


def host(address: str, times: dict[str, float], load: float = 0.0, rate_bps: float | None = 80e6,
         rtt_ms: float = 1.0) -> HostView:
    """A host near the board (80 Mbit/s, 1 ms) with ``times`` at batch 1 for the fragments it serves."""
    return HostView(address, {f: ({1: ms} if ms is not None else {}) for f, ms in times.items()}, load, rate_bps,
                    rtt_ms)


def test_fragment_names() -> None:
    assert fragment_names("layer3_add", 2) == ("layer3_add#1", "layer3_add#2")
    with pytest.raises(CalibrationError, match="fragments"):
        fragment_names(SPLIT, 0)


def test_fragments_spread_over_free_hosts_each_where_it_costs_least() -> None:
    a = host("a:1", {F1: 10.0, F2: 20.0})
    b = host("b:1", {F1: 12.0, F2: 8.0})
    busy = host("c:1", {F1: 1.0, F2: 1.0}, load=2.0)
    # (a, b): max(1 + 1 + 10, 1 + 1 + 8) = 12 -> 17 with the head; (b, a): max(14, 22) -> 27.
    placement = place_fragments(SPLIT, (F1, F2), BYTES, HEAD, [a, b, busy], batch=1)
    assert placement.hosts == ("a:1", "b:1")
    assert placement.predicted_ms == pytest.approx(17.0)
    assert placement.moved == ()
    # The same two hosts listed the other way round: the cost still decides which runs which.
    assert place_fragments(SPLIT, (F1, F2), BYTES, HEAD, [b, a], batch=1).hosts == ("a:1", "b:1")


def test_the_least_loaded_hosts_are_chosen_and_equal_ones_in_the_order_listed() -> None:
    same = {F1: 10.0, F2: 10.0}
    hosts = [host("a:1", same, load=2.0), host("b:1", same, load=0.0), host("c:1", same, load=1.0),
             host("d:1", same, load=0.5), host("e:1", same, load=0.0)]
    assert place_fragments(SPLIT, (F1, F2), BYTES, HEAD, hosts, batch=1).hosts == ("b:1", "e:1")
    hosts[4] = host("e:1", same, load=0.75)
    placement = place_fragments(SPLIT, (F1, F2), BYTES, HEAD, hosts, batch=1)
    assert placement.hosts == ("b:1", "d:1")
    # d waits for half a sample of 10 ms ahead of ours: 5 + 1 + 1 + 10 + 0.5 x 10 = 22.
    assert placement.predicted_ms == pytest.approx(22.0)


def test_a_free_host_that_serves_a_fragment_is_taken_even_when_busier() -> None:
    a = host("a:1", {F1: 10.0, F2: 10.0})
    c = host("c:1", {F1: 10.0}, load=5.0)  # serves only the first fragment, and is busy
    assert place_fragments(SPLIT, (F1, F2), BYTES, HEAD, [a, c], batch=1).hosts == ("c:1", "a:1")


def test_two_fragments_share_a_host_only_when_no_free_host_serves_them() -> None:
    a = host("a:1", {F1: 10.0, F2: 10.0, F3: 10.0})
    c = host("c:1", {F1: 10.0})
    unreachable = host("u:1", {F2: 1.0, F3: 1.0}, rate_bps=None)  # the board has no link to it
    placement = place_fragments(SPLIT, (F1, F2, F3), BYTES, HEAD, [a, c, unreachable], batch=1)
    assert placement.hosts == ("c:1", "a:1", "a:1")
    # a runs two: two copies at 1 ms, one round trip, 10 + 10 ms one after the other -> 5 + 23.
    assert placement.predicted_ms == pytest.approx(28.0)
    # Three fragments, two hosts that serve all: one pair is forced, on the less loaded host;
    # which fragment runs alone is a tie (23 ms either way), to the order listed.
    b = host("b:1", {F1: 10.0, F2: 10.0, F3: 10.0}, load=0.5)
    assert place_fragments(SPLIT, (F1, F2, F3), BYTES, HEAD, [b, a], batch=1).hosts == ("b:1", "a:1", "a:1")
    assert place_fragments(SPLIT, (F1, F2, F3), BYTES, HEAD, [a, b], batch=1).hosts == ("a:1", "a:1", "b:1")


def test_a_host_gone_moves_its_fragments_and_the_others_stay() -> None:
    same = {F1: 10.0, F2: 10.0, F3: 10.0}
    a, b, c = host("a:1", same, load=3.0), host("b:1", same), host("c:1", same, load=2.0)
    d, e = host("d:1", same, load=4.0), host("e:1", same, load=1.0)
    previous = {F1: "a:1", F2: "b:1", F3: "c:1"}
    placement = place_fragments(SPLIT, (F1, F2, F3), BYTES, HEAD, [a, c, d, e], batch=1, previous=previous)
    assert placement.hosts == ("a:1", "e:1", "c:1")  # a stays although e is less loaded
    assert placement.moved == (F2,)
    # Every host gone but a: all three on a, two of them moved.
    placement = place_fragments(SPLIT, (F1, F2, F3), BYTES, HEAD, [a], batch=1, previous=previous)
    assert placement.hosts == ("a:1", "a:1", "a:1") and placement.moved == (F2, F3)
    # A host that stopped serving its fragment counts as gone for it.
    placement = place_fragments(SPLIT, (F1, F2, F3), BYTES, HEAD, [a, host("b:1", {F1: 1.0}), c, e], batch=1,
                                previous=previous)
    assert placement.hosts == ("a:1", "e:1", "c:1") and placement.moved == (F2,)


def test_no_host_for_a_fragment_means_no_placement() -> None:
    a = host("a:1", {F1: 10.0})
    far = host("f:1", {F2: 10.0}, rate_bps=None)
    assert place_fragments(SPLIT, (F1, F2), BYTES, HEAD, [a, far], batch=1) is None
    assert unserved((F1, F2), [a, far]) == (F2,)
    assert unserved((F1, F2), [a, far, host("g:1", {F2: 3.0})]) == ()
    with pytest.raises(CalibrationError, match="distinct fragments"):
        place_fragments(SPLIT, (F1, F1), BYTES, HEAD, [a], batch=1)


def test_a_missing_profile_still_places_but_predicts_nothing() -> None:
    a = host("a:1", {F1: 10.0, F2: None})  # serves the second fragment, never timed it
    b = host("b:1", {F1: 10.0, F2: None}, load=1.0)
    placement = place_fragments(SPLIT, (F1, F2), BYTES, HEAD, [a, b], batch=1)
    assert placement.hosts == ("a:1", "b:1")  # no time to compare: the loads, then the order listed
    assert placement.predicted_ms is None and placement.timings is None
    timed = host("b:1", {F1: 10.0, F2: 12.0}, load=1.0)
    placement = place_fragments(SPLIT, (F1, F2), BYTES, HEAD, [a, timed], batch=1)
    # Equal loads either way; (a, b) has a known time, 5 + max(1 + 1 + 10, 1 + 1 + 12 + 12) = 31, and
    # (b, a) none (a never timed F2): the known one ranks first.
    assert placement.hosts == ("a:1", "b:1") and placement.predicted_ms == pytest.approx(31.0)


def test_cost_is_the_slowest_host_by_hand() -> None:
    """a: 40 Mbit/s (2 ms a copy), 3 ms round trip, one sample queued, fragments 1 and 2;
    b: 80 Mbit/s, 1 ms, fragment 3. At B = 1: a = 2 x 2 + 3 + (10 + 10) + (6 + 6) = 39,
    b = 1 + 1 + 25 = 27, so 5 + 39 = 44. At B = 4: a = 16 + 3 + (30 + 10) + (24 + 6) = 89,
    b = 4 + 1 + 100 = 105, so 20 + 105 = 125 (single measurements scale with the batch)."""
    a = HostView("a:1", {F1: {1: 10.0, 4: 30.0}, F2: {1: 6.0}}, load=1.0, rate_bps=40e6, rtt_ms=3.0)
    b = host("b:1", {F3: 25.0})
    placed = [a, a, b]
    assert semantic_cost_ms((F1, F2, F3), BYTES, HEAD, placed, 1) == pytest.approx(44.0)
    assert semantic_cost_ms((F1, F2, F3), BYTES, HEAD, placed, 4) == pytest.approx(125.0)
    # As a split of the latency model: the board's link is the model's (one copy); the tail is the
    # slowest host's work plus a's second copy: max(2 + 20 + 12, 25) = 34 at B = 1, max(8 + 40 + 30, 100) at 4.
    timings = semantic_timings(SPLIT, (F1, F2, F3), BYTES, HEAD, placed, [1, 4])
    assert timings.split == SPLIT and timings.bytes_per_sample == BYTES and timings.head_ms == HEAD
    assert timings.tail_ms == pytest.approx({1: 34.0, 4: 100.0})
    assert semantic_timings(SPLIT, (F1, F2, F3), BYTES, HEAD, [a, b, b], [1]) is None  # b lacks fragment 2
    with pytest.raises(CalibrationError, match="3 fragments placed on 2 hosts"):
        semantic_cost_ms((F1, F2, F3), BYTES, HEAD, [a, b], 1)


def test_the_placement_holds_timings_at_the_sizes_asked() -> None:
    a, b = host("a:1", {F1: 10.0}), host("b:1", {F2: 8.0})
    placement = place_fragments(SPLIT, (F1, F2), BYTES, HEAD, [a, b], batch=1, batches=[1, 2])
    assert placement.timings.tail_ms == pytest.approx({1: 10.0, 2: 20.0})


def test_the_search_is_bounded() -> None:
    names = fragment_names(SPLIT, 4)
    hosts = [host(f"h{i}:1", dict.fromkeys(names, 10.0)) for i in range(12)]
    # 12^4 assignments, but only each fragment's 4 best options can win: 4^4 are tried.
    assert place_fragments(SPLIT, names, BYTES, HEAD, hosts, batch=1).hosts == ("h0:1", "h1:1", "h2:1", "h3:1")
    names = fragment_names(SPLIT, 6)  # 6^6 > MAX_PLACEMENTS even so
    with pytest.raises(CalibrationError, match="46656 placements of 6 fragments over 12 hosts"):
        place_fragments(SPLIT, names, BYTES, HEAD, [host(h.address, dict.fromkeys(names, 1.0)) for h in hosts], 1)
