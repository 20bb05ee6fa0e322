"""``split-device report A.jsonl B.jsonl …``: several runs side by side, on one page.

Two bundles, two policies, two days, or a trial and its replay (``python -m testbed replay``):
each run gets its own report (the single-run outputs, in a folder named after its label), and
the comparison sets them side by side: latency CDFs on one axis, split shares, frames per
second, drops by reason, deadline misses, the DSC Eq. 7 gain against every static split, and
the model against the measurement per run. ``summary.json`` has every number, ``report.html``
every picture (embedded: it works offline, moved or mailed on its own).

Against the first run, each other run's frames are matched by index (both runs number their
frames in capture order, from the same source) and the share that ran on the same split is
given with the ratio of the p50 latencies: the figures that say whether a replay reproduced
its original (:func:`agreement`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from calibration.calibration_file import Calibrations
from fieldtrial import _compare_plots as compare_plots, _page as page
from fieldtrial._plots import readable
from fieldtrial._report import SUMMARY_FILE, strict_json, write_report
from fieldtrial._trace import MAX_LINE_BYTES, Trace, load_trace
from splitedge import SplitEdgeError

__all__ = [
    "COMPARISON_PLOTS", "Run", "agreement", "default_labels", "format_comparison", "trace_paths", "write_comparison",
]

#: The comparison's own figures, drawn from every run at once.
COMPARISON_PLOTS = {
    "latency_cdf.png": compare_plots.plot_latency_cdfs,
    "split_shares.png": compare_plots.plot_split_shares,
    "fps_drops_deadlines.png": compare_plots.plot_rates,
    "splits_over_time.png": compare_plots.plot_splits_over_time,
    "gain_over_static.png": compare_plots.plot_gains,
}
#: Run-record fields that tell runs apart, in the order a default label takes them.
_DISTINGUISHING = ("bundle_id", "policy", "source", "backend", "precision")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class Run:
    """One run of a comparison: its label, trace file, the trace read back, its summary and the
    folder (inside the comparison's) where its own report is."""

    label: str
    path: Path
    trace: Trace
    summary: dict[str, Any]
    folder: str


def trace_paths(paths: Sequence[str | Path]) -> list[Path]:
    """The traces named: files as given, and from each folder its ``*.jsonl`` files (sorted by
    name) whose first line is a trace's run record, so a folder of traces and other JSONL works."""
    found: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            traces = [p for p in sorted(path.glob("*.jsonl")) if p.is_file() and _starts_a_trace(p)]  # no FIFO
            if not traces:
                raise SplitEdgeError(f"{path}: no trace in this folder (a *.jsonl file written by split-device run --trace)")
            found += traces
        elif path.is_file():
            found.append(path)
        else:
            raise SplitEdgeError(f"{path}: no such trace file or folder")
    return found


def _starts_a_trace(path: Path) -> bool:
    try:
        with path.open(encoding="utf-8") as file:
            first = json.loads(file.readline(MAX_LINE_BYTES) or "null")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return False
    return isinstance(first, dict) and first.get("type") == "run"


def default_labels(paths: Sequence[Path], runs: Sequence[dict[str, Any]]) -> list[str]:
    """A label per run that tells it from the others: the file names (without ``.jsonl``) where
    they differ; else the run-record fields that differ (bundle, policy, source, backend,
    precision); else folder and file name; else the file name and the run's position."""
    stems = [p.stem for p in paths]
    if _unique(stems):
        return stems
    varying = [key for key in _DISTINGUISHING if len({str(r.get(key)) for r in runs}) > 1]
    if varying:
        fields = [" ".join(str(r.get(key)) for key in varying) for r in runs]
        if _unique(fields):
            return fields
    folders = [f"{p.parent.name}/{p.stem}" for p in paths]
    if _unique(folders):
        return folders
    return [f"{stem} #{i}" for i, stem in enumerate(stems, 1)]


def _unique(labels: Sequence[str]) -> bool:
    return len(set(labels)) == len(labels)


def _folders(labels: Sequence[str]) -> list[str]:
    """A folder name per label, safe on any file system and distinct."""
    out: list[str] = []
    for label in labels:
        base = _UNSAFE.sub("-", label).strip("-.") or "run"
        name, n = base, 2
        while name in out:
            name, n = f"{base}-{n}", n + 1
        out.append(name)
    return out


def agreement(reference: Sequence[dict[str, Any]], other: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """How closely ``other``'s frames followed ``reference``'s, matched by frame index.

    ``split_agreement``: the share of the reference's answered frames that ``other`` also
    answered on the same split (a frame ``other`` dropped or never captured counts against it);
    ``split_agreement_answered``: the same over the frames both answered. ``p50_ratio``: the
    median latency of ``other``'s answered frames over the reference's. The issue's fidelity
    target for a replay of an emulated run: agreement ≥ 0.9 and the ratio within 10 % of 1.
    """
    ref = {f["index"]: f["split"] for f in reference if not f.get("dropped")}
    oth = {f["index"]: f["split"] for f in other if not f.get("dropped")}
    both = ref.keys() & oth.keys()
    same = sum(1 for i in both if ref[i] == oth[i])
    ref_p50 = _p50([f["total_ms"] for f in reference if not f.get("dropped")])
    oth_p50 = _p50([f["total_ms"] for f in other if not f.get("dropped")])
    return {
        "reference_answered": len(ref),
        "answered_in_both": len(both),
        "same_split": same,
        "split_agreement": same / len(ref) if ref else None,
        "split_agreement_answered": same / len(both) if both else None,
        "reference_p50_ms": ref_p50,
        "p50_ms": oth_p50,
        "p50_ratio": oth_p50 / ref_p50 if ref_p50 and oth_p50 is not None else None,
    }


def _sampled(first: Run, other: Run) -> dict[str, Any]:
    """Where either run's frames are a sample (a trace past :data:`fieldtrial._trace.MAX_KEPT`), the
    agreement is over the frames both kept: the same indices, as both keep frames by index."""
    if not (first.trace.sampled or other.trace.sampled):
        return {}
    return {"estimated_from_sample": True}


def _p50(values: list[float]) -> float | None:
    return float(np.median(values)) if values else None


def _calibration_for(run: dict[str, Any], given: Sequence[Calibrations]) -> Calibrations | None:
    """Of the calibrations given, the one of the run's bundle (None: the report takes the run's own)."""
    return next((c for c in given if c.bundle_id == run.get("bundle_id")), None)


def write_comparison(
    paths: Sequence[str | Path], out_dir: str | Path, calibrations: Sequence[Calibrations] = (),
    labels: Sequence[str] = (),
) -> dict[str, Any]:
    """Each run's report in ``out_dir/<label>/``, the comparison's figures, ``summary.json`` and
    ``report.html`` in ``out_dir``; return the comparison's summary. One run: its report (as
    :func:`fieldtrial._report.write_report` writes it) and ``report.html`` in ``out_dir``; return
    its summary.

    ``calibrations``: each run takes the one of its bundle, else the one it recorded (see
    :func:`fieldtrial._report.write_report`); one that is no run's bundle's is an error, as it
    would silently compare nothing. ``labels``: one per run, in order; default
    :func:`default_labels`.
    """
    files = trace_paths(paths)
    traces = [load_trace(p) for p in files]
    if labels and len(labels) != len(files):
        raise SplitEdgeError(f"--label given {len(labels)} times for {len(files)} runs: give one per run, in order")
    if labels and not _unique(labels):
        raise SplitEdgeError(f"--label: the labels must differ, got {', '.join(labels)}")
    bundles = {t.run.get("bundle_id") for t in traces}
    for tables in calibrations:
        if tables.bundle_id not in bundles:
            raise SplitEdgeError(f"a calibration is for bundle {tables.bundle_id}, none of the runs is "
                                 f"(runs of {', '.join(sorted(map(str, bundles)))})")
    names = [readable(name) for name in list(labels) or default_labels(files, [t.run for t in traces])]
    out = Path(out_dir)
    single = len(files) == 1  # one run: its report where it always was, and the page beside it
    runs = [
        Run(label, path, trace, write_report(path, out / folder, _calibration_for(trace.run, calibrations), trace),
            folder)
        for label, path, trace, folder in zip(names, files, traces, ["."] if single else _folders(names))
    ]
    if single:
        page.write_page(out, runs, [], {})
        return runs[0].summary
    figures = {}
    for name, plot in COMPARISON_PLOTS.items():
        if plot(runs, out / name):
            figures[name] = out / name
    summary = {
        "runs": [{"label": r.label, "trace": readable(str(r.path)), "report": r.folder, "summary": r.summary}
                 for r in runs],
        "against_first": [{"label": r.label, **agreement(runs[0].trace.frames, r.trace.frames),
                           **_sampled(runs[0], r)} for r in runs[1:]],
        "page": page.PAGE,
    }
    try:
        (out / SUMMARY_FILE).write_text(strict_json(summary, out / SUMMARY_FILE) + "\n", encoding="utf-8")
    except OSError as exc:
        raise SplitEdgeError(f"cannot write the report into {out}: {exc}") from exc
    page.write_page(out, runs, summary["against_first"], figures)
    return summary


def format_comparison(summary: dict[str, Any]) -> str:
    """The table ``split-device report A B …`` prints: a line per run, then each against the first."""
    lines = [f"{'run':24s} {'frames':>7s} {'answered':>8s} {'fps':>6s} {'p50 ms':>8s} {'p95 ms':>8s} "
             f"{'dropped':>8s} {'late':>6s} {'changes':>8s}"]
    for run in summary["runs"]:
        s = run["summary"]
        late = "-" if s["deadline_misses"] is None else f"{100.0 * s['deadline_misses']['share']:.1f}%"
        lines.append(
            f"{run['label'][:24]:24s} {s['frames']:7d} {s['answered']:8d} {_num(s['fps'], '.2f'):>6s} "
            f"{_num(s['latency_ms']['p50'], '.1f'):>8s} {_num(s['latency_ms']['p95'], '.1f'):>8s} "
            f"{100.0 * s['drop_rate']:7.1f}% {late:>6s} "
            f"{s['split_changes']:8d}"
        )
    first = summary["runs"][0]["label"]
    for a in summary["against_first"]:
        lines.append(
            f"{a['label']} against {first}: the same split on {_num(a['split_agreement'], '.1%')} of {first}'s "
            f"{a['reference_answered']} answered frames ({a['same_split']}), p50 ratio {_num(a['p50_ratio'], '.3f')}"
        )
    return "\n".join(lines)


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)
