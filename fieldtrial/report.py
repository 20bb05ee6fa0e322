"""``split-device report``: what a ``--trace`` run did, in numbers (summary.json) and pictures.

The summary answers the questions a run is made to answer: how fast (latency percentiles,
frames per second), how lossy (drop rate), where the frames ran and for how long, how often
the split moved, and, given the board's calibration, what the switching was worth against
each split held static (DSC Eq. 7) and how far the latency model is from what was measured.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

import calibration as cal
from calibration import Calibration, CalibrationError, gains_over_static
from device_runtime.bundle import LOCAL
from fieldtrial import plots
from fieldtrial.trace import read_trace
from splitedge.errors import SplitEdgeError

__all__ = ["PLOTS", "SUMMARY_FILE", "format_summary", "summarize", "write_report"]

SUMMARY_FILE = "summary.json"
PLOTS = {
    "latency_over_time.png": plots.plot_latency_over_time,
    "latency_cdf.png": plots.plot_latency_cdf,
    "drop_rate.png": plots.plot_drop_rate,
}
_RUN_FIELDS = ("bundle_id", "policy", "batch", "source", "started_unix")


def _percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """p50 / p95 / p99 / mean with numpy's default (linear) interpolation; None when empty."""
    if not values:
        return {"p50": None, "p95": None, "p99": None, "mean": None}
    x = np.asarray(values, dtype=float)
    p50, p95, p99 = np.percentile(x, [50, 95, 99])
    return {"p50": float(p50), "p95": float(p95), "p99": float(p99), "mean": float(x.mean())}


def _per_split(answered: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Frames, share of frames, seconds in effect and latency of each split that ran.

    ``seconds`` attributes the time from one answered frame's capture to the next answered
    frame's capture to the split of the first: that split was in effect until the next answer
    shows another. This follows the real timeline (a split that ran few slow frames still
    held the link for a long time), which a share of frames times the duration would not.
    The last answered frame closes the timeline and adds nothing, so the seconds add up to
    the span from the first to the last answered capture.
    """
    spans = [b["t"] - a["t"] for a, b in zip(answered, answered[1:])] + [0.0]
    out: dict[str, dict[str, Any]] = {}
    for split in plots.graph_order(f["split"] for f in answered):
        mine = [i for i, f in enumerate(answered) if f["split"] == split]
        latency = _percentiles([answered[i]["total_ms"] for i in mine])
        out[split] = {
            "frames": len(mine),
            "share": len(mine) / len(answered),
            "seconds": float(sum(spans[i] for i in mine)),
            "p50_ms": latency["p50"],
            "p95_ms": latency["p95"],
        }
    return out


def _gain(calibration: Calibration, answered: list[dict[str, Any]]) -> dict[str, Any]:
    """DSC Eq. 7 over the run's own states, and the model's prediction against the measurement.

    The scenario S is the run itself: one state (batch, rate) per answered frame, with the
    rate the device estimated when it chose that frame's split. T_dyn is the calibrated model's
    time for the split that actually ran, T_SS its time for each split held static. Frames
    without a rate estimate (none yet at the start of a run, or no host) have no state and are
    left out, as are frames whose split the model does not know; both are counted.

    Eq. 7 takes |T_dyn - T_SS|: with DSC's argmin T_dyn <= T_SS and the gain is a saving; with
    the run's own choices (table rounding, hysteresis, a stale estimate) a state where the run
    chose a split predicted slower than the static one would count as gain too. The report
    takes the signed form, so such states count as losses.
    """
    known = set(calibration.model.names)
    modelled = [f for f in answered if f["split"] in known]
    states = [f for f in modelled if f.get("rate_bps")]
    gain = None
    if states:
        choices = iter([f["split"] for f in states])
        gain = gains_over_static(
            calibration.model, [(f["batch"], f["rate_bps"]) for f in states], dynamic=lambda batch, rate: next(choices),
            signed=True,
        )
    return {
        "gain_over_static": gain,
        "gain_scenario": {
            "states": len(states),
            "without_rate": len(modelled) - len(states),
            "unmodelled_split": len(answered) - len(modelled),
        },
        "predicted_vs_measured": _predicted_vs_measured(calibration, modelled),
    }


def _predicted_vs_measured(calibration: Calibration, modelled: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per split: median measured ms (total minus preprocessing, which the model leaves out)
    against the median of the model's DSC Eq. 4 prediction at each frame's (batch, rate).

    ``ratio`` is measured / predicted: above 1 the board, link or host ran slower than
    calibrated. LOCAL needs no rate (T_L = head); the other splits use the frames with one.
    """
    out: dict[str, dict[str, Any]] = {}
    for split in plots.graph_order((f["split"] for f in modelled), calibration.model.names):
        mine = [f for f in modelled if f["split"] == split and (split == LOCAL or f.get("rate_bps"))]
        if not mine:
            continue
        measured = float(np.median([f["total_ms"] - f["preprocess_ms"] for f in mine]))
        predicted = float(np.median([calibration.model.predict_ms(split, f["batch"], f["rate_bps"]) for f in mine]))
        out[split] = {
            "frames": len(mine),
            "measured_ms": measured,
            "predicted_ms": predicted,
            "ratio": measured / predicted if predicted > 0 else None,
        }
    return out


def summarize(run: dict[str, Any], frames: list[dict[str, Any]], calibration: Calibration | None) -> dict[str, Any]:
    """The numbers of one traced run (see the module docstring); JSON-ready.

    Latencies are over answered frames only: a dropped frame was never classified. ``fps`` is
    answered frames per second of capture time (first to last capture, dropped frames
    included), None for a run of a single instant. A split's ``seconds`` are the spans from
    each of its answered frames to the next answered capture (see :func:`_per_split`).

    With a ``calibration``: ``gain_over_static`` (split -> DSC Eq. 7 gain of the run's own
    choices over that split held static, computed with the calibrated model at the rates the
    run estimated; None when no frame had a rate), ``gain_scenario`` (how many states that
    used and how many frames were left out: no rate estimate, or a split the model lacks) and
    ``predicted_vs_measured`` (split -> measured and predicted medians and their ratio).
    """
    if not frames:
        raise SplitEdgeError("no frames to summarize")
    frames = sorted(frames, key=lambda f: (f["t"], f["index"]))
    answered = [f for f in frames if not f.get("dropped")]
    duration = frames[-1]["t"] - frames[0]["t"]
    summary: dict[str, Any] = {
        "run": {key: run.get(key) for key in _RUN_FIELDS},
        "frames": len(frames),
        "answered": len(answered),
        "dropped": len(frames) - len(answered),
        "drop_rate": (len(frames) - len(answered)) / len(frames),
        "duration_s": duration,
        "fps": len(answered) / duration if duration > 0 else None,
        "latency_ms": _percentiles([f["total_ms"] for f in answered]),
        "per_split": _per_split(answered),
        "switches": sum(a["split"] != b["split"] for a, b in zip(answered, answered[1:])),
        "fallbacks": sum(1 for f in frames if f.get("error")),
        "calibration": None,
    }
    if calibration is not None:
        summary["calibration"] = {"bundle_id": calibration.bundle_id, "created": calibration.created}
        try:
            summary.update(_gain(calibration, answered))
        except CalibrationError as exc:  # a trace value the model refuses (a batch of 0, say)
            raise SplitEdgeError(f"cannot compare the run with its calibration: {exc}") from exc
    return summary


def _calibration_for(run: dict[str, Any], trace_path: Path, given: Calibration | None) -> Calibration | None:
    """The given calibration, else the one the run recorded if its file is still there.

    Either way it must be the run's bundle's: another bundle's timings describe another network.
    """
    calibration = given
    recorded = run.get("calibration")
    if calibration is None and recorded and Path(recorded).exists():
        try:
            calibration = cal.load(recorded)
        except CalibrationError as exc:
            raise SplitEdgeError(f"{trace_path}: the run's calibration {recorded}: {exc}") from exc
    if calibration is not None and calibration.bundle_id != run.get("bundle_id"):
        raise SplitEdgeError(
            f"{trace_path}: the calibration is for bundle {calibration.bundle_id}, "
            f"the run was of bundle {run.get('bundle_id')}"
        )
    return calibration


def write_report(trace_path: str | Path, out_dir: str | Path, calibration: Calibration | None = None) -> dict[str, Any]:
    """Read a trace, write ``summary.json`` and the three plots into ``out_dir``; return the summary.

    Without ``calibration``, the file the run recorded is used when it still exists (a trace
    copied off the board usually travels without it; the report then has no gains). A relative
    recorded path is taken from the current directory, as the run took it.
    """
    trace_path = Path(trace_path)
    run, frames = read_trace(trace_path)
    if not frames:
        raise SplitEdgeError(f"no frames in {trace_path}")
    summary = summarize(run, frames, _calibration_for(run, trace_path, calibration))
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise SplitEdgeError(f"cannot write the report into {out_dir}: {exc}") from exc
    for name, plot in PLOTS.items():
        plot(frames, out_dir / name)
    return summary


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def format_summary(summary: dict[str, Any]) -> str:
    """The table ``split-device report`` prints: speed, losses, where the time went, what switching gained."""
    run, latency = summary["run"], summary["latency_ms"]
    fps = "-" if summary["fps"] is None else f"{summary['fps']:.2f}"
    lines = [
        f"bundle {run['bundle_id']}  policy {run['policy']}  batch {run['batch']}  source {run['source']}",
        f"frames {summary['frames']}: {summary['answered']} answered, {summary['dropped']} dropped "
        f"({100.0 * summary['drop_rate']:.1f} %), {summary['fallbacks']} fell back to local",
        f"duration {summary['duration_s']:.2f} s  {fps} fps  {summary['switches']} split switches",
        f"latency ms  p50 {_ms(latency['p50'])}  p95 {_ms(latency['p95'])}  p99 {_ms(latency['p99'])}  "
        f"mean {_ms(latency['mean'])}",
        "",
        f"{'split':28s} {'frames':>7s} {'share':>7s} {'seconds':>8s} {'p50 ms':>8s} {'p95 ms':>8s}",
    ]
    for split, s in summary["per_split"].items():
        lines.append(
            f"{plots.split_label(split):28s} {s['frames']:7d} {100.0 * s['share']:6.1f}% {s['seconds']:8.2f} "
            f"{_ms(s['p50_ms']):>8s} {_ms(s['p95_ms']):>8s}"
        )
    gains, scenario = summary.get("gain_over_static"), summary.get("gain_scenario")
    if scenario is not None:
        lines += ["", f"gain of this run's switching over each static split (DSC Eq. 7, calibrated model, "
                      f"{scenario['states']} states; left out: {scenario['without_rate']} without a rate estimate, "
                      f"{scenario['unmodelled_split']} on a split the model lacks)"]
        if gains is None:
            lines.append("  none: no answered frame had a rate estimate")
        for split in plots.graph_order(gains or ()):
            lines.append(f"  {plots.split_label(split):28s} {100.0 * gains[split]:7.1f} %")
    comparison = summary.get("predicted_vs_measured")
    if comparison:
        lines += ["", f"{'measured vs model (median)':28s} {'frames':>7s} {'measured':>9s} {'model':>9s} {'ratio':>6s}"]
        for split, c in comparison.items():
            ratio = "-" if c["ratio"] is None else f"{c['ratio']:.2f}"
            lines.append(
                f"{plots.split_label(split):28s} {c['frames']:7d} {c['measured_ms']:9.1f} {c['predicted_ms']:9.1f} {ratio:>6s}"
            )
    return "\n".join(lines)
