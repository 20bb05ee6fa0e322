"""The pictures of a comparison (:mod:`fieldtrial._compare`): several runs on one set of axes.

Each function takes the comparison's runs and writes one figure, returning False (and writing
nothing) when no run has what it draws (no gains without a calibration). Runs keep one colour
in every figure; splits keep theirs (one colour per split, the same in every run). Nothing here
computes a number the summary does not also give.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fieldtrial import _timeline as timeline
from fieldtrial._plots import (
    _colours, _plain_rate_axis, _pyplot, _reason_colours, _save, _series_of, _series_styles, answer_series, draw_cdf,
    graph_order, plain_text, series_label, split_label,
)

if TYPE_CHECKING:
    from fieldtrial._compare import Run

__all__ = ["plot_gains", "plot_latency_cdfs", "plot_rates", "plot_split_shares", "plot_splits_over_time"]

_BITS_PER_MBIT = 1e6


def _run_colours(plt: Any, runs: Sequence[Run]) -> list[Any]:
    cmap = plt.get_cmap("tab10")
    return [cmap(i % cmap.N) for i in range(len(runs))]


def _answered(run: Run) -> list[dict[str, Any]]:
    return sorted((f for f in run.trace.frames if not f.get("dropped")), key=lambda f: (f["t"], f["index"]))


def _all_splits(runs: Sequence[Run]) -> list[str]:
    return graph_order({f["split"] for run in runs for f in _answered(run)})


@plain_text
def plot_latency_cdfs(runs: Sequence[Run], path: Path) -> bool:
    """Every run's latency CDF (answered frames, capture to answer) on one axis; p50 and p95 dotted."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.8))
    for run, colour in zip(runs, _run_colours(plt, runs)):
        values = [f["total_ms"] for f in _answered(run)]
        if values:
            draw_cdf(ax, values, colour, 1.8, f"{run.label} ({len(values)} answered, p50 {np.median(values):.1f} ms)")
    ax.legend(fontsize=8, loc="lower right")
    ax.set_xlabel("total latency, capture to answer (ms)")
    ax.set_ylabel("fraction of answered frames ≤ latency")
    ax.set_title("latency distribution of each run")
    _save(plt, fig, path)
    return True


@plain_text
def plot_split_shares(runs: Sequence[Run], path: Path) -> bool:
    """One bar per run: the share of its answered frames each split ran, input side first."""
    plt = _pyplot()
    order = _all_splits(runs)
    colours = _colours(plt, order)
    fig, ax = plt.subplots(figsize=(9, 1.4 + 0.55 * len(runs)))
    rows = np.arange(len(runs))[::-1]  # the first run on top
    left = np.zeros(len(runs))
    for split in order:
        share = np.array([100.0 * (r.summary["per_split"].get(split) or {}).get("share", 0.0) for r in runs])
        ax.barh(rows, share, left=left, color=colours[split], edgecolor="white", label=split_label(split))
        for row, start, width in zip(rows, left, share):
            if width >= 8:
                ax.text(start + width / 2, row, f"{width:.0f} %", ha="center", va="center", fontsize=8)
        left += share
    ax.set_yticks(rows)
    ax.set_yticklabels([r.label for r in runs], fontsize=9)
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of the answered frames (%)")
    if order:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="split (input → output)",
                  title_fontsize=8)
    ax.set_title("where each run's frames ran")
    _save(plt, fig, path)
    return True


@plain_text
def plot_rates(runs: Sequence[Run], path: Path) -> bool:
    """Three panels, a bar per run: answered frames per second, the share dropped (stacked by
    reason) and the share of frames with a deadline answered after it."""
    plt = _pyplot()
    fig, (fps_ax, drop_ax, late_ax) = plt.subplots(1, 3, figsize=(12, 1.8 + 0.35 * max(len(runs), 4)))
    colours = _run_colours(plt, runs)
    x = np.arange(len(runs))
    fps = [r.summary["fps"] or 0.0 for r in runs]
    fps_ax.bar(x, fps, color=colours)
    fps_ax.set_title("answered frames per second", fontsize=9)
    reasons = list(dict.fromkeys(reason for r in runs for reason in r.summary["drops_by_reason"]))
    reason_colours = _reason_colours(plt, reasons)
    bottom = np.zeros(len(runs))
    for reason in reasons:
        share = np.array([100.0 * r.summary["drops_by_reason"].get(reason, 0) / r.summary["frames"] for r in runs])
        drop_ax.bar(x, share, bottom=bottom, color=reason_colours[reason], label=timeline.reason_label(reason))
        bottom += share
    if reasons:
        drop_ax.legend(fontsize=7, loc="upper left", title="why dropped", title_fontsize=7)
    drop_ax.set_title("dropped (% of frames captured)", fontsize=9)
    late = [r.summary["deadline_misses"] for r in runs]
    late_ax.bar(x, [100.0 * m["share"] if m else 0.0 for m in late], color=colours)
    for i, m in enumerate(late):
        if m is None:
            late_ax.text(i, 0, "no\ndeadline", ha="center", va="bottom", fontsize=7, color="dimgrey")
    late_ax.set_title("deadline missed (% of answered frames with one)", fontsize=9)
    for ax in (fps_ax, drop_ax, late_ax):
        ax.set_xticks(x)
        ax.set_xticklabels([r.label for r in runs], rotation=20, ha="right", fontsize=8)
        ax.set_ylim(bottom=0)
    for ax in (drop_ax, late_ax):
        ax.set_ylim(0, 105)
    _save(plt, fig, path)
    return True


@plain_text
def plot_splits_over_time(runs: Sequence[Run], path: Path) -> bool:
    """The runs on one time axis: each run's split frame by frame (a band per run, a tick per
    answered frame in its split's colour; a frame answered on the board after a deadline refusal or
    a host failure in the marker of its cause, :func:`fieldtrial._plots.answer_series`) above each
    run's rate estimate and, where a testbed recorded it, the link's real rate: a replay reads
    against its original at a glance."""
    plt = _pyplot()
    series = answer_series([f for run in runs for f in _answered(run)])
    styles = _series_styles(plt, series)
    run_colours = _run_colours(plt, runs)
    fig, (bands, rates) = plt.subplots(2, 1, sharex=True, figsize=(11, 2.6 + 0.5 * len(runs) + 2.4),
                                       gridspec_kw={"height_ratios": [0.6 + 0.5 * len(runs), 2.4]})
    for row, run in enumerate(runs):
        answered = _answered(run)
        y = len(runs) - 1 - row
        for key in series:  # every series in the legend, taken by the first run or not
            times = [f["t"] for f in answered if _series_of(f) == key]
            colour, marker, _ = styles[key]
            tick = marker == "o"  # a split's own frames: ticks; a cause's: its marker
            bands.scatter(times, [y] * len(times), marker="|" if tick else marker, s=160 if tick else 40, color=colour,
                          label=series_label(key) if row == 0 else None)
    bands.set_yticks(range(len(runs)))
    bands.set_yticklabels([r.label for r in reversed(runs)], fontsize=8)
    bands.set_ylim(-0.6, len(runs) - 0.4)
    bands.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="split", title_fontsize=8)
    bands.set_title("the split of each answered frame, by capture time", fontsize=10)
    values: list[float] = []
    for run, colour in zip(runs, run_colours):
        rated = sorted((f for f in run.trace.frames if f.get("rate_bps")), key=lambda f: f["t"])
        if rated:
            mbit = [f["rate_bps"] / _BITS_PER_MBIT for f in rated]
            rates.plot([f["t"] for f in rated], mbit, drawstyle="steps-post", color=colour, lw=1.0,
                       label=f"{run.label}: board's estimate")
            values += mbit
        steps = timeline.real_rate_steps(run.trace.link_rates)
        if steps:
            end = max([f["t"] for f in run.trace.frames] + [steps[-1]["t"]])
            real = [s["rate_mbit"] for s in steps]
            rates.plot([s["t"] for s in steps] + [end], real + [real[-1]], drawstyle="steps-post", color=colour,
                       lw=2.0, ls=(0, (4, 2)), label=f"{run.label}: link's real rate")
            values += real
    if values:
        _plain_rate_axis(rates, min(values), max(values))
        rates.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        rates.text(0.5, 0.5, "no rate recorded: nothing was offloaded", transform=rates.transAxes, ha="center")
    rates.set_ylabel("link rate (Mbit/s)")
    rates.set_xlabel("time since each run started (s, at capture)")
    _save(plt, fig, path)
    return True


@plain_text
def plot_gains(runs: Sequence[Run], path: Path) -> bool:
    """DSC Eq. 7: each run's gain over every split held static, grouped by static split; False
    (nothing drawn) when no run had a calibration and a rate estimate."""
    with_gain = [(r, c) for c, r in enumerate(runs) if r.summary.get("gain_over_static")]
    if not with_gain:
        return False
    plt = _pyplot()
    colours = _run_colours(plt, runs)
    order = graph_order({s for r, _ in with_gain for s in r.summary["gain_over_static"]})
    width = 0.8 / len(with_gain)
    fig, ax = plt.subplots(figsize=(max(7.0, 1.3 * len(order) + 4.0), 4.6))
    x = np.arange(len(order))
    for k, (run, c) in enumerate(with_gain):
        gains = [100.0 * run.summary["gain_over_static"].get(s, np.nan) for s in order]
        ax.bar(x - 0.4 + width * (k + 0.5), gains, width, color=colours[c], label=run.label)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(x)
    ax.set_xticklabels([split_label(s) for s in order], rotation=15, ha="right", fontsize=8)
    ax.set_ylabel("gain over the split held static (%)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title("what each run's switching was worth against every static split (DSC Eq. 7, calibrated model)",
                 fontsize=9)
    _save(plt, fig, path)
    return True
