"""The pictures of a run and of a calibration, as PNG files for ``split-device report``.

Each function takes what the report already has (trace frame records, or a
:class:`calibration.Calibration`) and writes one figure; nothing here computes a number the
summary does not also give. matplotlib is imported inside the functions, with the Agg
backend: the board runs without a display, and a board that never draws a report need not
install matplotlib at all.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, TypeVar

import numpy as np

from calibration.calibration_file import Calibration
from device_runtime import LOCAL, OFFLOAD
from fieldtrial import _timeline as timeline
from fieldtrial._bounds import ESTIMATE, Bound
from splitedge import SplitEdgeError

__all__ = [
    "Series",
    "answer_series",
    "draw_cdf",
    "graph_order",
    "plain_text",
    "plot_drop_rate",
    "plot_latency_cdf",
    "plot_latency_over_time",
    "plot_measured_vs_model",
    "plot_table",
    "readable",
    "series_label",
    "split_label",
]

_DPI = 120
#: The most split changes marked by a line over time: more are a grey wall, and cost a hostile trace
#: (a change every frame) seconds and gigabytes to draw; the title still counts them.
MAX_CHANGES_MARKED = 1_000
#: The most windows the drop rate is drawn in: a longer run gets wider windows (whole seconds).
MAX_DROP_WINDOWS = 2_000
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


_Plot = TypeVar("_Plot", bound=Callable[..., Any])


def plain_text(plot: _Plot) -> _Plot:
    """``plot`` with every string drawn as written, never parsed as mathtext. Split names, drop
    reasons and run labels come from traces (untrusted input), and matplotlib parses a string
    with two unescaped ``$`` as mathtext: a split named ``$\\frac{a}{$`` ended the report in a
    ParseSyntaxException. Off for the whole figure, from its first text to its last tick label
    (drawn when saved), so no name needs escaping at each call."""

    @functools.wraps(plot)
    def drawn(*args: Any, **kwargs: Any) -> Any:
        try:
            import matplotlib
        except ImportError:  # the plot's _pyplot() says what to install
            return plot(*args, **kwargs)
        with matplotlib.rc_context({"text.parse_math": False}):
            return plot(*args, **kwargs)

    return drawn  # type: ignore[return-value]


def readable(text: str) -> str:
    """``text`` as UTF-8 can hold it: a file name or argument that is not UTF-8 comes with Python's
    surrogate escapes (``\\udcff``), which matplotlib's font code refused with a TypeError and a
    page's encoding with a UnicodeEncodeError; they are written out as such, and all else kept."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


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


#: What a frame is drawn as: its split, and for the local split why it ran there (None for any other).
Series = tuple[str, str | None]
#: The frames answered on the board after a deadline refusal or a host failure, in a colour,
#: marker and (in a CDF) line style of their own: a refusal or a failure must never read as the
#: policy's choice. Frames there by choice keep the local split's colour, a dot and a solid line.
_CAUSE_STYLES = {
    timeline.AFTER_DEADLINE: ("goldenrod", "v", "--"),
    timeline.AFTER_FAILURE: ("darkred", "X", "-."),
    timeline.NOT_TOLD: ("dimgrey", "s", ":"),
}


def _series_of(frame: dict[str, Any]) -> Series:
    return frame["split"], timeline.local_cause(frame)


def answer_series(answered: Sequence[dict[str, Any]]) -> list[Series]:
    """The series the answered frames fall in, input to output: one per split, and the local split's
    frames one per cause (:func:`fieldtrial._timeline.local_cause`: by choice, after a deadline
    refusal, after a host failure), so every picture tells them apart."""
    present = {_series_of(f) for f in answered}
    out: list[Series] = []
    for split in graph_order(split for split, _ in present):
        if split == LOCAL:
            out += [(LOCAL, cause) for cause in timeline.LOCAL_CAUSES if (LOCAL, cause) in present]
        else:
            out.append((split, None))
    return out


def series_label(series: Series) -> str:
    """How a series is named in legends: its split, or for the local split why its frames ran there."""
    split, cause = series
    return split_label(split) if cause is None else timeline.local_cause_label(cause)


def _series_styles(plt: ModuleType, series: Sequence[Series]) -> dict[Series, tuple[Any, str, str]]:
    """Colour, marker and line style per series: the split's colour (:func:`_colours`, as in every
    other plot), a dot and a solid line, but the causes of :data:`_CAUSE_STYLES` their own."""
    colours = _colours(plt, graph_order(split for split, _ in series))
    return {key: _CAUSE_STYLES.get(key[1] or "", (colours[key[0]], "o", "-")) for key in series}


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


@plain_text
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

    fig, ax = plt.subplots(figsize=(10, max(2.6, 1.2 + 0.45 * len(table.batches))))  # room for the legend's rows
    cmap = ListedColormap([colours[s] for s in order])
    norm = BoundaryNorm(np.arange(len(order) + 1) - 0.5, cmap.N)
    ax.pcolormesh(edges, np.arange(len(table.batches) + 1), cells, cmap=cmap, norm=norm, edgecolors="white", linewidth=0.2)
    ax.set_xscale("log")
    _plain_log_ticks(ax.xaxis, edges[0], edges[-1])
    ax.set_xlim(edges[0], edges[-1])
    ax.set_xlabel("link rate (Mbit/s)")
    ax.set_yticks(np.arange(len(table.batches)) + 0.5)
    ax.set_yticklabels([str(b) for b in table.batches])
    ax.set_ylabel("batch size")
    used = {table.splits[i] for row in table.best for i in row}
    handles = [
        Patch(color=colours[s], label=split_label(s) + ("" if s in used else " (never best)")) for s in order
    ]
    ax.legend(handles=handles, title="best split (input → output)", fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(f"{calibration.bundle_id}:\nbest split by batch size and link rate (DSC Eq. 6)", fontsize=10)
    _save(plt, fig, path)


@plain_text
def plot_latency_over_time(
    frames: Sequence[dict[str, Any]], path: str | Path, link_rates: Sequence[dict[str, Any]] = (),
    frame_bounds: Sequence[Bound] = (), changes: tuple[Sequence[float], int] | None = None, note: str = "",
) -> None:
    """The run over time, in three panels on one time axis, so a switch reads against its cause:

    * each answered frame's latency at its capture time, coloured by the split that ran (a frame
      answered on the board after a deadline refusal or a host failure marked as such), beside
      each frame's floor and oracle where ``frame_bounds`` has them (:mod:`fieldtrial._bounds`);
    * the link's rate: the board's estimate (what it chose the splits on) and, where a testbed
      recorded it (``link_rates``, the trace's ``link_rate`` records), the real rate;
    * the dropped frames, one row per reason: they have no latency, so they get no place on its axis.

    Dashed vertical lines mark where the split changed, in every panel: at the capture of each
    frame answered on another split than the frame answered before it, as the run counts its
    changes (:func:`fieldtrial._timeline.split_changes`; ``frames`` in the trace's order).
    """
    _require(frames, "latency over time")
    plt = _pyplot()
    answered = sorted(_answered(frames), key=lambda f: (f["t"], f["index"]))
    drops = timeline.drops_by_reason(frames)
    fig, (lat, rate, drop) = plt.subplots(
        3, 1, sharex=True, figsize=(11, 7.5 + 0.2 * len(drops)),
        gridspec_kw={"height_ratios": [3.0, 1.8, 0.6 + 0.35 * max(len(drops), 1)]},
    )
    if changes is None:
        changes = ([f["t"] for f in timeline.split_changes(frames)], 0)
        changes = (changes[0], len(changes[0]))
    times, count = changes
    _draw_latencies(plt, lat, answered, frame_bounds)
    _draw_rates(rate, frames, timeline.real_rate_steps(link_rates))
    _draw_drops(plt, drop, frames, drops)
    marked = count <= MAX_CHANGES_MARKED
    for ax in (lat, rate, drop):  # one collection per panel, not a line per change (1 ms each)
        if count and marked:
            ax.vlines(times, 0.0, 1.0, transform=ax.get_xaxis_transform(), colors="grey", linestyles="--", lw=0.8,
                      zorder=1, label="split change" if ax is lat else None)
    lat.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    lat.set_title(f"latency of each answered frame ({len(answered)} answered; split changes: {count}"
                  f"{'' if marked else ', too many to mark'})" + _noted(note), fontsize=10)
    drop.set_xlabel("time since the run started (s, at capture)")
    first, last = min(f["t"] for f in frames), max(f["t"] for f in frames)
    pad = 0.01 * (last - first) or 0.5
    drop.set_xlim(first - pad, last + pad)
    _save(plt, fig, path)


def _draw_latencies(plt: ModuleType, ax: Any, answered: list[dict[str, Any]], frame_bounds: Sequence[Bound]) -> None:
    """The latency panel: answered frames by series (:func:`answer_series`), and under them each
    frame's floor (a tick) and the oracle's time (a line), each label saying where a frame took the
    board's rate estimate for want of the real rate."""
    series = answer_series(answered)
    styles = _series_styles(plt, series)
    for key in series:
        mine = [f for f in answered if _series_of(f) == key]
        colour, marker, _ = styles[key]
        ax.scatter([f["t"] for f in mine], [f["total_ms"] for f in mine], s=12 if marker == "o" else 30,
                   color=colour, marker=marker, label=series_label(key), zorder=3)
    floors = [b for b in frame_bounds if b.floor_ms is not None]
    if floors:
        ax.scatter([b.t for b in floors], [b.floor_ms for b in floors], marker="_", s=40, color="black", lw=1.0,
                   label="floor: the frame's own compute" + _estimate_note([b.floor_rate for b in floors]), zorder=2)
    oracles = [b for b in frame_bounds if b.oracle_ms is not None]
    if oracles:
        ax.plot([b.t for b in oracles], [b.oracle_ms for b in oracles], drawstyle="steps-post", color="tab:green",
                lw=1.2, label="oracle: the calibration's fastest option at the link's rate"
                + _estimate_note([b.oracle_rate for b in oracles]), zorder=2)
    if not answered:
        ax.text(0.5, 0.5, "no frame answered", transform=ax.transAxes, ha="center", va="center")
    ax.set_ylabel("capture → answer (ms)")
    ax.set_ylim(bottom=0)


def _noted(note: str) -> str:
    """A figure's title's second line, where it is drawn from a sample (``note``)."""
    return f"\n{note}" if note else ""


def _estimate_note(rates: Sequence[str | None]) -> str:
    """What a bound's label adds where frames took the board's estimate, no real rate being recorded."""
    estimated = sum(rate == ESTIMATE for rate in rates)
    if not estimated:
        return ""
    return f"\n(the board's rate estimate on {estimated} of {len(rates)} frames: no real rate there)"


def _draw_rates(ax: Any, frames: Sequence[dict[str, Any]], steps: list[dict[str, Any]]) -> None:
    """The rate panel: the board's estimate and the link's real rate, in Mbit/s, the last real
    step held to the end of the run (the rate stays in force after a schedule ends)."""
    rated = sorted((f for f in frames if f.get("rate_bps")), key=lambda f: f["t"])
    values = [f["rate_bps"] / _BITS_PER_MBIT for f in rated]
    if rated:
        ax.plot([f["t"] for f in rated], values, drawstyle="steps-post", color="tab:blue", lw=1.2,
                label="board's estimate (the splits were chosen on it)")
    if steps:
        end = max(max(f["t"] for f in frames), steps[-1]["t"])
        ax.plot([s["t"] for s in steps] + [end], [s["rate_mbit"] for s in steps] + [steps[-1]["rate_mbit"]],
                drawstyle="steps-post", color="black", lw=2.0, ls=(0, (4, 2)),
                label=f"link's real rate ({steps[0]['set_by'] or 'recorded'})")
        values += [s["rate_mbit"] for s in steps]
    notes = []
    if not rated:
        notes.append("no rate estimate:\nnothing was offloaded or probed")
    if not steps:
        notes.append("the link's real rate: not in this\ntrace (a testbed run records it)")
    if notes:  # beside the panel, under its legend: inside, it would cover the lines
        ax.text(1.01, 0.0, "\n".join(notes), transform=ax.transAxes, ha="left", va="bottom", fontsize=8, color="dimgrey")
    if values:
        _plain_rate_axis(ax, min(values), max(values))
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.set_yticks([])
    ax.set_ylabel("link rate (Mbit/s)")


def _draw_drops(plt: ModuleType, ax: Any, frames: Sequence[dict[str, Any]], drops: dict[str, int]) -> None:
    """The drop track: a tick at each dropped frame's capture time, one row per reason."""
    colours = _reason_colours(plt, drops)
    for row, reason in enumerate(drops):
        times = [f["t"] for f in frames if f.get("dropped") and timeline.drop_reason(f) == reason]
        ax.scatter(times, [row] * len(times), marker="|", s=120, color=colours[reason],
                   label=f"{timeline.reason_label(reason)}: {drops[reason]}")
    total = sum(drops.values())
    if drops:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="why dropped", title_fontsize=8)
    else:
        ax.text(0.5, 0.5, "no frame dropped", transform=ax.transAxes, ha="center", va="center", fontsize=9)
    ax.set_yticks([])
    ax.set_ylim(-0.7, max(len(drops), 1) - 0.3)
    ax.set_ylabel("dropped", rotation=0, ha="right", va="center")
    ax.set_title(f"dropped frames (never answered, so not on the latency axis): {total} of {len(frames)}", fontsize=9)


def _reason_colours(plt: ModuleType, reasons: Iterable[str]) -> dict[str, Any]:
    """One colour per drop reason, the same in every plot of a report."""
    cmap = plt.get_cmap("Set1")
    return {reason: cmap(i % cmap.N) for i, reason in enumerate(reasons)}


def _plain_rate_axis(ax: Any, low: float, high: float) -> None:
    """A y axis of rates in plain Mbit/s numbers (1, 2, 5, 10, ...), never "3×10⁰": logarithmic
    where they span more than a factor of 4 (a step from 50 to 1 Mbit/s stays readable), else linear from 0."""
    if high > 4 * low:
        ax.set_yscale("log")
        ax.set_ylim(low / 1.4, high * 1.4)
        _plain_log_ticks(ax.yaxis, low / 1.4, high * 1.4)
    else:
        from matplotlib.ticker import ScalarFormatter

        ax.yaxis.set_major_formatter(ScalarFormatter(useOffset=False))
        ax.set_ylim(0, high * 1.15)


def _plain_log_ticks(axis: Any, low: float, high: float) -> None:
    """Ticks of a log axis from ``low`` to ``high`` at 1, 2, 3, 5 × 10^k (1, 2, 5 × 10^k over more
    than two decades, the powers of ten alone over more than four), labelled as plain numbers."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    decades = math.log10(high / low)
    mantissas = (1,) if decades > 4 else (1, 2, 5) if decades > 2 else (1, 2, 3, 5)
    ticks = [m * 10.0 ** k for k in range(first, last + 1) for m in mantissas if low <= m * 10.0 ** k <= high]
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_minor_formatter(NullFormatter())


@plain_text
def plot_latency_cdf(frames: Sequence[dict[str, Any]], path: str | Path, note: str = "") -> None:
    """Empirical CDF of the answered frames' total latency: one curve per series (a split, or the
    local split's frames by why they ran there: :func:`answer_series`) and one for all.

    A series' curve left of "all" is where the run was fast; the dotted lines mark p50 and p95.
    """
    _require(frames, "latency CDF")
    plt = _pyplot()
    answered = _answered(frames)
    series = answer_series(answered)
    styles = _series_styles(plt, series)
    fig, ax = plt.subplots(figsize=(8, 4.8))
    curves = [(series_label(key), [f["total_ms"] for f in answered if _series_of(f) == key], styles[key][0], 1.5,
               styles[key][2]) for key in series]
    if len(series) > 1:
        curves.append(("all", [f["total_ms"] for f in answered], _ALL_COLOUR, 2.5, "-"))
    for label, values, colour, width, style in curves:
        draw_cdf(ax, values, colour, width, f"{label} ({len(values)})", style)
    if not answered:
        ax.text(0.5, 0.5, "no answered frames", transform=ax.transAxes, ha="center", va="center")
    else:
        ax.legend(fontsize=8, loc="lower right")
    ax.set_xlabel("total latency (ms)")
    ax.set_ylabel("fraction of frames ≤ latency")
    ax.set_title("latency distribution by split (local: by why it ran there)" + _noted(note))
    _save(plt, fig, path)


def draw_cdf(ax: Any, values: Sequence[float], colour: Any, width: float, label: str, style: str = "-") -> None:
    """One empirical CDF of ``values`` (not empty) as steps from 0, in line ``style``, with the p50
    and p95 levels dotted: also the comparison's, where every run is a curve."""
    x = np.sort(np.asarray(values, dtype=float))
    y = np.arange(1, len(x) + 1) / len(x)
    ax.step(np.concatenate([[x[0]], x]), np.concatenate([[0.0], y]), where="post", color=colour, lw=width, ls=style,
            label=label)
    for q in (0.5, 0.95):
        ax.axhline(q, color="grey", ls=":", lw=0.8)
    ax.set_ylim(0, 1.02)


@plain_text
def plot_drop_rate(frames: Sequence[dict[str, Any]], path: str | Path, window_s: float = 1.0, note: str = "") -> None:
    """Share of the frames captured in each ``window_s`` window that were dropped, stacked by reason
    (the colours of the drop track in ``latency_over_time``).

    Windows are aligned on the first capture, and widened to whole seconds past
    :data:`MAX_DROP_WINDOWS` of them. A window with no frame has no rate: it is shaded grey instead,
    which tells a stalled source from a window where nothing was dropped. ``note``: the title's
    second line (a sample's, :func:`fieldtrial._report.sample_note`).
    """
    _require(frames, "drop rate")
    if not window_s > 0:
        raise SplitEdgeError(f"window_s must be > 0 s, got {window_s!r}")
    plt = _pyplot()
    t = np.array([f["t"] for f in frames], dtype=float)
    start = t.min()
    if t.max() - start > window_s * MAX_DROP_WINDOWS:  # a day in windows of 1 s: 86,400 bars
        window_s = float(math.ceil((t.max() - start) / MAX_DROP_WINDOWS))
    windows = np.floor((t - start) / window_s).astype(int)
    count = np.bincount(windows)
    seen = count > 0
    left = start + np.flatnonzero(seen) * window_s
    drops = timeline.drops_by_reason(frames)
    colours = _reason_colours(plt, drops)
    fig, ax = plt.subplots(figsize=(10, 3.6))
    bottom = np.zeros(int(seen.sum()))
    for reason, n in drops.items():
        mine = np.array([bool(f.get("dropped")) and timeline.drop_reason(f) == reason for f in frames])
        share = 100.0 * np.bincount(windows, weights=mine, minlength=len(count))[seen] / count[seen]
        ax.bar(left, share, width=window_s, bottom=bottom, align="edge", color=colours[reason], alpha=0.85,
               edgecolor="white", linewidth=0.3, label=f"{timeline.reason_label(reason)}: {n}")
        bottom += share
    for i, k in enumerate(np.flatnonzero(~seen)):  # shaded, so that "no frames" does not read as "0 % dropped"
        ax.axvspan(start + k * window_s, start + (k + 1) * window_s, color="lightgrey", alpha=0.6, lw=0,
                   label="no frame captured" if i == 0 else None)
    if drops or not seen.all():
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="why dropped", title_fontsize=8)
    ax.set_xlabel("time since the run started (s, at capture)")
    ax.set_ylabel(f"dropped (% of the frames\ncaptured in each {window_s:g} s)")
    ax.set_ylim(0, 105)
    dropped = sum(drops.values())
    ax.set_title(f"drop rate: {dropped} of {len(frames)} frames dropped ({100.0 * dropped / len(frames):.1f} %)"
                 + _noted(note))
    _save(plt, fig, path)


#: Stage and wait colours of the measured-vs-model bars: stages solid (dotted in the model's bar),
#: waits hatched; in the order a frame goes through them, bottom up.
_STAGE_COLOURS = {"preprocess": "tab:purple", "head": "tab:blue", "transfer": "tab:orange", "tail": "tab:green"}
_STAGE_LABELS = {"preprocess": "preprocessing", "head": "head (board)", "transfer": "transfer (link)",
                 "tail": "tail (host)"}
_WAIT_COLOURS = {"queue": "lightgrey", "slot": "silver", "host_queue": "darkgrey"}
_WAIT_LABELS = {"queue": "wait: board queue", "slot": "wait: in-flight slot", "host_queue": "wait: host queue"}


@plain_text
def plot_measured_vs_model(comparison: dict[str, dict[str, Any]], path: str | Path) -> None:
    """Per split, two stacked bars: the model's prediction (DSC Eq. 4: head, transfer, tail, and
    preprocessing where the calibration timed it) and what was measured, stage by stage, with the
    measured waits (board queue, in-flight slot, host queue) hatched on top. Medians of the
    summary's ``predicted_vs_measured``. A stage the calibration has no time for is drawn in the
    measured bar only, and the model's bar says so; the figure above each pair is measured ÷
    model over the stages the model predicts, so queueing shows as its own height rather than
    as a model that is off.
    """
    if not comparison:
        raise SplitEdgeError("nothing to plot (measured vs model): no split with a model and frames")
    plt = _pyplot()
    splits = list(comparison)
    x = np.arange(len(splits), dtype=float)
    width = 0.38
    fig, ax = plt.subplots(figsize=(max(7.0, 2.0 * len(splits) + 3.5), 5.4))
    labelled: set[str] = set()
    covered = " + ".join(s for s in _STAGE_COLOURS if s not in next(iter(comparison.values()))["unmodelled_stages"])

    def bar(position: float, height: float, bottom: float, colour: Any, label: str, hatch: str | None = None) -> None:
        ax.bar(position, height, width, bottom=bottom, color=colour, edgecolor="white", hatch=hatch,
               label=None if label in labelled else label)
        labelled.add(label)

    for i, split in enumerate(splits):
        c = comparison[split]
        model_top = 0.0
        for stage in (s for s in _STAGE_COLOURS if s not in c["unmodelled_stages"]):
            height = c["stages"][stage]["predicted_ms"]
            bar(x[i] - width / 2, height, model_top, _STAGE_COLOURS[stage], f"{_STAGE_LABELS[stage]}, model", hatch="..")
            model_top += height
        if c["unmodelled_stages"]:
            missing = ", ".join(_STAGE_LABELS[s] for s in c["unmodelled_stages"])
            ax.text(x[i] - width / 2, model_top, f"no {missing}\nin the\ncalibration", ha="center", va="bottom",
                    fontsize=7, color="dimgrey")
        top = 0.0
        for stage, colour in _STAGE_COLOURS.items():
            height = c["stages"][stage]["measured_ms"]
            bar(x[i] + width / 2, height, top, colour, f"{_STAGE_LABELS[stage]}, measured")
            top += height
        for wait, colour in _WAIT_COLOURS.items():
            if c["waits_ms"] is not None and c["waits_ms"][wait] > 0:
                bar(x[i] + width / 2, c["waits_ms"][wait], top, colour, _WAIT_LABELS[wait], hatch="//")
                top += c["waits_ms"][wait]
        if c["ratio"] is not None:
            ax.text(x[i], max(top, model_top), f"measured ÷ model\nof {covered}: {c['ratio']:.2f}", ha="center",
                    va="bottom", fontsize=8)
    ax.set_xticks(np.concatenate([x - width / 2, x + width / 2]))
    ax.set_xticklabels(["model"] * len(splits) + ["measured"] * len(splits), fontsize=8)
    for i, split in enumerate(splits):
        ax.annotate(split_label(split), (x[i], 0), xytext=(0, -24), textcoords="offset points", xycoords=("data", "axes fraction"),
                    ha="center", va="top", fontsize=9, fontweight="bold")
    ax.margins(y=0.18)
    ax.set_ylabel("median time per frame (ms)")
    handles, labels = ax.get_legend_handles_labels()  # model stages, then measured, then waits
    order = sorted(range(len(labels)), key=lambda k: (not labels[k].endswith("model"), k))
    ax.legend([handles[k] for k in order], [labels[k] for k in order], fontsize=8, loc="upper left",
              bbox_to_anchor=(1.01, 1.0))
    ax.set_title("where the time went, per split: the model's prediction against what was measured\n"
                 "(the waits are queueing, which the model does not predict)", fontsize=9)
    _save(plt, fig, path)
