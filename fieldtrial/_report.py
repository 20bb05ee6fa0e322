"""``split-device report``: what a ``--trace`` run did, in numbers (summary.json) and pictures.

The summary answers the questions a run is made to answer: how fast (latency percentiles,
frames per second), how lossy (drop rate), where the frames ran and for how long (a frame run
on the board by choice apart from one run there after a deadline refusal or a host failure),
how often the split moved (counted as the run counts it), how far each frame was from its own
compute (the floor) and, given the board's calibration, from the fastest option at the link's
rate (the oracle: :mod:`fieldtrial._bounds`), what the switching was worth against each split
held static (DSC Eq. 7) and how far the latency model is from what was measured.

The model (DSC Eq. 4) predicts the stages of one batch on an idle pipeline: head, transfer,
tail, and preprocessing where the calibration timed it. A frame of a real run also waits (in
the board's queue for its head, for an in-flight slot, in the host's queue), and those waits
grow with the load, not with the split: the comparison sets the measured stages against the
model and shows the waits beside them, so a run that queued is not read as a model 5x off.
Preprocessing is always measured and shown as a stage of its own; a calibration without its
time says so instead of predicting one.

Dropped frames are counted by the reason the trace gives, and where a testbed shaped the link
the trace's real rate is read back beside the board's estimate (:mod:`fieldtrial._timeline`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from calibration.calibration_file import load_all
from calibration import CalibrationError, gains_over_static
from calibration.calibration_file import Calibration, Calibrations
from device_runtime import LOCAL
from fieldtrial import _bounds as bounds, _plots as plots, _timeline as timeline
from fieldtrial._tally import MAX_KEPT, Tally
from fieldtrial._trace import MAX_SHOWN, OTHER, Trace, load_trace, records_waits
from splitedge import SplitEdgeError, shown

__all__ = ["PLOTS", "SUMMARY_FILE", "format_summary", "strict_json", "summarize", "write_report"]

SUMMARY_FILE = "summary.json"
#: The plots of every report, each drawn from the trace and its answered frames' bounds (floor, oracle).
PLOTS: dict[str, Callable[[Trace, list[bounds.Bound], Path], None]] = {
    "latency_over_time.png": lambda trace, frame_bounds, path: plots.plot_latency_over_time(
        trace.frames, path, trace.link_rates, frame_bounds, _changes(trace), sample_note(trace)),
    "latency_cdf.png": lambda trace, frame_bounds, path: plots.plot_latency_cdf(trace.frames, path,
                                                                                 sample_note(trace)),
    "drop_rate.png": lambda trace, frame_bounds, path: plots.plot_drop_rate(trace.frames, path,
                                                                             note=sample_note(trace)),
}


def sample_note(trace: Trace) -> str:
    """What a figure of ``trace`` says where it is drawn from a sample of its frames; "" where not."""
    if trace.tally is None or not trace.sampled:
        return ""
    return f"a sample of {len(trace.frames):,} of {trace.tally.frames:,} frames (at most {MAX_KEPT:,} kept)"


def _changes(trace: Trace) -> tuple[list[float], int] | None:
    """The split changes over every frame (the first times of them, and how many), where counted."""
    return None if trace.tally is None else (trace.tally.change_times, trace.tally.changes)


_RUN_FIELDS = ("bundle_id", "policy", "batch", "source", "started_unix", "backend", "precision", "calibration_key")
MODEL_PLOT = "measured_vs_model.png"
#: A frame's stages in the order it goes through them, as the trace names them; the model predicts
#: those :meth:`calibration.LatencyModel.terms_ms` returns (DSC Eq. 4: head, transfer, tail).
STAGES = ("preprocess", "head", "transfer", "tail")
#: What the summary says of a stage the calibration has no time for.
NOT_CALIBRATED = "not in the calibration: measured only"
#: The waits a trace records (schema 2), as the summary names them.
WAITS = {"queue": "queue_ms", "slot": "slot_ms", "host_queue": "host_queue_ms"}


def _percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """p50 / p95 / p99 / mean with numpy's default (linear) interpolation; None when empty."""
    if not values:
        return {"p50": None, "p95": None, "p99": None, "mean": None}
    x = np.asarray(values, dtype=float)
    p50, p95, p99 = np.percentile(x, [50, 95, 99])
    return {"p50": float(p50), "p95": float(p95), "p99": float(p99), "mean": float(x.mean())}


def _per_split(answered: list[dict[str, Any]], tally: Tally) -> dict[str, dict[str, Any]]:
    """Frames, share of frames, seconds in effect, latency and median bytes a frame crossed the link
    in (a coded option's, ``SPLIT@k4``, its coding's) of each split that ran.

    ``seconds`` attributes the time from one answered frame's capture to the next answered
    frame's capture to the split of the first: that split was in effect until the next answer
    shows another. This follows the real timeline (a split that ran few slow frames still
    held the link for a long time), which a share of frames times the duration would not.
    The last answered frame closes the timeline and adds nothing, so the seconds add up to
    the span from the first to the last answered capture. Counted over every frame (``tally``);
    the latencies are over ``answered`` (a sample past :data:`MAX_KEPT`).
    """
    latencies: dict[str, list[float]] = {}  # one pass: a pass per split was quadratic in the splits
    sent: dict[str, list[float]] = {}  # what each frame crossed the link in, where the trace says
    for f in answered:
        latencies.setdefault(f["split"], []).append(f["total_ms"])
        if isinstance(f.get("bytes"), (int, float)):
            sent.setdefault(f["split"], []).append(f["bytes"])
    counts = tally.splits.all()
    out: dict[str, dict[str, Any]] = {}
    for split in plots.graph_order(counts):
        latency = _percentiles(latencies.get(split, []))
        out[split] = {
            "frames": counts[split],
            "share": counts[split] / tally.answered,
            "seconds": float(tally.seconds.get(split, 0.0)),
            "p50_ms": latency["p50"],
            "p95_ms": latency["p95"],
            # a frame's bytes on the link (its share of a batch's; 0 on the board; None: not traced)
            "bytes_per_frame": float(np.median(sent[split])) if split in sent else None,
        }
    return out


def _local_causes(answered: list[dict[str, Any]], tally: Tally) -> dict[str, dict[str, Any]]:
    """The frames answered on the board, by why they ran there (:func:`timeline.local_cause`): each
    cause's frames, share of the answered frames and latency. A deadline refusal and a host
    failure cost a frame its offload and the full model's time on top: lumped with the frames the
    policy chose to run here, they would read as a slow local split. Counted over every frame
    (``tally``); the latencies are over ``answered``."""
    out: dict[str, dict[str, Any]] = {}
    for cause in timeline.LOCAL_CAUSES:
        frames = tally.causes.get(cause, 0)
        if frames:
            latency = _percentiles([f["total_ms"] for f in answered if timeline.local_cause(f) == cause])
            out[cause] = {"frames": frames, "share": frames / tally.answered, "p50_ms": latency["p50"],
                          "p95_ms": latency["p95"]}
    return out


def _gain(calibration: Calibration, answered: list[dict[str, Any]], waits: bool) -> dict[str, Any]:
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
        "predicted_vs_measured": _predicted_vs_measured(calibration, modelled, waits),
    }


#: The figures of a summary taken from the frames kept (:data:`MAX_KEPT`), estimated where they are
#: a sample; every count (frames, drops, splits' frames and seconds, causes, reasons, changes,
#: deadline misses, duration, fps) is over every frame.
ESTIMATED = ("latency_ms", "per_split.p50_ms", "per_split.p95_ms", "local_causes.p50_ms", "local_causes.p95_ms",
             "link_rate.estimate_over_real", "floor", "oracle", "gain_over_static", "gain_scenario",
             "predicted_vs_measured", "the plots")


def _sample(kept: int, tally: Tally) -> dict[str, Any]:
    """What the summary's distributions were taken from: ``kept`` frames of ``frames`` (all of them up
    to ``cap``); ``estimated``: the figures taken from a sample (:data:`ESTIMATED`), empty where every
    frame was kept. ``seconds_out_of_order``: answered frames written further out of capture order
    than the report reorders (:data:`fieldtrial._tally.REORDER_WINDOW`), left out of the splits' seconds."""
    return {"frames_kept": kept, "frames": tally.frames, "cap": MAX_KEPT,
            "estimated": list(ESTIMATED) if tally.frames > kept else [],
            "seconds_out_of_order": tally.out_of_order}


def _median(values: Sequence[float]) -> float:
    return float(np.median(values))


def _predicted_vs_measured(
    calibration: Calibration, modelled: list[dict[str, Any]], waits: bool,
) -> dict[str, dict[str, Any]]:
    """Per split, medians over its frames: the model's DSC Eq. 4 prediction at each frame's
    (batch, rate) against the stage times measured, stage by stage, and the waits beside them.

    ``stages`` has every stage of :data:`STAGES`, measured; ``predicted_ms`` is None with a
    ``model`` note for a stage the calibration has no time for (preprocessing, in a calibration
    that did not time it), and ``unmodelled_stages`` lists them. ``calibrated_over_measured`` has,
    per modelled stage, the calibration's time ÷ the run's (median over median; None where the run
    measured none): the head's is how much faster the board was when calibrated than in this run
    (a shared or throttled board shows below 1 there), the figure a policy deciding on calibrated
    head times gets wrong. ``predicted_ms`` and
    ``stages_ms`` sum the modelled stages only, so ``ratio`` (measured / predicted) compares
    like with like: above 1 the board, link or host ran slower than calibrated. It leaves out
    the waits, which the model does not predict (a frame that waits in a queue says the
    pipeline was loaded, not that a stage was slow). ``waits_ms`` has the median of each wait
    and of their sum (``all``); ``end_to_end_ms`` is capture to answer, everything included,
    and ``end_to_end_ratio`` its ratio to the prediction, the figure that mixes it all. A
    schema 1 trace recorded no waits (None) and counted the host's queue in its tail. LOCAL
    needs no rate (T_L = head); the other splits use the frames with one. Frames answered here
    after a failed offload are left out: their head time holds the failed attempt's head and
    the full model.
    """
    out: dict[str, dict[str, Any]] = {}
    model = calibration.model
    for split in plots.graph_order((f["split"] for f in modelled), model.names):
        mine = [f for f in modelled if f["split"] == split and not f.get("error") and (split == LOCAL or f.get("rate_bps"))]
        if not mine:
            continue
        terms = [model.terms_ms(split, f["batch"], f["rate_bps"] or 0.0) for f in mine]
        covered = [stage for stage in STAGES if stage in terms[0]]  # the stages the model predicts
        stages = {stage: _stage(stage, mine, terms, stage in covered) for stage in STAGES}
        predicted = _median([sum(t[stage] for stage in covered) for t in terms])
        measured = _median([sum(f[f"{stage}_ms"] for stage in covered) for f in mine])
        end_to_end = _median([f["total_ms"] for f in mine])
        waited = None
        if waits:
            waited = {name: _median([f.get(key, 0.0) for f in mine]) for name, key in WAITS.items()}
            waited["all"] = _median([sum(f.get(key, 0.0) for key in WAITS.values()) for f in mine])
        out[split] = {
            "frames": len(mine),
            "predicted_ms": predicted,
            "stages_ms": measured,
            "ratio": measured / predicted if predicted > 0 else None,
            "waits_ms": waited,
            "end_to_end_ms": end_to_end,
            "end_to_end_ratio": end_to_end / predicted if predicted > 0 else None,
            "stages": stages,
            "calibrated_over_measured": {
                stage: (stages[stage]["predicted_ms"] / stages[stage]["measured_ms"]
                        if stages[stage]["measured_ms"] >= bounds.MIN_MS else None)
                for stage in covered
            },
            "unmodelled_stages": [stage for stage in STAGES if stage not in covered],
        }
    return out


def _stage(
    stage: str, frames: list[dict[str, Any]], terms: list[dict[str, float]], modelled: bool,
) -> dict[str, Any]:
    """One stage's measured median and the model's, or a note that the calibration has none."""
    measured = _median([f[f"{stage}_ms"] for f in frames])
    if modelled:
        return {"measured_ms": measured, "predicted_ms": _median([t[stage] for t in terms])}
    return {"measured_ms": measured, "predicted_ms": None, "model": NOT_CALIBRATED}


def summarize(
    run: dict[str, Any], frames: list[dict[str, Any]], calibration: Calibration | None, waits: bool = True,
    link_rates: Sequence[dict[str, Any]] = (), tally: Tally | None = None,
) -> dict[str, Any]:
    """The numbers of one traced run (see the module docstring); JSON-ready.

    ``frames`` in the order the trace wrote them (the order the run answered them): the split
    changes are counted in that order. Latencies are over answered frames only: a dropped frame
    was never classified; the dropped ones are counted per reason in ``drops_by_reason``
    (:func:`timeline.drops_by_reason`). ``split_changes`` counts the answered frames whose split
    differs from the frame answered before them, as the run counts them
    (:func:`timeline.split_changes`). ``local_causes`` has the frames answered on the board by why
    (:func:`_local_causes`): by choice, after a deadline refusal (``deadline_refusals`` counts
    them), after a host failure (``fallbacks`` counts them), or fallen back in a trace that does
    not say which. ``floor`` and ``oracle`` set each answered frame against its own compute and
    against the calibration's fastest option at the link's rate
    (:func:`fieldtrial._bounds.summarize_bounds`; ``oracle`` is None without a calibration).
    ``deadline_misses`` counts the answered frames answered after their deadline
    (:func:`timeline.deadline_misses`, None where none had one); ``split_reasons`` the answered
    frames per kind of reason for their split (trace schema 4; empty before it).
    ``link_rate`` has the link's real rate where a testbed recorded it (``real``: its steps in
    Mbit/s from ``t`` on, ``[]`` when the trace has none, from its ``link_rates`` records) and
    the board's estimate over it (``estimate_over_real``, :func:`timeline.estimate_over_real`). ``fps`` is
    answered frames per second of capture time (first to last capture, dropped frames
    included), None for a run of a single instant. A split's ``seconds`` are the spans from
    each of its answered frames to the next answered capture (see :func:`_per_split`).

    With a ``calibration``: ``gain_over_static`` (split -> DSC Eq. 7 gain of the run's own
    choices over that split held static, computed with the calibrated model at the rates the
    run estimated; None when no frame had a rate), ``gain_scenario`` (how many states that
    used and how many frames were left out: no rate estimate, or a split the model lacks) and
    ``predicted_vs_measured`` (split -> the model's prediction against the measured stages,
    stage by stage, with the waits beside them: :func:`_predicted_vs_measured`). ``waits``
    says whether the frames record their waits (trace schema 2).
    ``tally``: the counts of every frame where ``frames`` are a sample of a long trace
    (:func:`fieldtrial._trace.load_trace`); None counts ``frames``. ``sample`` says how many frames the
    distributions were taken from and which figures are estimated (:func:`_sample`).
    """
    if not frames:
        raise SplitEdgeError("no frames to summarize")
    if tally is None:
        tally = Tally.of(frames)
    kept = len(frames)
    frames = sorted(frames, key=lambda f: (f["t"], f["index"]))
    answered = [f for f in frames if not f.get("dropped")]
    local = _local_causes(answered, tally)
    duration = tally.last_t - tally.first_t
    steps = timeline.real_rate_steps(link_rates)
    summary: dict[str, Any] = {
        "run": {key: run.get(key) for key in _RUN_FIELDS},
        "frames": tally.frames,
        "answered": tally.answered,
        "dropped": tally.frames - tally.answered,
        "drop_rate": (tally.frames - tally.answered) / tally.frames,
        "drops_by_reason": tally.drops_by_reason(),
        "duration_s": duration,
        "fps": tally.answered / duration if duration > 0 else None,
        "latency_ms": _percentiles([f["total_ms"] for f in answered]),
        "per_split": _per_split(answered, tally),
        "local_causes": local,
        "split_changes": tally.changes,
        "fallbacks": local.get(timeline.AFTER_FAILURE, {}).get("frames", 0),
        "deadline_refusals": local.get(timeline.AFTER_DEADLINE, {}).get("frames", 0),
        "deadline_misses": tally.deadline_misses(),
        "split_reasons": tally.split_reasons(),
        "sample": _sample(kept, tally),
        "link_rate": {"real": steps, "estimate_over_real": timeline.estimate_over_real(frames, steps)},
        "floor": None,
        "oracle": None,
        "calibration": None,
    }
    try:
        summary.update(bounds.summarize_bounds(
            bounds.frame_bounds(answered, steps, calibration.model if calibration is not None else None)))
        if calibration is not None:
            summary["calibration"] = {"bundle_id": calibration.bundle_id, "created": calibration.created,
                                      "backend": calibration.backend, "precision": calibration.precision}
            summary.update(_gain(calibration, answered, waits))
    except CalibrationError as exc:  # a trace value the model refuses (a batch of 0, say)
        raise SplitEdgeError(f"cannot compare the run with its calibration: {exc}") from exc
    return summary


def _calibration_for(
    run: dict[str, Any], trace_path: Path, given: Calibration | Calibrations | None,
) -> Calibration | None:
    """The given calibration, else the one the run recorded if its file is still there; of a file's
    tables, the one the run chose its splits with (its ``calibration_key``), else the latest.

    Either way it must be the run's bundle's: another bundle's timings describe another network.
    """
    tables: Calibration | Calibrations | None = given
    recorded = run.get("calibration")
    if tables is None and isinstance(recorded, str) and recorded and Path(recorded).exists():
        try:
            tables = load_all(recorded)
        except CalibrationError as exc:
            raise SplitEdgeError(f"{trace_path}: the run's calibration {shown(recorded)}: {exc}") from exc
    if tables is not None and tables.bundle_id != run.get("bundle_id"):
        raise SplitEdgeError(
            f"{trace_path}: the calibration is for bundle {tables.bundle_id}, "
            f"the run was of bundle {shown(run.get('bundle_id'))}"
        )
    if isinstance(tables, Calibrations):
        key = run.get("calibration_key")
        table = tables.get(*key) if isinstance(key, list) and len(key) == 2 else None
        return table if table is not None else tables.latest()
    return tables


def write_report(
    trace_path: str | Path, out_dir: str | Path, calibration: Calibration | Calibrations | None = None,
    trace: Trace | None = None,
) -> dict[str, Any]:
    """Read a trace, write ``summary.json`` and the plots into ``out_dir``; return the summary.

    Without ``calibration``, the file the run recorded is used when it still exists (a trace
    copied off the board usually travels without it; the report then has no gains and no
    comparison with the model). Of a file's tables, the one the run used is taken. A relative
    recorded path is taken from the current directory, as the run took it. With a
    calibration, :data:`MODEL_PLOT` shows the model against the measured stages and waits.
    ``trace``: the trace at ``trace_path`` already read (a comparison reads each once: twice held a
    big trace twice in memory).
    """
    trace_path = Path(trace_path)
    if trace is None:
        trace = load_trace(trace_path)
    if not trace.frames:
        raise SplitEdgeError(f"no frames in {trace_path}")
    table = _calibration_for(trace.run, trace_path, calibration)
    summary = summarize(trace.run, trace.frames, table, records_waits(trace.run), trace.link_rates, trace.tally)
    summary["grouped"] = trace.grouped
    if trace.rates_left_out:
        summary["link_rate"]["records_left_out"] = trace.rates_left_out
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / SUMMARY_FILE).write_text(strict_json(summary, trace_path) + "\n", encoding="utf-8")
    except OSError as exc:
        raise SplitEdgeError(f"cannot write the report into {out_dir}: {exc}") from exc
    answered = sorted((f for f in trace.frames if not f.get("dropped")), key=lambda f: (f["t"], f["index"]))
    frame_bounds = bounds.frame_bounds(answered, timeline.real_rate_steps(trace.link_rates),
                                       table.model if table is not None else None)
    for name, plot in PLOTS.items():
        plot(trace, frame_bounds, out_dir / name)
    if summary.get("predicted_vs_measured"):
        plots.plot_measured_vs_model(summary["predicted_vs_measured"], out_dir / MODEL_PLOT)
    return summary


def strict_json(summary: dict[str, Any], source: str | Path) -> str:
    """``summary`` as strict JSON (RFC 8259: no NaN, no Infinity); a value that is none is an error
    naming ``source`` in one line, not a traceback or a file other tools refuse."""
    try:
        return json.dumps(summary, indent=2, allow_nan=False)
    except ValueError as exc:
        raise SplitEdgeError(f"{source}: the summary holds a value JSON has no number for: {exc}") from exc


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def format_summary(summary: dict[str, Any]) -> str:
    """The table ``split-device report`` prints: speed, losses, where the time went, what switching gained."""
    run, latency = summary["run"], summary["latency_ms"]
    fps = "-" if summary["fps"] is None else f"{summary['fps']:.2f}"
    lines = [
        f"bundle {run['bundle_id']}  policy {run['policy']}  batch {run['batch']}  source {run['source']}",
        f"frames {summary['frames']}: {summary['answered']} answered, {summary['dropped']} dropped "
        f"({100.0 * summary['drop_rate']:.1f} %)",
        f"duration {summary['duration_s']:.2f} s  {fps} fps  {summary['split_changes']} split changes",
        f"latency ms  p50 {_ms(latency['p50'])}  p95 {_ms(latency['p95'])}  p99 {_ms(latency['p99'])}  "
        f"mean {_ms(latency['mean'])}",
        *_local_lines(summary["local_causes"]),
        *_bound_lines(summary["floor"], summary["oracle"]),
        *_drop_lines(summary["drops_by_reason"]),
        *_deadline_lines(summary["deadline_misses"]),
        *_reason_lines(summary["split_reasons"]),
        *_link_rate_lines(summary["link_rate"]),
        *_grouped_lines(summary.get("grouped") or {}),
        *_sample_lines(summary.get("sample")),
        "",
        f"{'split':28s} {'frames':>7s} {'share':>7s} {'seconds':>8s} {'p50 ms':>8s} {'p95 ms':>8s} {'B/frame':>9s}",
    ]
    for split, s in summary["per_split"].items():
        sent = s.get("bytes_per_frame")
        lines.append(
            f"{plots.split_label(split):28s} {s['frames']:7d} {100.0 * s['share']:6.1f}% {s['seconds']:8.2f} "
            f"{_ms(s['p50_ms']):>8s} {_ms(s['p95_ms']):>8s} {'-' if sent is None else f'{sent:,.0f}':>9s}"
        )
        if split == LOCAL:  # each cause of its frames under it, so a refusal is not read as a choice
            for cause, c in summary["local_causes"].items():
                lines.append(f"  {timeline.local_cause_label(cause, short=True):26s} {c['frames']:7d} "
                             f"{100.0 * c['share']:6.1f}% {'':8s} {_ms(c['p50_ms']):>8s} {_ms(c['p95_ms']):>8s}")
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
        modelled = " + ".join(stage for stage in STAGES if stage not in next(iter(comparison.values()))["unmodelled_stages"])
        lines += [
            "",
            f"measured vs model (medians, ms): the model's stages (DSC Eq. 4: {modelled}) against the measured ones; "
            "preprocessing measured; the waits (board queue, in-flight slot, host queue) apart",
            f"{'split':28s} {'frames':>7s} {'model':>8s} {'stages':>8s} {'ratio':>6s} {'preproc':>8s} {'waits':>8s} "
            f"{'end-to-end':>10s} {'ratio':>6s}",
        ]
        for split, c in comparison.items():
            waits = c["waits_ms"]["all"] if c["waits_ms"] is not None else None
            lines.append(
                f"{plots.split_label(split):28s} {c['frames']:7d} {c['predicted_ms']:8.1f} {c['stages_ms']:8.1f} "
                f"{_ratio(c['ratio']):>6s} {c['stages']['preprocess']['measured_ms']:8.1f} {_ms(waits):>8s} "
                f"{c['end_to_end_ms']:10.1f} {_ratio(c['end_to_end_ratio']):>6s}"
            )
        lines.append("  calibrated ÷ measured, per stage (below 1: the stage ran slower than calibrated):")
        for split, c in comparison.items():
            ratios = ", ".join(f"{stage} {_ratio(r)}" for stage, r in c["calibrated_over_measured"].items())
            lines.append(f"    {plots.split_label(split)}: {ratios}")
        if any(c["unmodelled_stages"] for c in comparison.values()):
            lines.append("  (the calibration has no preprocessing time: the model's figures leave it out)")
        if any(c["waits_ms"] is None for c in comparison.values()):
            lines.append("  (a schema 1 trace: no waits recorded; the host's queue is counted in the tail)")
    return "\n".join(lines)


def _local_lines(causes: dict[str, dict[str, Any]]) -> list[str]:
    """The frames answered on the board, by why, on one line where any was."""
    if not causes:
        return []
    return ["answered on the board: " + ", ".join(f"{c['frames']} {timeline.local_cause_label(cause)}"
                                                  for cause, c in causes.items())]


def _bound_lines(floor: dict[str, Any] | None, oracle: dict[str, Any] | None) -> list[str]:
    """The latencies against each frame's floor and oracle, with the rate each took."""
    lines = []
    if floor is not None:
        ratio = floor["latency_over_floor"]
        lines.append(f"against each frame's own compute (floor, p50 {floor['p50_ms']:.1f} ms, {floor['frames']} "
                     f"frames{_rate_note(floor['rate'])}): latency ÷ floor, median of ratios "
                     f"{ratio['median_of_ratios']:.2f}, ratio of medians {ratio['ratio_of_medians']:.2f}")
    if oracle is not None:
        lines.append(f"against the calibration's fastest option at the link's rate (oracle, p50 "
                     f"{oracle['p50_ms']:.1f} ms, {oracle['frames']} frames{_rate_note(oracle['rate'])}): "
                     f"latency ÷ oracle, mean over frames {oracle['latency_over_oracle']['mean_of_ratios']:.2f}")
    return lines


def _rate_note(rate: dict[str, int]) -> str:
    """Which rate a figure took: says so where frames took the board's estimate, as no real rate was recorded."""
    if not rate[bounds.ESTIMATE]:
        return ""
    return (f"; at the board's rate estimate on {rate[bounds.ESTIMATE]} frames (no real rate recorded there), "
            f"the real rate on {rate[bounds.REAL]}")


def _drop_lines(by_reason: dict[str, int]) -> list[str]:
    """The dropped frames' count per reason, on one line where any was dropped."""
    if not by_reason:
        return []
    return ["dropped, by reason: " + ", ".join(f"{n} {timeline.reason_label(r)}" for r, n in by_reason.items())]


def _deadline_lines(misses: dict[str, Any] | None) -> list[str]:
    """How many answered frames missed their deadline, where frames had one."""
    if misses is None:
        return []
    return [f"deadline missed by {misses['missed']} of {misses['with_deadline']} answered frames "
            f"({100.0 * misses['share']:.1f} %)"]


def _reason_lines(reasons: dict[str, int]) -> list[str]:
    """Why the splits were chosen (trace schema 4), on one line where the trace says."""
    if not reasons:
        return []
    return ["split chosen by: " + ", ".join(f"{n} {timeline.split_reason_label(r)}" for r, n in reasons.items())]


#: The most steps of the link's real rate the printed summary lists (summary.json has every one).
_STEPS_LISTED = 12


def _link_rate_lines(link_rate: dict[str, Any]) -> list[str]:
    """The link's real rate and the estimate against it, where a testbed recorded the rate."""
    steps, ratio = link_rate["real"], link_rate["estimate_over_real"]
    if not steps:
        return []
    rates = " → ".join(f"{s['rate_mbit']:g}" for s in steps[:_STEPS_LISTED])
    if len(steps) > _STEPS_LISTED:  # a long run's thousand steps made a line of thousands of numbers
        rates += f" → … ({len(steps):,} steps in all)"
    line = f"link's real rate ({steps[0]['set_by'] or 'recorded'}): {rates} Mbit/s"
    if ratio is not None:
        line += (f"; the board's estimate ÷ the real rate: p5 {ratio['p5']:.2f}, p50 {ratio['p50']:.2f}, "
                 f"p95 {ratio['p95']:.2f} over {ratio['frames']} frames")
    return [line]


def _grouped_lines(grouped: dict[str, dict[str, int]]) -> list[str]:
    """What the trace had too many distinct values of to show apart (:data:`fieldtrial._trace.MAX_SHOWN`)."""
    words = {"split": "splits", "drop_reason": "drop reasons", "reason": "kinds of split reason"}
    return [f"{g['values']} more {words.get(name, name)} than {MAX_SHOWN} on {g['frames']} frames, shown as "
            f"'{OTHER}'" for name, g in grouped.items()]


def _sample_lines(sample: dict[str, Any] | None) -> list[str]:
    """Which figures were estimated from a sample of the frames, where they were."""
    if not sample or not sample["estimated"]:
        return []
    return [f"a long trace: percentiles, CDFs, bounds, gains and the model comparison are estimated from a "
            f"sample of {sample['frames_kept']:,} of its {sample['frames']:,} frames (the report keeps at most "
            f"{sample['cap']:,}); every count is over every frame"]


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
