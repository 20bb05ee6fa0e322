"""The host's figures, kept once in a Prometheus registry and read two ways.

``--metrics-port`` serves the registry as Prometheus text (prometheus_client's own HTTP
server); the ``stats`` op returns :func:`stats_from` applied to the same registry. The two
cannot drift apart: there is no second set of counters, and :func:`stats_from` reads a
scrape parsed by ``prometheus_client.parser`` into exactly the dict ``stats`` returns.

Label values come only from closed sets (the protocol's ops and error codes, the tails this
host serves), so a peer sending made-up op names cannot grow the registry without bound.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterable
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.metrics_core import Metric

from device_runtime.wire import ERROR_CODES, OPS

PREFIX = "splitedge_host_"
#: The label an op outside :data:`OPS` is counted under.
OTHER_OP = "other"
#: Host-side latencies: a tail runs in ~1 ms on a GPU, a queue can hold a second or more.
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
#: Samples that are counts, returned by ``stats`` as integers (sums stay floats).
_COUNT_SUFFIXES = ("_total", "_count", "_bucket")


class HostStats:
    """Every figure the host reports; gauges read the server's live state when collected."""

    def __init__(self, connections: Callable[[], int], in_flight: Callable[[], int], queue_depth: Callable[[], int]) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(PREFIX + "requests", "Requests received, by op (unknown ops as 'other').",
                                ["op"], registry=self.registry)
        self.errors = Counter(PREFIX + "errors", "Error replies sent, by code.", ["code"], registry=self.registry)
        # Present at 0 from the start (a rate needs its first sample), and looked up once.
        self._per_op = {op: self.requests.labels(op) for op in (*OPS, OTHER_OP)}
        for code in ERROR_CODES:
            self.errors.labels(code)
        gauges = (
            ("connections", "Open device connections.", connections),
            ("in_flight", "infer requests admitted and not yet answered (queued or running).", in_flight),
            ("queue_depth", "Samples waiting for a worker, all tails together.", queue_depth),
        )
        for name, doc, read in gauges:
            Gauge(PREFIX + name, doc, registry=self.registry).set_function(read)
        self.batch_size = Histogram(PREFIX + "batch_size", "Samples per tail run (one observation per batch).",
                                    buckets=BATCH_BUCKETS, registry=self.registry)
        self.padded_samples = Counter(PREFIX + "padded_samples", "Zero rows tail runs were padded with up to their "
                                      "bucket (--buckets); computed, then dropped.", registry=self.registry)
        per_split = ["bundle", "split"]
        self.queue_seconds = Histogram(PREFIX + "queue_seconds", "Request fully received to its batch starting.",
                                       per_split, buckets=LATENCY_BUCKETS, registry=self.registry)
        self.compute_seconds = Histogram(PREFIX + "compute_seconds", "Tail time of the batch a request ran in.",
                                         per_split, buckets=LATENCY_BUCKETS, registry=self.registry)
        self.host_seconds = Histogram(PREFIX + "host_seconds", "Request fully received to its reply written.",
                                      per_split, buckets=LATENCY_BUCKETS, registry=self.registry)
        self._per_tail: dict[tuple[str, str], tuple[Histogram, ...]] = {}

    def request(self, op: object) -> None:
        self._per_op[op if op in OPS else OTHER_OP].inc()

    def error(self, code: str) -> None:
        self.errors.labels(code).inc()

    def served(self, key: tuple[str, str], queue_s: float, compute_s: float, host_s: float) -> None:
        """One answered infer request of tail ``key`` = (bundle, split)."""
        per_tail = self._per_tail.get(key)
        if per_tail is None:  # ``labels()`` takes a lock and builds a key: once per tail, not per request
            per_tail = self._per_tail[key] = tuple(h.labels(*key) for h in (self.queue_seconds, self.compute_seconds,
                                                                            self.host_seconds))
        for histogram, seconds in zip(per_tail, (queue_s, compute_s, host_s)):
            histogram.observe(seconds)

    def as_dict(self) -> dict[str, Any]:
        """What the ``stats`` op returns: :func:`stats_from` over this registry."""
        return stats_from(self.registry.collect())

    def serve_http(self, address: str, port: int) -> "MetricsEndpoint":
        """Serve the registry as Prometheus text on ``address:port`` (port 0 picks a free one)."""
        server, thread = start_http_server(port, address, registry=self.registry)
        return MetricsEndpoint(server, thread)


class MetricsEndpoint:
    """The running HTTP exposition; :meth:`close` stops its thread (within its 0.5 s poll)."""

    def __init__(self, server: WSGIServer, thread: threading.Thread) -> None:
        self.server = server
        self.thread = thread

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5.0)


def stats_from(families: Iterable[Metric]) -> dict[str, Any]:
    """The ``stats`` dict from metric families, collected or parsed from a scrape.

    Each family becomes one key (its name less ``splitedge_host_``). A family without labels
    is a number (a histogram: ``{count, sum, buckets: {le: cumulative count}}``); a labelled
    one is a dict keyed by its label values joined with ``/`` in label-name order (so
    ``bundle/split``). ``tail_ms_mean`` (mean compute ms per split, what a board's latency
    model needs) is derived from ``compute_seconds``.
    """
    stats: dict[str, Any] = {}
    for family in families:
        if not family.name.startswith(PREFIX) or family.name.endswith("_created"):
            continue
        name = family.name[len(PREFIX):]
        values: dict[str, Any] = {}
        for sample in family.samples:
            suffix = sample.name[len(family.name):]
            if suffix == "_created":
                continue
            labels = {k: v for k, v in sample.labels.items() if k != "le"}
            key = "/".join(labels[k] for k in sorted(labels))
            value: float | int = sample.value
            if family.type == "gauge" or suffix in _COUNT_SUFFIXES:  # every gauge here is a count
                value = int(value)
            if family.type == "histogram":
                entry = values.setdefault(key, {"count": 0, "sum": 0.0, "buckets": {}})
                if suffix == "_bucket":
                    entry["buckets"][sample.labels["le"]] = value
                else:
                    entry[suffix[1:]] = value
            else:
                values[key] = value
        stats[name] = values[""] if set(values) == {""} else values
    stats["tail_ms_mean"] = {
        key: 1000.0 * h["sum"] / h["count"] for key, h in stats.get("compute_seconds", {}).items() if h["count"]
    }
    return stats
