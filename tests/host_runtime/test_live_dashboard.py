"""docs/grafana-host-dashboard.json: a Grafana dashboard model whose every query names metrics, and
labels, that a real host exports: scraped from a host on 127.0.0.1 that has answered a board."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from device_runtime.bundle import Bundle
from device_runtime.link import HostClient
from tests.conftest import TEST_SPLITS, RunningHost, start_host

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-host-dashboard.json"
METRIC = re.compile(r"\bsplitedge_host_[a-z_]+\b")
#: ``by (a, b)`` and ``{a="..."}`` / ``{a=~"..."}``: the labels a query groups or selects by.
BY = re.compile(r"\bby \(([^)]*)\)")
MATCHER = re.compile(r"([a-z_]+)=~?\"([^\"]*)\"")
#: Labels Prometheus adds when it scrapes (not the host's own).
SCRAPE_LABELS = {"instance", "job"}


def _panels() -> list[dict[str, Any]]:
    return json.loads(DASHBOARD.read_text())["panels"]


def test_the_dashboard_is_a_grafana_model() -> None:
    model = json.loads(DASHBOARD.read_text())
    assert model["uid"] and model["title"] and model["schemaVersion"] >= 30
    variables = {v["name"]: v for v in model["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource" and variables["instance"]["type"] == "query"
    panels = model["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
        assert panel["targets"] and len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])
    # No two panels overlap on the grid.
    cells = [(p["gridPos"]["x"] + dx, p["gridPos"]["y"] + dy) for p in panels
             for dx in range(p["gridPos"]["w"]) for dy in range(p["gridPos"]["h"])]
    assert len(cells) == len(set(cells))


def test_every_query_names_what_a_real_host_exports(mobilenet_bundle: Path) -> None:
    manifest = Bundle.load(mobilenet_bundle, roles=()).manifest
    spec = manifest.split(TEST_SPLITS[-1]).tensor
    for host in start_host([mobilenet_bundle], metrics_port=0):
        async def answer_a_board(host: RunningHost = host) -> None:  # labelled histograms need a tail's answer
            client = await HostClient.connect(host.host, host.port)
            try:
                await client.infer(manifest.bundle_id, TEST_SPLITS[-1], np.zeros((1, *spec.shape), dtype=spec.dtype))
            finally:
                await client.close()

        host.call(answer_a_board)
        with urllib.request.urlopen(f"http://127.0.0.1:{host.server.metrics.port}/metrics", timeout=10) as scrape:
            text = scrape.read().decode()
    labels: dict[str, set[str]] = {}
    values: dict[tuple[str, str], set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
            for label, value in sample.labels.items():
                values.setdefault((sample.name, label), set()).add(value)
    queries = [(p["title"], t["expr"]) for p in _panels() for t in p["targets"]]
    assert len(queries) > 10
    for title, expr in queries:
        names = METRIC.findall(expr)
        assert names, f"{title}: {expr} names no splitedge metric"
        for name in names:
            assert name in labels, f"{title}: {name} is not exported by the host (it exports {sorted(labels)})"
        grouped = {label.strip() for group in BY.findall(expr) for label in group.split(",")} - SCRAPE_LABELS
        assert grouped <= set().union(*(labels[n] for n in names)), f"{title}: grouped by {grouped}"
        for label, value in MATCHER.findall(expr):
            if label in SCRAPE_LABELS:
                continue
            assert any(value in values.get((n, label), ()) for n in names), f"{title}: {label}={value!r} never exported"
