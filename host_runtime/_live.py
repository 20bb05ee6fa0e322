"""``split-host serve --live [ADDRESS:]PORT``: the host's live page, on the board's page server.

What it shows is read from what the host already keeps, when a page asks (at most twice a
second whatever the number of pages: the page server caches a state for a period, and so does
:class:`HostLive`, whose every state is news): the connections :class:`~host_runtime._server.HostServer` holds (each board's
address, the tails it asked for, its requests in flight, how long it has been connected and
silent) and the figures of its Prometheus registry (:mod:`host_runtime._metrics`): the queue,
requests in flight, batches and their sizes, deadlines missed, refusals, each tail's queue and
compute times. Nothing is counted twice and nothing runs on the host's event loop: the page
reads in the page server's thread. A host with a thousand boards connected lists the
:data:`BOARDS_SHOWN` most recently heard from, and says how many there are (issue 45: the whole
list, for every poll, raised a host's infer p99 8.6x).
"""

from __future__ import annotations

import heapq
import operator
import time
from dataclasses import replace
from typing import Any

from device_runtime.live import LIVE_WALLS, LiveServer, page, parse_live_address
from host_runtime._metrics_http import MAX_DUTY
from host_runtime._server import HostServer

__all__ = ["BOARDS_SHOWN", "HOST_PAGE", "HOST_WALLS", "HostLive", "serve_live"]

#: Boards listed on the page, the most recently heard from (the count says how many are connected).
BOARDS_SHOWN = 100
#: A state is read from the host at most this often, however many pages and streams ask: a read
#: holds the GIL the host's event loop needs for ~3 ms with 1,000 boards connected, and a page's
#: one-minute charts lose nothing at two points a second (at ten, the page with 1,000 boards and
#: 20 pollers raised a loaded host's infer p99 by a median 35 %: docs/benchmarks.md, issue 45).
STATE_EVERY_S = 0.5
#: The host's page walls: the board's page's, at the host's watchers' share of a core
#: (:data:`host_runtime._metrics_http.MAX_DUTY`, 2 % against the board's 5 %).
HOST_WALLS = replace(LIVE_WALLS, max_duty=MAX_DUTY)
_LAST_READ = operator.attrgetter("activity.last_read")  # in C: 1,000 boards ranked without a Python call each


class HostLive:
    """The host as its live page sees it (a :class:`device_runtime.live.LiveSource`)."""

    def __init__(self, server: HostServer, clock: Any = time.monotonic) -> None:
        self.server = server
        self.clock = clock
        self.started = time.time()  # tells a page a new host from a reconnect
        self._states = 0
        self._last: tuple[float, dict[str, Any]] | None = None

    def state(self, since: int | None) -> tuple[dict[str, Any], int]:
        """The host now: every state is news (its figures move), so the cursor counts the states
        read; one is read at most every :data:`STATE_EVERY_S`, whatever ``since``."""
        now = self.clock()
        if self._last is None or not 0 <= now - self._last[0] < STATE_EVERY_S:
            self._last = (now, self._read(now))
            self._states += 1
        return self._last[1], self._states

    def _read(self, monotonic: float) -> dict[str, Any]:
        stats = self.server.stats.as_dict()
        now = self.server.clock()
        errors = stats["errors"]
        batches = stats["batch_size"]
        connections = list(self.server.connections)  # the event loop's set, copied once
        shown = heapq.nlargest(BOARDS_SHOWN, connections, key=_LAST_READ)
        return {
            "run": self.started, "now": monotonic, "connections": len(connections),
            "boards": [_board(c, now) for c in sorted(shown, key=lambda c: c.activity.opened)],
            "queue_depth": stats["queue_depth"], "in_flight": stats["in_flight"],
            "batches": batches["count"], "samples": batches["sum"], "padded": stats["padded_samples"],
            "deadlines_missed": errors["deadline_exceeded"], "overloaded": errors["overloaded"],
            "errors": {code: n for code, n in errors.items() if n},
            "answered": sum(h["count"] for h in stats["host_seconds"].values()),
            "tails": [
                {"tail": key, "answered": h["count"], "queue_ms": 1000.0 * stats["queue_seconds"][key]["sum"] / h["count"],
                 "compute_ms": 1000.0 * h["sum"] / h["count"]}
                for key, h in sorted(stats["compute_seconds"].items()) if h["count"]
            ],
            "device": self.server.registry.device,
        }

    def picture(self) -> None:
        """The host has no camera: its page shows none."""


def _board(connection: Any, now: float) -> dict[str, Any]:
    transport = connection.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    address = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else connection.address
    return {"address": address, "splits": dict(connection.splits), "in_flight": connection.in_flight,
            "connected_s": now - connection.activity.opened, "silent_s": now - connection.activity.last_read}


def serve_live(server: HostServer, where: str, key: bytes | None = None) -> LiveServer:
    """The host's page on ``where`` (``[ADDRESS:]PORT``: 127.0.0.1 unless an address is given),
    asking for the token of ``key`` when the host has one (``--key-file``)."""
    address, port = parse_live_address(where)
    return LiveServer(HostLive(server), HOST_PAGE, address, port, key, walls=HOST_WALLS)


_BODY = """
<main>
<section><h2>Host</h2>
  <dl>
    <dt>boards connected</dt><dd id=connections>—</dd>
    <dt>queue</dt><dd id=queue>—</dd>
    <dt>in flight</dt><dd id=in-flight>—</dd>
    <dt>batches</dt><dd id=batches>—</dd>
    <dt>answered</dt><dd id=answered>—</dd>
    <dt>deadlines missed</dt><dd id=missed>—</dd>
    <dt>refused, overloaded</dt><dd id=overloaded>—</dd>
    <dt>other errors</dt><dd id=errors>—</dd>
    <dt>tails run on</dt><dd id=device>—</dd>
  </dl>
</section>
<section><h2>Boards</h2>
  <table id=boards><thead><tr><th>board</th><th>splits (requests)</th><th>in flight</th><th>connected</th><th>silent</th></tr></thead>
  <tbody></tbody></table>
</section>
<section><h2>Queue and requests in flight (last minute)</h2><canvas id=queue-chart></canvas></section>
<section><h2>Batches a second, mean batch, deadlines missed a second (last minute)</h2><canvas id=batch-chart></canvas>
  <table id=tails><thead><tr><th>tail</th><th>answered</th><th>queue ms</th><th>compute ms</th></tr></thead><tbody></tbody></table>
</section>
</main>
"""

_SCRIPT = r"""
const KEEP_S = 60, KEEP_MOST = 1200;
let samples = [], run = null;

function cells(row) { const tr = document.createElement('tr'); for (const v of row) { const td = document.createElement('td'); td.textContent = v; tr.appendChild(td); } return tr; }

function rows(id, values) {
  const body = document.querySelector('#' + id + ' tbody');
  body.replaceChildren(...values.map((v) => { const tr = cells(v.row); tr.dataset.key = v.key; return tr; }));
}

connect((state) => {
  if (state.run !== run) { samples = []; run = state.run; }
  samples.push({t: state.now, queue: state.queue_depth, in_flight: state.in_flight, batches: state.batches,
                samples: state.samples, missed: state.deadlines_missed});
  prune(samples, state.now, KEEP_S, KEEP_MOST);
  text('connections', state.connections + (state.connections > state.boards.length ? ' (' + state.boards.length + ' most recently heard from listed)' : '')); text('queue', state.queue_depth + ' samples'); text('in-flight', state.in_flight);
  text('batches', state.batches + (state.batches ? ', ' + (state.samples / state.batches).toFixed(2) + ' samples each' : '')
       + (state.padded ? ', ' + state.padded + ' padding rows' : ''));
  text('answered', state.answered); text('missed', state.deadlines_missed); text('overloaded', state.overloaded);
  const others = Object.entries(state.errors).filter(([code]) => code !== 'deadline_exceeded' && code !== 'overloaded');
  text('errors', others.length ? others.map(([code, n]) => code + ' ' + n).join(', ') : 'none');
  text('device', state.device);
  rows('boards', state.boards.map((b) => ({key: b.address, row: [
    b.address, Object.entries(b.splits).map(([split, n]) => split + ' (' + n + ')').join(', ') || 'none yet', b.in_flight,
    b.connected_s.toFixed(0) + ' s', b.silent_s.toFixed(1) + ' s']})));
  rows('tails', state.tails.map((t) => ({key: t.tail, row: [t.tail, t.answered, t.queue_ms.toFixed(2), t.compute_ms.toFixed(2)]})));
  chart(document.getElementById('queue-chart'), [
    {name: 'queue', points: samples.map((s) => [s.t, s.queue])}, {name: 'in flight', points: samples.map((s) => [s.t, s.in_flight])},
  ], {now: state.now, spanS: KEEP_S, zero: true, format: num});
  // Rates over one second: each sample against the first one at least a second older.
  const per = [], mean = [], missed = [];
  let j = 0;
  for (let i = 0; i < samples.length; i++) {
    while (j < i && samples[i].t - samples[j + 1].t >= 1) j++;
    const a = samples[j], b = samples[i], dt = b.t - a.t;
    if (dt < 1) continue;
    per.push([b.t, (b.batches - a.batches) / dt]); missed.push([b.t, (b.missed - a.missed) / dt]);
    mean.push([b.t, b.batches > a.batches ? (b.samples - a.samples) / (b.batches - a.batches) : null]);
  }
  chart(document.getElementById('batch-chart'), [{name: 'batches/s', points: per}, {name: 'mean batch', points: mean},
        {name: 'missed/s', points: missed}], {now: state.now, spanS: KEEP_S, zero: true, format: num});
});
"""

HOST_PAGE = page("splitedge · host", _BODY, _SCRIPT)
