"""Placing a chain's stages on hosts, priced by DSC Eq. 4 extended to chains, in hand-computed cases."""

from __future__ import annotations

import pytest

from calibration.chains import MAX_PLACEMENTS, ChainStage, HostView, chain_timings, place
from calibration._latency import LatencyModel, SplitTimings
from splitedge.errors import CalibrationError

CHAIN = "a+b"
STAGES = (ChainStage("a+b#1", 100_000), ChainStage("a+b#2", 10_000))
HEAD = {1: 5.0}


def edge(**changes) -> HostView:
    """Near the board (80 Mbit/s, 1 ms), slow to compute, 1 Gbit/s (2 ms) to the cloud."""
    view = dict(address="edge:1", stage_ms={"a+b#1": {1: 20.0}, "a+b#2": {1: 30.0}}, rate_bps=80e6, rtt_ms=1.0,
                peers={"cloud:1": (1e9, 2.0)})
    return HostView(**{**view, **changes})


def cloud(**changes) -> HostView:
    """Far from the board (40 Mbit/s, 10 ms), fast to compute; it never measured the edge."""
    view = dict(address="cloud:1", stage_ms={"a+b#1": {1: 2.0}, "a+b#2": {1: 1.0}}, rate_bps=40e6, rtt_ms=10.0)
    return HostView(**{**view, **changes})


def test_skipping_the_edge_wins_where_the_sum_says_so() -> None:
    # (edge, edge): 5 + 10 + 1 + 20 + 30 = 66; (edge, cloud): 5 + 10 + 1 + 20 + (0.08 + 2) + 1 = 39.08;
    # (cloud, cloud): 5 + 20 + 10 + 2 + 1 = 38; (cloud, edge): the cloud never measured the edge.
    best = place(CHAIN, STAGES, HEAD, [edge(), cloud()], batch=1)
    assert best.hosts == ("cloud:1", "cloud:1") and best.predicted_ms == pytest.approx(38.0)
    # A cloud 2 ms further away: through the edge wins (40 > 39.08).
    best = place(CHAIN, STAGES, HEAD, [edge(), cloud(rtt_ms=12.0)], batch=1)
    assert best.hosts == ("edge:1", "cloud:1") and best.predicted_ms == pytest.approx(39.08)
    assert best.timings.tail_at(1) == pytest.approx(20 + 2.08 + 1)  # what follows the board's link


def test_a_busy_host_costs_its_queue() -> None:
    """The cloud with 3 samples ahead per worker: stage 1 waits 3 x 2 ms and stage 2 3 x 1 ms,
    44 ms for (cloud, cloud); the edge's path is then cheaper: 5 + 10 + 1 + 20 + 2.08 + (1 + 3) = 42.08."""
    best = place(CHAIN, STAGES, HEAD, [edge(), cloud(load=3.0)], batch=1)
    assert best.hosts == ("edge:1", "cloud:1") and best.predicted_ms == pytest.approx(42.08)


def test_ties_go_to_fewer_hosts_then_to_the_order_given() -> None:
    twin = edge(address="twin:1", peers={"edge:1": (1e12, 0.0)})
    same = {"peers": {"twin:1": (1e12, 0.0)}}
    assert place(CHAIN, STAGES, HEAD, [edge(**same), twin], batch=1).hosts == ("edge:1", "edge:1")
    assert place(CHAIN, STAGES, HEAD, [twin, edge(**same)], batch=1).hosts == ("twin:1", "twin:1")


def test_no_placement_without_a_host_for_every_stage() -> None:
    only_first = cloud(stage_ms={"a+b#1": {1: 2.0}})
    assert place(CHAIN, STAGES, HEAD, [only_first], batch=1) is None
    unreachable = cloud(rate_bps=None)  # the board has no link to it: it cannot run the first stage
    assert place(CHAIN, STAGES, HEAD, [unreachable], batch=1) is None
    assert chain_timings(CHAIN, STAGES, HEAD, [cloud(), edge()], [1]) is None  # cloud -> edge never measured


def test_a_chain_enters_the_latency_model_as_one_split_beside_the_single_cuts() -> None:
    """On the board's link, a chain costs its first cut's bytes: at 2 Mbit/s the 100 kB cut takes
    400 ms, a single cut sending 1 MB 4000 ms; at 1 Gbit/s the single cut's faster host wins."""
    chain = place(CHAIN, STAGES, HEAD, [edge(), cloud(rtt_ms=12.0)], batch=1).timings
    single = SplitTimings("a", 1_000_000, {1: 4.0}, {1: 1.0})
    model = LatencyModel((single, chain), rtt_ms=1.0)
    assert model.predict_ms(CHAIN, 1, 2e6) == pytest.approx(5 + 400 + 23.08 + 1)
    assert model.best(1, 2e6) == CHAIN and model.best(1, 1e9) == "a"


def test_the_search_is_bounded() -> None:
    hosts = [edge(address=f"h{i}:1", rate_bps=1e6) for i in range(MAX_PLACEMENTS)]
    with pytest.raises(CalibrationError, match=rf"chain a\+b: {MAX_PLACEMENTS ** 2} placements over"):
        place(CHAIN, STAGES, HEAD, hosts, batch=1)
