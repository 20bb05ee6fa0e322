"""Observability: the Prometheus endpoint counts exactly what was sent, and ``stats`` over the
protocol returns the same figures as the scrape."""

from __future__ import annotations

import asyncio
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from device_runtime.bundle import Bundle
from device_runtime.wire.ops import OPS
from host_runtime._metrics import stats_from
from tests.conftest import TEST_SPLITS, start_host
from tests.host_runtime.helpers import cut, infer, run_with_client

EARLY, LATE = TEST_SPLITS


@pytest.fixture(scope="module")
def bundle(mobilenet_bundle) -> Bundle:
    return Bundle.load(mobilenet_bundle)


def scrape(host) -> str:
    url = f"http://127.0.0.1:{host.server.metrics.port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        return response.read().decode()


def test_scrape_counts_what_was_sent_and_equals_stats(mobilenet_bundle, bundle) -> None:
    for host in start_host([mobilenet_bundle], metrics_port=0):

        async def session(client):
            await asyncio.gather(*(infer(client, bundle.id, EARLY, cut(bundle, EARLY, 1, seed=i)) for i in range(3)))
            await infer(client, bundle.id, LATE, cut(bundle, LATE, 2))
            await infer(client, bundle.id, "features_99", cut(bundle, LATE, 1))  # unknown_split
            await client.ping()
            await asyncio.gather(client.request({"op": "reboot"}, 5.0), return_exceptions=True)  # bad_request
            await asyncio.gather(client.request({"op": "infer"}, 5.0), return_exceptions=True)  # bad_request: no tensor
            stats = (await client.stats())["stats"]
            return stats, await asyncio.to_thread(scrape, host)  # connection still open

        stats, text = run_with_client(host, session)
        assert host.server.metrics.server_address[0] == "127.0.0.1"  # --metrics-interface's default
    scraped = stats_from(text_string_to_metric_families(text))
    assert scraped == stats  # one source: the scrape, parsed, is the stats reply

    assert {op: n for op, n in stats["requests"].items() if n} == {"hello": 1, "infer": 6, "ping": 1, "stats": 1, "other": 1}
    assert {code: n for code, n in stats["errors"].items() if n} == {"unknown_split": 1, "bad_request": 2}
    assert (stats["connections"], stats["in_flight"], stats["queue_depth"]) == (1, 0, 0)
    per_split = {f"{bundle.id}/{EARLY}": 3, f"{bundle.id}/{LATE}": 1}
    for name in ("queue_seconds", "compute_seconds", "host_seconds"):
        assert {k: h["count"] for k, h in stats[name].items()} == per_split, name
        assert all(h["buckets"]["+Inf"] == h["count"] for h in stats[name].values())
    assert stats["batch_size"]["sum"] == 5  # samples: 3 single requests and one of 2
    assert 2 <= stats["batch_size"]["count"] <= 4
    assert set(stats["tail_ms_mean"]) == set(per_split) and all(ms > 0 for ms in stats["tail_ms_mean"].values())
    # Each request's host time covers its own queue and compute time.
    for key in per_split:
        assert stats["host_seconds"][key]["sum"] >= stats["compute_seconds"][key]["sum"] + stats["queue_seconds"][key]["sum"]
    assert "# TYPE splitedge_host_queue_seconds histogram" in text


def test_unknown_ops_share_one_label(host) -> None:
    """A peer inventing op names cannot grow the registry: they all count as ``other``."""

    async def session(client):
        for i in range(20):
            await asyncio.gather(client.request({"op": f"made-up-{i}"}, 5.0), return_exceptions=True)
        return (await client.stats())["stats"]

    stats = run_with_client(host, session)
    assert stats["requests"]["other"] == 20
    assert set(stats["requests"]) == {*OPS, "other"}
