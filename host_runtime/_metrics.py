"""The host's figures, kept once in a Prometheus registry and read two ways.

``--metrics-port`` serves the registry as Prometheus text (:mod:`host_runtime._metrics_http`: one
thread, bounded connections and deadlines, one render a second, a token off loopback); the
``stats`` op returns :func:`stats_from` applied to the same registry. The two cannot drift apart: there is no second set of counters, and :func:`stats_from` reads a
scrape parsed by ``prometheus_client.parser`` into exactly the dict ``stats`` returns.

Label values come only from closed sets (the protocol's ops and error codes, the tails this
host serves), so a peer sending made-up op names cannot grow the registry without bound.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any, Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from device_runtime.wire.ops import ERROR_CODES, OPS
from host_runtime._metrics_http import MetricsEndpoint

__all__ = ["PREFIX", "HostStats", "MetricsEndpoint", "stats_from"]

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
        self._latencies = _Latencies()
        self.registry.register(self._latencies)  # type: ignore[arg-type]  # a collector is anything with collect()

    def request(self, op: object) -> None:
        self._per_op[op if op in OPS else OTHER_OP].inc()

    def error(self, code: str) -> None:
        self.errors.labels(code).inc()

    def served(self, key: tuple[str, str], queue_s: float, compute_s: float, host_s: float) -> None:
        """One answered infer request of tail ``key`` = (bundle, split)."""
        self._latencies.observe(key, queue_s, compute_s, host_s)

    def as_dict(self) -> dict[str, Any]:
        """What the ``stats`` op returns: :func:`stats_from` over this registry."""
        return stats_from(self.registry.collect())

    def serve_http(self, address: str, port: int, **options: Any) -> MetricsEndpoint:
        """Serve the registry as Prometheus text on ``address:port`` (port 0 picks a free one);
        ``options``: :class:`~host_runtime._metrics_http.MetricsEndpoint`'s (``token``, bounds)."""
        return MetricsEndpoint(lambda: generate_latest(self.registry), address, port, **options)


#: The per-tail latency histograms: name, help (what :class:`_Latencies` keeps, in this order).
_LATENCIES = (
    (PREFIX + "queue_seconds", "Request fully received to its batch starting."),
    (PREFIX + "compute_seconds", "Tail time of the batch a request ran in."),
    (PREFIX + "host_seconds", "Request fully received to its reply written."),
)
_LATENCY_LES = [*(floatToGoString(bound) for bound in LATENCY_BUCKETS), "+Inf"]


class _Latencies:
    """The per-tail latency histograms, counted in plain lists by the event loop, read as Prometheus
    histograms when collected (the same families, labels and buckets as prometheus_client's).

    prometheus_client's ``Histogram.observe`` takes a lock twice and walks the buckets in Python:
    three of them cost a host 2.4 µs a request, a fifth of what it does for one beside the framing
    (issue 32). Here a request costs three bisects and six additions. A scrape from the metrics
    thread reads the lists while the loop adds to them: each histogram's count is the sum of the
    buckets it read, so a histogram is always whole; its sum may be one request ahead or behind.
    """

    def __init__(self) -> None:
        # (bundle, split) -> [queue, compute, host]: each [bucket counts..., +Inf count, sum]
        self._tails: dict[tuple[str, str], list[list[float]]] = {}

    def observe(self, key: tuple[str, str], queue_s: float, compute_s: float, host_s: float) -> None:
        tail = self._tails.get(key)
        if tail is None:  # the keys are the tails served: bounded by the registry
            tail = self._tails[key] = [[0] * (len(LATENCY_BUCKETS) + 1) + [0.0] for _ in _LATENCIES]
        queue, compute, host = tail
        queue[bisect_left(LATENCY_BUCKETS, queue_s)] += 1
        queue[-1] += queue_s
        compute[bisect_left(LATENCY_BUCKETS, compute_s)] += 1
        compute[-1] += compute_s
        host[bisect_left(LATENCY_BUCKETS, host_s)] += 1
        host[-1] += host_s

    def collect(self) -> Iterable[Metric]:
        tails = list(self._tails.items())
        for index, (name, documentation) in enumerate(_LATENCIES):
            family = HistogramMetricFamily(name, documentation, labels=["bundle", "split"])
            for key, histograms in tails:
                counts = list(histograms[index])
                cumulative, buckets = 0, []
                for le, count in zip(_LATENCY_LES, counts):
                    cumulative += count
                    buckets.append((le, cumulative))
                family.add_metric(list(key), buckets, counts[-1])
            yield family


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
