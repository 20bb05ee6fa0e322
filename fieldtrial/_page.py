"""``report.html``: one page with every number and picture of a report, for one run or several.

The page is self-contained: the PNGs are embedded as ``data:`` URIs and the style is inline, so
it opens offline (a field trial's laptop often is), moved or mailed alone. Everything shown is
read from the summaries the report wrote; the page computes nothing of its own.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from device_runtime import LOCAL
from fieldtrial import _timeline as timeline
from fieldtrial._bounds import ESTIMATE, REAL
from fieldtrial._plots import graph_order, readable, split_label
from fieldtrial._report import MODEL_PLOT, PLOTS
from splitedge import SplitEdgeError

if TYPE_CHECKING:
    from fieldtrial._compare import Run

__all__ = ["PAGE", "write_page"]

PAGE = "report.html"
_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 80em; color: #222; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
thead th { background: #f0f0f0; }
img { max-width: 100%; border: 1px solid #eee; margin: 0.4em 0; }
.note { color: #666; font-size: 0.85em; }
"""


def _image(path: Path) -> str:
    """``<img>`` with the PNG inline."""
    try:
        data = base64.b64encode(path.read_bytes()).decode("ascii")
    except OSError as exc:
        raise SplitEdgeError(f"cannot read the plot {path} for {PAGE}: {exc}") from exc
    return f'<img alt="{html.escape(path.name)}" src="data:image/png;base64,{data}">'


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = "".join(f"<th>{html.escape(str(h), quote=False)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c), quote=False)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{cells}</tr></thead><tbody>{body}</tbody></table>"


def _f(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def _overview(runs: Sequence[Run]) -> str:
    rows = []
    for run in runs:
        s = run.summary
        late = s["deadline_misses"]
        drops = ", ".join(f"{n} {timeline.reason_label(r)}" for r, n in s["drops_by_reason"].items()) or "none"
        rows.append([
            run.label, readable(run.path.name), s["run"]["bundle_id"], s["run"]["policy"], s["run"]["source"], s["frames"],
            s["answered"], _f(s["fps"], ".2f"), _f(s["latency_ms"]["p50"]), _f(s["latency_ms"]["p95"]),
            _f(s["latency_ms"]["p99"]), f"{s['dropped']} ({100.0 * s['drop_rate']:.1f} %): {drops}",
            "no deadline" if late is None else f"{late['missed']} of {late['with_deadline']}",
            s["split_changes"], s["deadline_refusals"], s["fallbacks"],
            _f(s["floor"]["latency_over_floor"]["median_of_ratios"], ".2f") if s["floor"] else "-",
            _f(s["oracle"]["latency_over_oracle"]["mean_of_ratios"], ".2f") if s["oracle"] else "-",
        ])
    return _table(["run", "trace", "bundle", "policy", "source", "frames", "answered", "fps", "p50 ms", "p95 ms",
                   "p99 ms", "dropped", "deadline missed", "split changes", "local after a deadline refusal",
                   "local after a host failure", "latency ÷ floor (median of ratios)", "latency ÷ oracle (mean)"],
                  rows)


def _by_split(runs: Sequence[Run]) -> str:
    order = graph_order({split for run in runs for split in run.summary["per_split"]})
    rows = []
    for split in order:
        row: list[Any] = [split_label(split)]
        for run in runs:
            row.append(_share(run.summary["per_split"].get(split)))
        rows.append(row)
        if split == LOCAL:  # its frames by why they ran here: a refusal or a failure is no choice
            causes = [c for c in timeline.LOCAL_CAUSES if any(c in run.summary["local_causes"] for run in runs)]
            rows += [["— " + timeline.local_cause_label(cause), *(_share(run.summary["local_causes"].get(cause))
                                                                  for run in runs)] for cause in causes]
    return _table(["split", *(r.label for r in runs)], rows)


def _share(s: dict[str, Any] | None) -> str:
    """A split's (or a local cause's) share of the answered frames, its p50, and a split's bytes a frame."""
    if s is None:
        return "-"
    sent = s.get("bytes_per_frame")
    return (f"{100.0 * s['share']:.1f} % ({s['frames']}), p50 {_f(s['p50_ms'])} ms"
            + ("" if not sent else f", {sent:,.0f} B a frame"))


def _reasons(runs: Sequence[Run]) -> str:
    kinds = list(dict.fromkeys(k for run in runs for k in run.summary.get("split_reasons", {})))
    if not kinds:
        return '<p class="note">No run recorded why its splits were chosen (trace schema 4 does).</p>'
    rows = []
    for kind in kinds:
        row: list[Any] = [timeline.split_reason_label(kind)]
        for run in runs:
            counts = run.summary.get("split_reasons", {})
            total = sum(counts.values())
            row.append(f"{100.0 * counts.get(kind, 0) / total:.1f} % ({counts.get(kind, 0)})" if total else "-")
        rows.append(row)
    return _table(["split chosen by", *(r.label for r in runs)], rows)


def _gains(runs: Sequence[Run]) -> str:
    gains = [run.summary.get("gain_over_static") or {} for run in runs]
    order = graph_order({split for g in gains for split in g})
    if not order:
        return ('<p class="note">No gains: a run needs its calibration (the file it recorded, or '
                '<code>--calibration</code>) and frames with a rate estimate.</p>')
    rows = [[split_label(s), *(f"{100.0 * g[s]:.1f} %" if s in g else "-" for g in gains)] for s in order]
    return _table(["against the static split", *(r.label for r in runs)], rows)


def _model(run: Run) -> str:
    comparison = run.summary.get("predicted_vs_measured")
    if not comparison:
        return '<p class="note">No comparison with the model: the report had no calibration for this run.</p>'
    rows = [
        [split_label(split), c["frames"], _f(c["predicted_ms"]), _f(c["stages_ms"]), _f(c["ratio"], ".2f"),
         _f(c["waits_ms"]["all"] if c["waits_ms"] else None), _f(c["end_to_end_ms"]), _f(c["end_to_end_ratio"], ".2f"),
         ", ".join(f"{stage} {_f(r, '.2f')}" for stage, r in c["calibrated_over_measured"].items())]
        for split, c in comparison.items()
    ]
    return _table(["split", "frames", "model ms", "stages ms", "ratio", "waits ms", "end-to-end ms", "ratio",
                   "calibrated ÷ measured, per stage"], rows)


def _bounds(run: Run) -> str:
    """The run's latencies against each frame's floor and oracle (:mod:`fieldtrial._bounds`)."""
    floor, oracle = run.summary["floor"], run.summary["oracle"]
    rows = []
    if floor is not None:
        ratio = floor["latency_over_floor"]
        rows.append(["floor: the frame's own compute", floor["frames"], floor["left_out"], _f(floor["p50_ms"]),
                     f"median of ratios {ratio['median_of_ratios']:.2f}; "
                     f"ratio of medians {ratio['ratio_of_medians']:.2f}", _rates(floor["rate"])])
    if oracle is not None:
        rows.append(["oracle: the calibration's fastest option at the link's rate", oracle["frames"],
                     oracle["left_out"], _f(oracle["p50_ms"]),
                     f"mean of ratios {oracle['latency_over_oracle']['mean_of_ratios']:.2f}", _rates(oracle["rate"])])
    note = ("" if oracle is not None else
            '<p class="note">No oracle: it needs the run\'s calibration and frames with a link rate.</p>')
    if not rows:
        return '<p class="note">No frame has a floor: none recorded its compute, or its bytes had no rate.</p>' + note
    return _table(["against", "frames", "left out", "p50 ms", "latency ÷ it", "link rate taken"], rows) + note


def _rates(rate: dict[str, int]) -> str:
    """Which rate a bound took, saying where it was the board's estimate for want of the real one."""
    if not rate[ESTIMATE]:
        return f"real ({rate[REAL]} frames)" if rate[REAL] else "none needed"
    return f"real on {rate[REAL]}, the board's estimate on {rate[ESTIMATE]} (no real rate recorded there)"


def _against_first(runs: Sequence[Run], against: Sequence[dict[str, Any]]) -> str:
    rows = [[a["label"], f"{a['same_split']} of {a['reference_answered']}", _f(a["split_agreement"], ".1%"),
             _f(a["split_agreement_answered"], ".1%"), _f(a["p50_ms"]), _f(a["p50_ratio"], ".3f")] for a in against]
    return (f"<p>Frames matched by index against <b>{html.escape(runs[0].label)}</b> (p50 "
            f"{_f(against[0]['reference_p50_ms'])} ms); a replay's fidelity target: the same split on ≥ 90 % of "
            "frames, p50 within 10 %.</p>"
            + _table(["run", "same split", "of the first's answered", "of those both answered", "p50 ms", "p50 ratio"],
                     rows))


def _sampled(run: Run) -> str:
    """Which of a run's figures were estimated from a sample of its frames (a trace longer than a
    report keeps: :data:`fieldtrial._tally.MAX_KEPT`); nothing where every frame was kept."""
    sample = run.summary.get("sample")
    if not sample or not sample["estimated"]:
        return ""
    return (f"<p class='note'>A long trace: percentiles, CDFs, the bounds, the gains, the model comparison and the "
            f"figures are estimated from a sample of {sample['frames_kept']:,} of its {sample['frames']:,} frames "
            f"(a report keeps at most {sample['cap']:,}, chosen by frame index); every count is over every "
            "frame.</p>")


def _run_figures(out_dir: Path, run: Run) -> str:
    folder = out_dir / run.folder
    names = [*PLOTS, MODEL_PLOT]
    return "".join(_image(folder / name) for name in names if (folder / name).is_file())


def write_page(
    out_dir: Path, runs: Sequence[Run], against_first: Sequence[dict[str, Any]], figures: dict[str, Path],
) -> Path:
    """Write :data:`PAGE` into ``out_dir``: the runs' tables, ``figures`` (the comparison's) and
    each run's own figures (from its report folder, ``out_dir / run.folder``)."""
    title = "field trial: " + (runs[0].label if len(runs) == 1 else " vs ".join(r.label for r in runs))
    parts = [
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p class='note'>written by splitedge's report at {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; "
        "every number is in summary.json beside this page.</p>",
        "<h2>Runs</h2>", _overview(runs),
    ]
    if against_first:
        parts += ["<h2>Against the first run</h2>", _against_first(runs, against_first)]
    parts += [_image(path) for path in figures.values()]
    parts += ["<h2>Where the frames ran</h2>", _by_split(runs), "<h2>Why the splits were chosen</h2>", _reasons(runs),
              "<h2>Gain over each static split (DSC Eq. 7)</h2>", _gains(runs)]
    for run in runs:
        opened = " open" if len(runs) == 1 else ""
        parts += [f"<h2>{html.escape(run.label)}</h2>", f"<p class='note'>{html.escape(readable(str(run.path)))}</p>",
                  _sampled(run),
                  "<h3>Against each frame's floor and oracle</h3>", _bounds(run),
                  "<h3>Measured against the model (medians)</h3>", _model(run),
                  f"<details{opened}><summary>this run's figures</summary>{_run_figures(out_dir, run)}</details>"]
    parts.append("</body></html>\n")
    path = out_dir / PAGE
    try:
        path.write_text("\n".join(parts), encoding="utf-8")
    except OSError as exc:
        raise SplitEdgeError(f"cannot write {path}: {exc}") from exc
    return path
