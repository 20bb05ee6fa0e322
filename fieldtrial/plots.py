"""The pictures of a run and of a calibration, as PNG files for ``split-device report``.

Each function takes what the report already has (trace frame records, or a
:class:`calibration.Calibration`) and writes one figure; nothing here computes a number the
summary does not also give. matplotlib is imported inside the functions, with the Agg
backend: the board runs without a display, and a board that never draws a report need not
install matplotlib at all.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from calibration import Calibration
from device_runtime import LOCAL, OFFLOAD
from splitedge import SplitEdgeError

__all__ = [
    "graph_order",
    "plot_drop_rate",
    "plot_latency_cdf",
    "plot_latency_over_time",
    "plot_measured_vs_model",
    "plot_table",
    "split_label",
]

_DPI = 120
_BITS_PER_MBIT = 1e6
_ALL_COLOUR = "black"


def _pyplot() -> ModuleType:
    """matplotlib.pyplot on the Agg backend; a clear error where matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError as exc:
        raise SplitEdgeError(
            "plots need matplotlib, which is not installed: pip install 'splitedge[report]'"
        ) from exc
    matplotlib.use("Agg")  # files only: a board has no display
    import matplotlib.pyplot as plt

    return plt


def split_label(split: str) -> str:
    """How a split is named in legends: the two ends of the graph say what they mean."""
    if split == LOCAL:
        return "local (no offload)"
    if split == OFFLOAD:
        return "offload (full offload)"
    return split


def _natural_key(split: str) -> list[Any]:
    # "features_4" before "features_14": split ids number their blocks in graph order.
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", split)]


def graph_order(splits: Iterable[str], known_order: Sequence[str] | None = None) -> list[str]:
    """``splits`` from the input to the output of the network: offload (DSC l = 0) first, local (l = L) last.

    The cut ids in between keep ``known_order`` (a calibration's, which follows the manifest)
    where given; otherwise they are sorted naturally, which follows the graph for ids that
    number their blocks, as torchvision-derived ids do.
    """
    present = set(splits)
    if known_order is not None:
        middle = [s for s in known_order if s in present and s not in (LOCAL, OFFLOAD)]
        middle += sorted(present - set(middle) - {LOCAL, OFFLOAD}, key=_natural_key)
    else:
        middle = sorted(present - {LOCAL, OFFLOAD}, key=_natural_key)
    return ([OFFLOAD] if OFFLOAD in present else []) + middle + ([LOCAL] if LOCAL in present else [])


def _colours(plt: ModuleType, splits: Sequence[str]) -> dict[str, Any]:
    """One distinct colour per split, stable for a given list of splits."""
    cmap = plt.get_cmap("tab10" if len(splits) <= 10 else "tab20")
    return {split: cmap(i % cmap.N) for i, split in enumerate(splits)}


def _answered(frames: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f for f in frames if not f.get("dropped")]


def _require(frames: Sequence[dict[str, Any]], what: str) -> None:
    if not frames:
        raise SplitEdgeError(f"no frames to plot ({what})")


def _save(plt: ModuleType, fig: Any, path: str | Path) -> None:
    fig.tight_layout()
    try:
        fig.savefig(Path(path), dpi=_DPI)
    except OSError as exc:
        raise SplitEdgeError(f"cannot write the plot {path}: {exc}") from exc
    finally:
        plt.close(fig)


def plot_table(calibration: Calibration, path: str | Path) -> None:
    """DSC Fig. 2: the best split (Eq. 6) for each batch size (rows) and link rate (log x axis).

    Each cell spans the rates :meth:`SplitTable.lookup` rounds to its grid rate, so a colour
    boundary sits where the board would switch.
    """
    plt = _pyplot()
    from matplotlib.colors import BoundaryNorm, ListedColormap
    from matplotlib.patches import Patch

    table = calibration.table
    order = graph_order(table.splits, table.splits)
    colours = _colours(plt, order)
    # Colour index of each cell in graph order, so neighbouring cuts get neighbouring colours.
    rank = {split: order.index(split) for split in table.splits}
    cells = np.array([[rank[table.splits[i]] for i in row] for row in table.best])  # (batches, rates)
    rates = np.asarray(table.rates_bps) / _BITS_PER_MBIT
    log_rates = np.log10(rates)
    step = log_rates[1] - log_rates[0]
    edges = 10 ** np.concatenate([[log_rates[0] - step / 2], (log_rates[:-1] + log_rates[1:]) / 2, [log_rates[-1] + step / 2]])

    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.45 * len(table.batches)))
    cmap = ListedColormap([colours[s] for s in order])
    norm = BoundaryNorm(np.arange(len(order) + 1) - 0.5, cmap.N)
    ax.pcolormesh(edges, np.arange(len(table.batches) + 1), cells, cmap=cmap, norm=norm, edgecolors="white", linewidth=0.2)
    ax.set_xscale("log")
    ax.set_xlabel("link rate (Mbit/s)")
    ax.set_yticks(np.arange(len(table.batches)) + 0.5)
    ax.set_yticklabels([str(b) for b in table.batches])
    ax.set_ylabel("batch size")
    used = {table.splits[i] for row in table.best for i in row}
    handles = [
        Patch(color=colours[s], label=split_label(s) + ("" if s in used else " (never best)")) for s in order
    ]
    ax.legend(handles=handles, title="best split (input → output)", fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(f"{calibration.bundle_id}: best split by batch size and link rate (DSC Eq. 6)")
    _save(plt, fig, path)


def plot_latency_over_time(frames: Sequence[dict[str, Any]], path: str | Path) -> None:
    """Each answered frame's total latency at its capture time, coloured by the split that ran.

    Dashed vertical lines mark where the split changed; dropped frames are small crosses along
    the bottom; the link-rate estimate the splits were chosen on is the grey step line (right
    axis), so a switch can be read against the rate that caused it.
    """
    _require(frames, "latency over time")
    plt = _pyplot()
    from matplotlib.transforms import blended_transform_factory

    answered = sorted(_answered(frames), key=lambda f: (f["t"], f["index"]))
    order = graph_order(f["split"] for f in answered)
    colours = _colours(plt, order)
    fig, ax = plt.subplots(figsize=(10, 4.8))
    for split in order:
        mine = [f for f in answered if f["split"] == split]
        ax.scatter([f["t"] for f in mine], [f["total_ms"] for f in mine], s=12, color=colours[split], label=split_label(split), zorder=3)
    fallbacks = [f for f in answered if f.get("error")]
    if fallbacks:
        ax.scatter([f["t"] for f in fallbacks], [f["total_ms"] for f in fallbacks], s=40, facecolors="none",
                   edgecolors="firebrick", label="fell back to local", zorder=4)
    changes = [b["t"] for a, b in zip(answered, answered[1:]) if a["split"] != b["split"]]
    for i, t in enumerate(changes):
        ax.axvline(t, color="grey", ls="--", lw=0.8, zorder=1, label="split change" if i == 0 else None)
    dropped = [f["t"] for f in frames if f.get("dropped")]
    if dropped:
        bottom = blended_transform_factory(ax.transData, ax.transAxes)  # x in seconds, y in axes fraction
        ax.scatter(dropped, [0.02] * len(dropped), marker="x", s=14, color="dimgrey", transform=bottom,
                   label=f"dropped ({len(dropped)})", zorder=2)
    ax.set_xlabel("time since start (s, at capture)")
    ax.set_ylabel("total latency (ms)")
    ax.set_ylim(bottom=0)
    handles, labels = ax.get_legend_handles_labels()
    rated = sorted((f for f in frames if f.get("rate_bps")), key=lambda f: f["t"])
    if rated:
        twin = ax.twinx()
        line = twin.plot([f["t"] for f in rated], [f["rate_bps"] / _BITS_PER_MBIT for f in rated], drawstyle="steps-post",
                         color="grey", lw=1.2, alpha=0.8, label="rate estimate")
        twin.set_yscale("log")
        twin.set_ylabel("link rate estimate (Mbit/s)")
        handles, labels = handles + line, labels + ["rate estimate"]
    ax.legend(handles, labels, fontsize=8, loc="upper left", bbox_to_anchor=(1.1, 1.0))
    ax.set_title(f"latency per frame ({len(answered)} answered, {len(changes)} split changes)")
    _save(plt, fig, path)


def plot_latency_cdf(frames: Sequence[dict[str, Any]], path: str | Path) -> None:
    """Empirical CDF of the answered frames' total latency: one curve per split and one for all.

    A split's curve left of "all" is where the run was fast; the dotted lines mark p50 and p95.
    """
    _require(frames, "latency CDF")
    plt = _pyplot()
    answered = _answered(frames)
    order = graph_order(f["split"] for f in answered)
    colours = _colours(plt, order)
    fig, ax = plt.subplots(figsize=(8, 4.8))
    curves = [(split_label(s), [f["total_ms"] for f in answered if f["split"] == s], colours[s], 1.5) for s in order]
    if len(order) > 1:
        curves.append(("all", [f["total_ms"] for f in answered], _ALL_COLOUR, 2.5))
    for label, values, colour, width in curves:
        x = np.sort(np.asarray(values, dtype=float))
        y = np.arange(1, len(x) + 1) / len(x)
        ax.step(np.concatenate([[x[0]], x]), np.concatenate([[0.0], y]), where="post", color=colour, lw=width,
                label=f"{label} ({len(x)})")
    for q in (0.5, 0.95):
        ax.axhline(q, color="grey", ls=":", lw=0.8)
    if not answered:
        ax.text(0.5, 0.5, "no answered frames", transform=ax.transAxes, ha="center", va="center")
    else:
        ax.legend(fontsize=8, loc="lower right")
    ax.set_xlabel("total latency (ms)")
    ax.set_ylabel("fraction of frames ≤ latency")
    ax.set_ylim(0, 1.02)
    ax.set_title("latency distribution by split")
    _save(plt, fig, path)


def plot_drop_rate(frames: Sequence[dict[str, Any]], path: str | Path, window_s: float = 1.0) -> None:
    """Share of the frames captured in each ``window_s`` window that were dropped.

    Windows are aligned on the first capture. A window with no frame has no rate: it is shaded
    grey instead, which tells a stalled source from a window where nothing was dropped.
    """
    _require(frames, "drop rate")
    if not window_s > 0:
        raise SplitEdgeError(f"window_s must be > 0 s, got {window_s!r}")
    plt = _pyplot()
    t = np.array([f["t"] for f in frames], dtype=float)
    dropped = np.array([bool(f.get("dropped")) for f in frames])
    start = t.min()
    windows = np.floor((t - start) / window_s).astype(int)
    count = np.bincount(windows)
    lost = np.bincount(windows, weights=dropped)
    seen = count > 0
    left = start + np.flatnonzero(seen) * window_s
    fig, ax = plt.subplots(figsize=(10, 3.6))
    ax.bar(left, 100.0 * lost[seen] / count[seen], width=window_s, align="edge", color="firebrick", alpha=0.8,
           edgecolor="white", linewidth=0.3)
    for i, k in enumerate(np.flatnonzero(~seen)):  # shaded, so that "no frames" does not read as "0 % dropped"
        ax.axvspan(start + k * window_s, start + (k + 1) * window_s, color="lightgrey", alpha=0.6, lw=0,
                   label="no frame captured" if i == 0 else None)
    if not seen.all():
        ax.legend(fontsize=8, loc="upper right")
    ax.set_xlabel("time since start (s, at capture)")
    ax.set_ylabel(f"dropped per {window_s:g} s window (%)")
    ax.set_ylim(0, 105)
    ax.set_title(f"drop rate: {int(dropped.sum())} of {len(frames)} frames dropped ({100.0 * dropped.mean():.1f} %)")
    _save(plt, fig, path)


#: Stage and wait colours of the measured-vs-model bars: stages solid, waits hatched.
_STAGE_COLOURS = {"head": "tab:blue", "transfer": "tab:orange", "tail": "tab:green"}
_WAIT_COLOURS = {"queue": "lightgrey", "slot": "silver", "host_queue": "darkgrey"}
_WAIT_LABELS = {"queue": "wait: board queue", "slot": "wait: in-flight slot", "host_queue": "wait: host queue"}


def plot_measured_vs_model(comparison: dict[str, dict[str, Any]], path: str | Path) -> None:
    """Per split, two stacked bars: the model's DSC Eq. 4 stages (head, transfer, tail) and the
    measured ones, with the measured waits (board queue, in-flight slot, host queue) hatched on
    top. Medians of the summary's ``predicted_vs_measured``; the ratio above each pair is the
    stages' alone, so queueing shows as its own height rather than as a model that is off.
    """
    if not comparison:
        raise SplitEdgeError("nothing to plot (measured vs model): no split with a model and frames")
    plt = _pyplot()
    splits = list(comparison)
    x = np.arange(len(splits), dtype=float)
    width = 0.38
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(splits) + 2.5), 4.8))
    labelled: set[str] = set()

    def bar(position: float, height: float, bottom: float, colour: Any, label: str, hatch: str | None = None) -> None:
        ax.bar(position, height, width, bottom=bottom, color=colour, edgecolor="white", hatch=hatch,
               label=None if label in labelled else label)
        labelled.add(label)

    for i, split in enumerate(splits):
        c = comparison[split]
        bottom = 0.0
        for stage, colour in _STAGE_COLOURS.items():
            height = c["stages"][stage]["predicted_ms"]
            bar(x[i] - width / 2, height, bottom, colour, f"{stage}, model", hatch="..")
            bottom += height
        top = bottom
        bottom = 0.0
        for stage, colour in _STAGE_COLOURS.items():
            height = c["stages"][stage]["measured_ms"]
            bar(x[i] + width / 2, height, bottom, colour, f"{stage}, measured")
            bottom += height
        for wait, key in (("queue", "queue"), ("slot", "slot"), ("host_queue", "host_queue")):
            if c["waits_ms"] is not None and c["waits_ms"][key] > 0:
                bar(x[i] + width / 2, c["waits_ms"][key], bottom, _WAIT_COLOURS[wait], _WAIT_LABELS[wait], hatch="//")
                bottom += c["waits_ms"][key]
        ratio = "-" if c["ratio"] is None else f"stages ×{c['ratio']:.2f}"
        ax.text(x[i], max(top, bottom), ratio, ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x)
    ax.set_xticklabels([f"{split_label(s)}\nmodel | measured" for s in splits], fontsize=8)
    ax.set_ylabel("ms (medians)")
    handles, labels = ax.get_legend_handles_labels()  # model stages, then measured, then waits
    order = sorted(range(len(labels)), key=lambda k: (not labels[k].endswith("model"), k))
    ax.legend([handles[k] for k in order], [labels[k] for k in order], fontsize=8, loc="upper left",
              bbox_to_anchor=(1.01, 1.0))
    ax.set_title("measured vs model: stages (DSC Eq. 4), waits apart", fontsize=10)
    _save(plt, fig, path)
