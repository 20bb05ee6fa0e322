"""The pictures of a cut-point analysis, as PNG files beside ``points.json``, and of a build's cut
codings, beside ``codings.json``.

Each function takes the report dictionary (the same data the JSON holds) and writes one
figure; nothing here computes anything the report does not already say.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on a build machine or in CI

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

__all__ = ["plot_codings", "plot_exits", "plot_cui_curve", "plot_per_class", "plot_head_cost", "write_plots"]


def _ticks(ax: plt.Axes, ids: list[str], limit: int = 40) -> None:
    step = max(1, len(ids) // limit)
    ax.set_xticks(range(0, len(ids), step))
    ax.set_xticklabels(ids[::step], rotation=90, fontsize=7)


def _plain(text: str) -> str:
    """``text`` as matplotlib draws it, not as mathtext: a data path with two ``$`` is no formula."""
    return text.replace("$", r"\$")


def _save(fig: plt.Figure, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_cui_curve(report: dict[str, Any], path: Path) -> None:
    """I-SPLIT Fig. 3 style: the CUI curve, its local maxima, and the compression ratio c_l."""
    points = report["points"]
    ids = [p["id"] for p in points]
    cui = np.array([p["cui"]["global"] for p in points])
    ratio = np.array([p["compression_ratio"] for p in points])
    maxima = [ids.index(i) for i in report["summary"]["cui_maxima"]]
    best = ids.index(report["summary"]["recommended"])
    fig, ax = plt.subplots(figsize=(max(8, len(ids) * 0.18), 5))
    ax.plot(cui, color="goldenrod", lw=2, label="CUI (I-SPLIT Eq. 1-2)")
    ax.scatter(maxima, cui[maxima], marker="^", color="firebrick", zorder=3, label="local maxima (candidates)")
    ax.scatter([best], [cui[best]], marker="*", s=250, color="firebrick", zorder=4, label=f"recommended: {ids[best]}")
    ax.set_ylabel("CUI (mean over images)")
    ax.set_xlabel("cut point")
    _ticks(ax, ids)
    twin = ax.twinx()
    twin.plot(ratio, color="steelblue", lw=1, ls="--", label="compression ratio $c_l$ (DSC)")
    compressive = [i for i, p in enumerate(points) if p["compressive"]]
    twin.scatter(compressive, ratio[compressive], color="steelblue", s=18, label="compressive (DSC Eq. 3)")
    twin.axhline(1.0, color="steelblue", lw=0.5, alpha=0.5)
    twin.set_yscale("log")
    twin.set_ylabel("$c_l = |h_l| / |x|$")
    handles = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.08, 1.0))
    ax.set_title(f"{report['model']['name']}: where to cut ({report['data']['source']}, {report['data']['images']} images)")
    _save(fig, path)


def plot_per_class(report: dict[str, Any], path: Path) -> None:
    """One CUI curve per class, the global curve, and the class subset's if one was given."""
    points = report["points"]
    ids = [p["id"] for p in points]
    fig, ax = plt.subplots(figsize=(max(8, len(ids) * 0.18), 5))
    colours = plt.get_cmap("tab20")
    for k, name in enumerate(report["data"]["classes"]):
        values = [p["cui"]["per_class"].get(name) for p in points]
        if values[0] is not None:
            ax.plot(values, lw=1, color=colours(k % 20), label=name)
    ax.plot([p["cui"]["global"] for p in points], lw=3, color="black", label="all classes")
    if report["data"]["class_subset"]:
        ax.plot([p["cui"]["subset"] for p in points], lw=3, ls="--", color="firebrick",
                label="subset: " + ", ".join(report["data"]["class_subset"]))
    ax.set_ylabel("CUI")
    _ticks(ax, ids)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(f"{report['model']['name']}: CUI per class")
    _save(fig, path)


def plot_head_cost(report: dict[str, Any], path: Path) -> None:
    """What the board pays (head MACs) against what the link carries (bytes per sample)."""
    points = report["points"]
    nbytes = np.array([p["bytes_per_sample"]["float32"] for p in points])
    macs = np.array([p["head"]["macs"] for p in points], dtype=float)
    cui = np.array([p["cui"]["global"] for p in points])
    fig, ax = plt.subplots(figsize=(8, 6))
    sc = ax.scatter(nbytes, np.maximum(macs, 1), c=cui, cmap="viridis", s=25)
    fig.colorbar(sc, label="CUI")
    candidates = set(report["summary"]["cui_maxima"]) | set(report["summary"]["compressive"])
    for p, b, m in zip(points, nbytes, macs):
        if p["id"] in candidates:
            marker = "*" if p["id"] == report["summary"]["recommended"] else "o"
            ax.scatter([b], [max(m, 1)], facecolors="none", edgecolors="firebrick", s=120, marker=marker)
            ax.annotate(p["id"], (b, max(m, 1)), fontsize=7, xytext=(4, 4), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("bytes per sample at the cut (float32)")
    ax.set_ylabel("head multiply-accumulates (board)")
    ax.set_title(f"{report['model']['name']}: head cost vs link cost (circled: candidates)")
    _save(fig, path)


def plot_codings(report: dict[str, Any], path: Path) -> None:
    """Issue 47's curve: per split, the bytes a sample crosses in (log) against the answers kept,
    float32 and the k-bit codings on one line, today's per-tensor uint8 an open square beside it
    (as many bytes as k8: the two differ only in their scales); each point named by its coding."""
    metric = "top-1" if report["metric"] == "top1" else "top-1 agreement with the float32 model"
    fig, ax = plt.subplots(figsize=(8, 5))
    for curve in report["splits"]:
        points = sorted(curve["points"], key=lambda p: p["bytes_per_sample"])
        line_points = [p for p in points if p["coding"] != "uint8"]
        # "split _17": matplotlib's legend leaves out a label starting with "_", and ids may.
        (line,) = ax.plot([p["bytes_per_sample"] for p in line_points], [p["accuracy"] for p in line_points],
                          marker="o", lw=1.5, label=_plain(f"split {curve['split']} ({curve['kind']})"))
        for p in points:
            uint8 = p["coding"] == "uint8"
            if uint8:
                ax.scatter([p["bytes_per_sample"]], [p["accuracy"]], marker="s", s=60, facecolors="none",
                           edgecolors=line.get_color(), zorder=3)
            ax.annotate(p["coding"], (p["bytes_per_sample"], p["accuracy"]), fontsize=7, color=line.get_color(),
                        xytext=(3, -10 if uint8 else 3), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("bytes per sample crossing the link")
    ax.set_ylabel(metric)
    ax.legend(fontsize=8)
    ax.set_title(_plain(f"{report['model']}: cut codings, {report['measured_on']}"), fontsize=9, wrap=True)
    _save(fig, path)


def plot_exits(report: dict[str, Any], path: Path) -> None:
    """Issue 48's tables: per split, the share of frames its exit answers (x) against how those
    frames fare (y) as the threshold rises: their agreement with the full model (solid), and where
    labels exist the exit's top-1 (dashed) and the full model's on the same frames (dotted); each
    point of the agreement line named by its confidence threshold."""
    fig, ax = plt.subplots(figsize=(8, 5))
    for split in report["splits"]:
        rows = split["thresholds"]
        shares = [r["share"] for r in rows]
        (line,) = ax.plot(shares, [r["agreement"] for r in rows], marker="o", lw=1.5,
                          label=_plain(f"split {split['split']} ({split['kind']}): agreement"))
        for r in rows:
            ax.annotate(f"{r['confidence']:g}", (r["share"], r["agreement"]), fontsize=6, color=line.get_color(),
                        xytext=(3, 3), textcoords="offset points")
        if all(r["top1"] is not None for r in rows):
            ax.plot(shares, [r["top1"] for r in rows], ls="--", color=line.get_color(), lw=1,
                    label=_plain(f"split {split['split']}: exit's top-1"))
            ax.plot(shares, [r["full_top1"] for r in rows], ls=":", color=line.get_color(), lw=1,
                    label=_plain(f"split {split['split']}: full model's top-1, same frames"))
    ax.set_xlabel("share of frames the exit answers (threshold: its softmax maximum)")
    ax.set_ylabel("on the frames it answers")
    ax.legend(fontsize=7, loc="lower left")  # where the lines are not: a share of 1 answers the least well
    ax.set_title(_plain(f"{report['model']}: early exits, {report['measured_on']}"), fontsize=9, wrap=True)
    _save(fig, path)


def write_plots(report: dict[str, Any], out_dir: Path) -> list[Path]:
    paths = [out_dir / "cui_curve.png", out_dir / "cui_per_class.png", out_dir / "head_cost.png"]
    for plot, path in zip((plot_cui_curve, plot_per_class, plot_head_cost), paths):
        plot(report, path)
    return paths
