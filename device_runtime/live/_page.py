"""The live pages themselves: one HTML document each, style and script inline.

Nothing is loaded from elsewhere (the board may be offline, and the server's Content-Security-
Policy forbids it): figures are drawn on canvases by the small script here. :func:`page` wraps a
page's body and script in the shared shell: the style, the connection to ``/events`` (with the
page's token), and :js:`chart`, which draws time series with labelled horizontal marks. A page
keeps what it draws in arrays it prunes to the last minute, so it can stay open for days.
"""

from __future__ import annotations

import html

__all__ = ["BOARD_PAGE", "page"]

_STYLE = """
body { font: 14px system-ui, sans-serif; margin: 0; background: #f6f7f9; color: #1d2330; }
header { background: #1d2330; color: #fff; padding: 8px 16px; display: flex; gap: 16px; align-items: baseline; }
header h1 { font-size: 16px; margin: 0; }
#status.ok { color: #7ee08a; } #status.bad { color: #ff9c8a; }
main { padding: 12px 16px; display: grid; gap: 12px; grid-template-columns: repeat(auto-fit, minmax(420px, 1fr)); }
section { background: #fff; border: 1px solid #dde1e8; border-radius: 6px; padding: 10px 12px; }
section h2 { font-size: 13px; text-transform: uppercase; letter-spacing: .04em; color: #5b6475; margin: 0 0 8px; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: 3px 12px; margin: 0; }
dt { color: #5b6475; } dd { margin: 0; font-variant-numeric: tabular-nums; }
table { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; }
th, td { text-align: right; padding: 2px 6px; border-bottom: 1px solid #eef0f4; }
th:first-child, td:first-child { text-align: left; }
canvas { width: 100%; height: 220px; display: block; }
img#frame { max-width: 100%; image-rendering: auto; background: #e9ecf1; min-height: 120px; display: block; }
.big { font-size: 22px; font-weight: 600; }
.muted { color: #8a93a5; }
"""

_SCRIPT = r"""
'use strict';
const TOKEN = new URLSearchParams(location.search).get('token');
const COLORS = ['#2f6fdf', '#e0752d', '#2aa876', '#b8442f', '#8a5cd0', '#6b7385'];

function withToken(path) { return TOKEN ? path + '?token=' + encodeURIComponent(TOKEN) : path; }

function text(id, value) {
  const el = document.getElementById(id);
  const shown = value === null || value === undefined ? '—' : String(value);
  if (el.textContent !== shown) el.textContent = shown;
}

// An axis label: whole numbers from 100 up, two significant digits below.
function num(value) { return Math.abs(value) >= 100 ? value.toFixed(0) : String(Number(value.toPrecision(2))); }

function fixed(value, digits) { return value === null || value === undefined ? '—' : Number(value).toFixed(digits); }

function mbit(bps) {
  if (bps === null || bps === undefined) return '—';
  if (bps === 0) return '0';  // a cell's open lower end
  return bps >= 1e9 ? (bps / 1e9).toPrecision(3) + ' Gbit/s' : bps >= 1e6 ? (bps / 1e6).toPrecision(3) + ' Mbit/s'
       : (bps / 1e3).toPrecision(3) + ' kbit/s';
}

// The state as Server-Sent Events; the browser reconnects by itself, sending the last id it had.
function connect(onState) {
  const source = new EventSource(withToken('events'));
  source.onmessage = (event) => {
    text('status', 'live'); document.getElementById('status').className = 'ok';
    onState(JSON.parse(event.data));
  };
  source.onerror = () => { text('status', 'reconnecting…'); document.getElementById('status').className = 'bad'; };
}

// Drop the items older than `keepS` before `now` (and any past `most`), in one splice.
function prune(items, now, keepS, most) {
  let first = Math.max(items.length - most, 0);
  while (first < items.length && items[first].t < now - keepS) first++;
  if (first > 0) items.splice(0, first);
}

// Time series on a canvas: series [{name, points: [[t, y], ...]}], x from now - spanS to now,
// y linear or log, marks [{y, label}] drawn as dashed lines. The canvas counts its points and
// redraws (data-points, data-draws) so a test can see it move.
function chart(canvas, series, opts) {
  const ratio = window.devicePixelRatio || 1, width = canvas.clientWidth || 600, height = canvas.clientHeight || 220;
  if (canvas.width !== Math.round(width * ratio)) { canvas.width = Math.round(width * ratio); canvas.height = Math.round(height * ratio); }
  const g = canvas.getContext('2d');
  g.setTransform(ratio, 0, 0, ratio, 0, 0);
  g.clearRect(0, 0, width, height);
  const left = 56, right = width - 8, top = 18, bottom = height - 20;
  const f = opts.log ? (v) => Math.log10(Math.max(v, 1e-9)) : (v) => v;
  let lo = Infinity, hi = -Infinity, count = 0;
  for (const s of series) for (const p of s.points) { if (p[1] === null) continue; lo = Math.min(lo, f(p[1])); hi = Math.max(hi, f(p[1])); count++; }
  for (const m of opts.marks || []) { lo = Math.min(lo, f(m.y)); hi = Math.max(hi, f(m.y)); }
  if (opts.zero) lo = Math.min(lo, 0);
  if (!isFinite(lo)) { lo = 0; hi = 1; }
  if (hi - lo < 1e-9) { hi = lo + (opts.log ? 1 : Math.max(Math.abs(lo), 1)); }
  const pad = (hi - lo) * 0.08; lo -= opts.zero && lo === 0 ? 0 : pad; hi += pad;
  const x = (t) => left + (right - left) * (1 - (opts.now - t) / opts.spanS);
  const y = (v) => bottom - (bottom - top) * (f(v) - lo) / (hi - lo);
  g.strokeStyle = '#dde1e8'; g.fillStyle = '#5b6475'; g.font = '11px system-ui, sans-serif'; g.lineWidth = 1;
  g.beginPath(); g.moveTo(left, top); g.lineTo(left, bottom); g.lineTo(right, bottom); g.stroke();
  for (let k = 0; k <= 4; k++) {
    const v = lo + (hi - lo) * k / 4, value = opts.log ? Math.pow(10, v) : v;
    g.fillText(opts.format(value), 2, bottom - (bottom - top) * k / 4 + 4);
  }
  g.fillText('-' + opts.spanS + ' s', left, height - 4); g.fillText('now', right - 22, height - 4);
  g.setLineDash([5, 4]); g.strokeStyle = '#9aa3b5';
  for (const m of opts.marks || []) {
    const yy = y(m.y); g.beginPath(); g.moveTo(left, yy); g.lineTo(right, yy); g.stroke();
    g.fillText(m.label, left + 4, yy - 3);
  }
  g.setLineDash([]); g.lineWidth = 1.5;
  series.forEach((s, i) => {
    g.strokeStyle = COLORS[i % COLORS.length]; g.beginPath(); let pen = false;
    for (const p of s.points) {
      if (p[1] === null || p[0] < opts.now - opts.spanS) { pen = false; continue; }
      if (pen) g.lineTo(x(p[0]), y(p[1])); else g.moveTo(x(p[0]), y(p[1]));
      pen = true;
    }
    g.stroke();
    g.fillStyle = COLORS[i % COLORS.length]; g.fillText(s.name, left + 8 + i * 90, 11);
  });
  canvas.dataset.points = count;
  canvas.dataset.marks = (opts.marks || []).length;
  canvas.dataset.draws = Number(canvas.dataset.draws || 0) + 1;
}

function percentile(sorted, q) { return sorted.length ? sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] : null; }
"""


def page(title: str, body: str, script: str) -> str:
    """One live page: the shared style and script, ``body`` (HTML) and ``script`` (run last)."""
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><meta name=viewport content='width=device-width'>"
            f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>"
            f"<header><h1>{html.escape(title)}</h1><span id=status class=bad>connecting…</span>"
            f"<span id=clock class=muted></span></header>{body}"
            f"<script>{_SCRIPT}\n{script}</script></body></html>")


_BOARD_BODY = """
<main>
<section><h2>Latest frame</h2>
  <img id=frame alt="the latest answered frame">
  <div id=caption class=muted>no frame yet</div>
</section>
<section><h2>Answer and split</h2>
  <div class=big><span id=label>—</span> <span id=score class=muted>—</span></div>
  <dl>
    <dt>frame</dt><dd id=index>—</dd>
    <dt>split</dt><dd id=split>—</dd>
    <dt>ran</dt><dd id=where>—</dd>
    <dt>sent</dt><dd id=sent>—</dd>
    <dt>rate estimate</dt><dd id=rate>—</dd>
    <dt>table cell</dt><dd id=cell>—</dd>
    <dt>why</dt><dd><b id=reason-kind>—</b> <span id=why></span><dl id=reason></dl></dd>
    <dt>fell back</dt><dd id=error>—</dd>
    <dt>answered</dt><dd id=fps>—</dd>
    <dt>dropped</dt><dd id=drops>—</dd>
    <dt>drop forecast</dt><dd id=forecast>—</dd>
    <dt>slowest stage</dt><dd id=bottleneck>—</dd>
  </dl>
</section>
<section><h2>Rate estimate and the table's boundaries (last minute)</h2><canvas id=rate-chart></canvas></section>
<section><h2>Stage latency, ms (last minute)</h2><canvas id=stage-chart></canvas>
  <table id=stages><thead><tr><th>stage</th><th>p50</th><th>p95</th><th>max</th></tr></thead><tbody></tbody></table>
</section>
</main>
"""

_BOARD_SCRIPT = r"""
const KEEP_S = 60, KEEP_MOST = 4096;
const STAGES = [['preprocess', 'preprocess_ms'], ['head', 'head_ms'], ['transfer', 'transfer_ms'], ['tail', 'tail_ms'],
                ['waits', 'waits_ms'], ['total', 'total_ms']];
let frames = [], run = null, plan = null, dropState = null, lastSeq = -1, now = 0, shownIndex = null, loading = false, pictureUrl = null;

connect((state) => {
  if (state.run !== run) { frames = []; run = state.run; lastSeq = -1; }
  plan = state.plan; dropState = state.drops;
  for (const f of state.frames) if (f.seq > lastSeq) { frames.push(f); lastSeq = f.seq; }
  now = state.now;
  prune(frames, now, KEEP_S, KEEP_MOST);
  render();
});

// The cell of the table the rate falls in: its split and the boundaries around it (the reason's
// own where it names one: the table may have been rebuilt with this run's head times).
// A reason's cell is that of the split it names (`wanted`: what the table wanted, held off), else of the split that ran.
function cell(rate, reason, ran) {
  if (reason && reason.lo_bps !== undefined) return {split: reason.wanted || ran, low: reason.lo_bps, high: reason.hi_bps === undefined ? null : reason.hi_bps};
  if (!plan || rate === null) return null;
  let low = plan.rates_bps[0], high = null, split = plan.first;
  for (const [boundary, below, above] of plan.boundaries) {
    if (rate >= boundary) { low = boundary; split = above; } else { high = boundary; break; }
  }
  return {split, low, high};
}

function render() {
  const answered = frames.filter((f) => !f.dropped);
  const latest = answered[answered.length - 1];
  text('clock', frames.length ? 'frame #' + frames[frames.length - 1].index : '');
  if (latest) {
    text('label', latest.label); text('score', fixed(latest.probability, 3));
    text('index', '#' + latest.index + ' ' + latest.name);
    text('split', latest.split);
    text('where', latest.where === 'remote' ? 'on ' + latest.host : 'here (the board)');
    text('sent', latest.where === 'remote' ? latest.bytes.toLocaleString('en') + ' bytes a frame' : 'nothing');
    text('rate', mbit(latest.rate_bps));
    const c = cell(latest.rate_bps, latest.reason, latest.split);
    text('cell', c ? c.split + ' for ' + mbit(c.low) + ' – ' + (c.high === null ? '∞' : mbit(c.high))
                   + (plan ? ' (batch ' + plan.batch + ')' : '')
                   : (plan ? 'no rate estimate yet' : 'no table: a fixed split'));
    reason(latest.reason);
    text('why', latest.why);
    text('error', latest.error);
  }
  const recent = answered.filter((f) => f.t >= now - 10);
  text('fps', answered.length + ' in the last minute; ' + (recent.length / 10).toFixed(1) + ' fps over 10 s');
  const dropped = frames.length - answered.length;
  text('drops', dropped + ' of ' + frames.length + ' in the last minute' + (frames.length ? ' (' + (100 * dropped / frames.length).toFixed(1) + ' %)' : ''));
  showForecast();
  const marks = plan ? plan.boundaries.map(([rate, below, above]) => ({y: rate, label: below + ' | ' + above + ' ' + mbit(rate)})) : [];
  chart(document.getElementById('rate-chart'), [{name: 'rate estimate', points: answered.map((f) => [f.t, f.rate_bps])}],
        {now, spanS: KEEP_S, log: true, marks, format: mbit});
  chart(document.getElementById('stage-chart'), STAGES.map(([name, key]) => ({name, points: answered.map((f) => [f.t, f[key]])})),
        {now, spanS: KEEP_S, zero: true, format: num});
  const rows = STAGES.map(([name, key]) => {
    const sorted = answered.map((f) => f[key]).sort((a, b) => a - b);
    return '<tr><td>' + name + '</td><td>' + fixed(percentile(sorted, 0.5), 2) + '</td><td>' + fixed(percentile(sorted, 0.95), 2)
         + '</td><td>' + fixed(sorted[sorted.length - 1], 2) + '</td></tr>';
  });
  const body = document.querySelector('#stages tbody'), table = rows.join('');
  if (body.innerHTML !== table) body.innerHTML = table;  // numbers and fixed stage names only
  caption();
  if (latest && latest.index !== shownIndex && !loading) picture();
}

// The run's drop share so far against the share its recent stage times forecast, and the stage
// behind them: as text only (the cause is the board's words, never markup).
function showForecast() {
  const f = dropState ? dropState.forecast : null;
  const real = dropState && dropState.drop_share !== null ? (100 * dropState.drop_share).toFixed(1) + ' % dropped in the run so far' : null;
  text('forecast', f ? (100 * f.drop_share).toFixed(0) + ' % forecast from the last ' + f.measured_frames + ' answered'
                       + (real ? '; ' + real : '') : real);
  text('bottleneck', f ? f.cause : null);
}

// The picture's frame as the page's records have it: a picture can come before the state that
// answers its frame (the board encodes the latest result at once), and is captioned when that comes.
function caption() {
  if (shownIndex === null) return;
  const f = frames.find((r) => r.index === shownIndex && !r.dropped);
  text('caption', '#' + shownIndex + (f ? ': ' + f.label + ' ' + fixed(f.probability, 3) + ', split ' + f.split : ''));
}

// Whatever reason the stream gave: its kind first, then each field.
function reason(value) {
  const list = document.getElementById('reason');
  if (value === null || typeof value !== 'object') { text('reason-kind', value); list.replaceChildren(); return; }
  text('reason-kind', value.kind === undefined ? '' : value.kind);
  const items = [];
  for (const [key, field] of Object.entries(value)) {
    if (key === 'kind') continue;
    const dt = document.createElement('dt'), dd = document.createElement('dd');
    dt.textContent = key;
    dd.textContent = typeof field === 'number' && /rate|bps/.test(key) ? mbit(field) : typeof field === 'object' ? JSON.stringify(field) : String(field);
    items.push(dt, dd);
  }
  const shown = items.map((e) => e.textContent).join('|');
  if (list.dataset.shown !== shown) { list.replaceChildren(...items); list.dataset.shown = shown; }
}

// The latest answered frame, fetched when a newer one is answered (the board encodes at most 5 a second).
function picture() {
  loading = true;
  fetch(withToken('frame.jpg'), {cache: 'no-store'}).then((response) => {
    if (response.status !== 200) return null;
    const index = Number(response.headers.get('X-Frame-Index'));
    return response.blob().then((blob) => {
      const img = document.getElementById('frame'), url = URL.createObjectURL(blob);
      img.onload = () => { if (pictureUrl) URL.revokeObjectURL(pictureUrl); pictureUrl = url; };
      img.src = url; img.dataset.index = index; shownIndex = index;
      caption();
    });
  }).catch(() => null).finally(() => { setTimeout(() => { loading = false; }, 200); });
}
"""

BOARD_PAGE = page("splitedge · board", _BOARD_BODY, _BOARD_SCRIPT)
