"""``split-device run`` and ``calibrate`` assembled from typed settings: the library the CLI calls.

Following ``--split`` from the flag to the wire stays in this module: the camera ``auto`` stands
for, the calibration table of the backend that runs, the policy (the table, a fixed split, the
bandit), the hosts (``--host`` once, or once per chain stage or fragment), the pipeline and its
trace. The CLI parses flags into :class:`RunSettings` and prints what :class:`Output` is given.

What ``run`` prints (:class:`Output`): by default its start, a line for each change of the split
answering frames (from, to and why), a summary every ``summary_every_s`` seconds and a final
one (:class:`~device_runtime.stream._summary.RunEvents`), and a line per frame where the run ends
by itself (``--frames N``, a folder of images not looped, a video file: a person reads those
answers) but not for a live camera's (a service's log would fill with them); ``verbose`` adds a
line per frame for any source, ``quiet`` leaves only the final summary and warnings; ``json``
prints the same events as JSON lines (``event``: start, split_change, summary, final, and frame
when verbose: a program asks for frames itself) and sends the progress lines to ``warn``, so
that ``say`` (stdout) holds JSON alone.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from calibration import SplitTable
from calibration.bandit import BANDIT_FILENAME, Bandit
from calibration.calibration_file import Calibration, Calibrations, FILENAME, save
from calibration.chains import HostView
from calibration.fragments import place_fragments
from device_runtime.board import (
    DetectedBoard, LastRun, Rounds, Scene, calibrate, calibrations_for, detect_board, installed_backends,
    precision_of, resolve_backend, spread_warning,
)
from device_runtime.board.run_settings import CalibrateSettings, Connection, RunSettings, Runtime
from device_runtime.bundle import FULL, HEAD, LOCAL, OFFLOAD, Bundle
from device_runtime.engine import AUTO, DeviceRunner, default_split, usable_cpus
from device_runtime.hosts import HostLink, LinkMeter, connect_host, discover
from device_runtime.live import LiveBoard, LiveServer
from device_runtime.stream import (
    AutoPolicy, BanditPolicy, CameraLoad, DropForecast, FrameSource, Pipeline, PipelineConfig, PipelineStats,
    Reason, RunEvents, SplitPolicy, StaticPolicy, open_source, pi_camera_absent, read_pace,
)
from device_runtime.stream.trace import TraceWriter, frame_record, read_head_times
from device_runtime.link import Credentials, HostClient
from device_runtime.wire import client_context, load_key
from splitedge import SplitEdgeError
from splitedge.errors import BundleError, CameraError, HostUnavailableError
from splitedge.lifecycle import notify, stop_on_signals

__all__ = ["DEFAULT", "Output", "QUIET", "VERBOSE", "calibrate_board", "drop_forecast", "run_stream", "table_text"]

#: How much ``run`` prints (:class:`Output`): its start, split changes, summaries and the final one ...
DEFAULT = "default"
#: ... those and every frame ...
VERBOSE = "verbose"
#: ... the final summary alone (and warnings).
QUIET = "quiet"


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _stdout(line: str) -> None:
    print(line, flush=True)


@dataclass(frozen=True)
class Output:
    """Where the library's lines go: ``say`` for progress and answers, ``warn`` for what the user
    should act on. The CLI prints them; a test or an embedding application collects them.

    ``detail`` (:data:`DEFAULT`, :data:`VERBOSE`, :data:`QUIET`) and ``json`` choose what a run
    says (module docstring); its summaries come every ``summary_every_s`` seconds of ``clock``,
    which a test drives itself."""

    say: Callable[[str], None] = field(default=_stdout)
    warn: Callable[[str], None] = field(default=_stderr)
    detail: str = DEFAULT
    json: bool = False
    summary_every_s: float = 10.0
    clock: Callable[[], float] = field(default=time.monotonic)

    def progress(self, line: str) -> None:
        """A line about what the command is doing: on ``say``, or on ``warn`` where ``say`` holds
        JSON; none when quiet."""
        if self.detail != QUIET:
            (self.warn if self.json else self.say)(line)

    def event(self, record: dict[str, Any], line: str | None) -> None:
        """One of a run's events: as a JSON line, or as its text ``line`` (None: the progress
        lines already said it)."""
        if self.json:
            self.say(json.dumps(record, separators=(",", ":")))
        elif line is not None:
            self.say(line)


def _credentials(connection: Connection) -> Credentials:
    """The key and TLS context of --key-file and --tls-ca, checked before anything starts."""
    return Credentials(
        key=load_key(connection.key_file) if connection.key_file else None,
        tls=client_context(connection.tls_ca) if connection.tls_ca else None,
    )


def _runner(runtime: Runtime, bundle: Bundle, split_id: str, board: DetectedBoard, transmit: str = AUTO) -> DeviceRunner:
    backend = resolve_backend(runtime.backend, bundle, split_id, board)
    # --threads as given; else the board profile's, but never more than the process may use (a Pi 4's
    # 4 on a board pinned to one CPU would be four threads taking turns on it); else what it may use.
    threads = runtime.threads or min(board.profile.threads if board.profile else math.inf, usable_cpus())
    return DeviceRunner(bundle, threads=threads, backend=backend, transmit=transmit, precision=runtime.precision,
                        preprocess=runtime.preprocess)


async def run_stream(settings: RunSettings, out: Output = Output()) -> PipelineStats:
    """The stream, leaving its summary in ``last-run.json`` beside the bundle (split-device status)."""
    last_run = LastRun(settings.bundle)
    try:
        return await _run(settings, last_run, out)
    except BaseException as exc:
        last_run.failed(exc)
        raise
    finally:
        last_run.write()


async def _run(settings: RunSettings, last_run: LastRun, out: Output) -> PipelineStats:
    connection = settings.connection
    credentials = _credentials(connection)
    bundle = Bundle.load(settings.bundle, roles=(HEAD, FULL))
    board = detect_board()
    camera, chosen = _camera(settings.camera, board)
    if settings.head_times is not None and not settings.auto:
        raise SplitEdgeError(f"--head-times decides with a trace's head times: it needs --split auto, not "
                             f"--split {settings.split}")
    recorded = read_head_times(settings.head_times) if settings.head_times is not None else None
    pace = read_pace(settings.pace) if settings.pace is not None else None
    first = default_split(bundle) if settings.auto else settings.split
    # the split whose head runs first (a coded option's, ``SPLIT@k4``: checked here, before the camera)
    start_split = LOCAL if first in (LOCAL, OFFLOAD) else bundle.manifest.option(first)[0].id
    tables = _tables(bundle, out) if settings.auto else None
    runtime = settings.runtime
    if tables is not None and runtime.backend == AUTO:
        runtime = Runtime(_calibrated_backend(tables, bundle, start_split, board), runtime.precision, runtime.threads)
    runner = _runner(runtime, bundle, start_split, board, settings.transmit)
    calibration = _table_for(runner, tables, settings.bundle, out, recorded[0] if recorded else None) \
        if tables is not None else None
    auto = AutoPolicy(calibration, recorded=recorded[1] if recorded else None) if calibration is not None else None
    if recorded is not None:
        out.progress(f"deciding with the head times {settings.head_times} recorded ({len(recorded[1])} records: its "
                     "calibrated ones and each refinement, at the frames it made them), not this board's")
    policy: SplitPolicy = auto if auto is not None else StaticPolicy(first, bundle)
    warm = list(calibration.table.splits) if calibration is not None else [first]
    bandit = _bandit(settings, bundle)
    if bandit is not None:
        policy = BanditPolicy(policy, bundle, bandit[0], bandit[1])
        warm.append(bandit[0])
        out.progress(f"choosing per batch between the layer split and {bandit[0]} for a "
                     f"{settings.given_deadline_ms:g} ms deadline ({bandit[1].mode}: "
                     f"{'ε-greedy' if settings.learn else 'UCB'})")
    for split_id in {*warm, LOCAL}:
        runner.warm_up(split_id)
    out.progress(f"{board.describe()}: {runner.backend} backend, {runner.threads or 'default'} threads, "
            f"split {settings.split}")
    stop = asyncio.Event()
    stop_on_signals(stop)
    if pace is not None:  # a signal ends a hold at once, not after it (up to MAX_HOLD_MS of a frame)
        asyncio.ensure_future(stop.wait()).add_done_callback(lambda _: pace.stop())
    hosts = None if settings.local else await _hosts(settings, bundle, credentials, out)
    placements = _placements(bundle, settings.split, connection.host, connection.hops,
                             calibration.routes if calibration else {})
    if hosts is not None and connection.host == AUTO:
        placements["fragments"] = {**placements["fragments"], **await _spread_fragments(bundle, connection, out)}
    config = PipelineConfig(batch=settings.batch, queue=settings.queue, drop=settings.drop,
                            request_timeout_s=connection.timeout, deadline_ms=settings.deadline_ms, pace=pace,
                            **placements)
    if pace is not None:
        out.progress(f"running at the pace of the board that recorded {settings.pace}: each stage held to its time "
                     "there, frame by frame")
    meter = LinkMeter()
    if calibration is not None and calibration.link is not None:
        meter.estimator.observe_rtt(calibration.link["rtt_ms"] / 1000.0)
    pipeline = Pipeline(runner, policy, hosts, config, meter)
    last_run.watch(bundle, pipeline.stats, policy)
    trace = TraceWriter(settings.trace, _run_record(settings, camera, bundle, runner, calibration)) \
        if settings.trace else None
    live = LiveBoard() if settings.live is not None else None
    page: LiveServer | None = None
    try:
        if live is not None:  # --live: every result and frame published to the page (O(1) each)
            live.plan(calibration.table if calibration is not None else None, settings.batch)
            page = live.serve(settings.live, credentials.key)
            (out.warn if out.detail == QUIET else out.progress)(f"live page on {page.url}")
        with _open_camera(camera, settings, chosen, bundle.manifest.model.preprocess.resize) as source:
            out.progress(f"camera: {source.description}{chosen}")
            if (negotiation := source.negotiation()) is not None:
                out.progress(f"camera: {negotiation}")
            if auto is not None and source.live:  # choose for this camera's pace: frames answered count too
                auto.pace(source.frame_interval_s * 1000.0 if source.frame_interval_s else None)
            if trace is not None and auto is not None:
                auto.watch(trace.head_times)  # what it decides with (for this camera), now and at each change
            forecast = _forecast(settings, calibration or _own_table(bundle, runner), hosts, source)
            if forecast is not None:
                out.progress(forecast)
            # The summaries forecast drops again as the stream measures its stages (the page too).
            events = RunEvents(out.summary_every_s, out.clock, source.frame_interval_s if source.live else None)
            if live is not None:
                live.drops(events.drops.state)
            if out.detail != QUIET:
                out.event(_start_event(settings, bundle, board, runner, source.description, hosts), None)
            each_frame = _says_each_frame(out, settings, source)
            ready = False
            async for result in pipeline.run(source if live is None else live.watch(source), frames=settings.frames,
                                             stop=stop):
                if live is not None:
                    live.publish(result)
                if not ready:  # a frame answered: bundle, camera and a path to the result all work
                    notify(f"READY=1\nSTATUS=running {bundle.manifest.bundle_id} from {settings.bundle}")
                    ready = True
                if each_frame:
                    out.event({"event": "frame", **frame_record(result)}, result.line())
                for event in events.frame(result):
                    if out.detail != QUIET:
                        out.event(event, _event_line(event))
                if trace is not None:
                    trace.frame(result)
    finally:
        notify("STOPPING=1")
        if page is not None:
            page.close()
        if trace is not None:
            trace.close()
        if hosts is not None:
            await hosts.close()
        if bandit is not None:
            out.progress(f"kept what the bandit learned in {bandit[1].save(bundle.root / BANDIT_FILENAME)}")
    final = events.final()
    if isinstance(policy, AutoPolicy):
        final["policy_switches"] = policy.switches
    if pace is not None:
        final["paced"] = {"trace": settings.pace, "held": pace.held, "slower": pace.slower}
    out.event(final, _event_line(final))
    if pace is not None:
        out.progress(pace.summary())
    return pipeline.stats


def _start_event(
    settings: RunSettings, bundle: Bundle, board: DetectedBoard, runner: DeviceRunner, camera: str,
    hosts: HostLink | None,
) -> dict[str, Any]:
    """The run's first event: what it runs, where, and from which camera."""
    return {
        "event": "start", "bundle_id": bundle.id, "bundle": settings.bundle, "board": board.describe(),
        "backend": runner.backend, "precision": precision_of(runner), "threads": runner.threads,
        "policy": settings.split, "batch": settings.batch, "camera": camera,
        "host": hosts.address if hosts is not None and hosts.client is not None else None,
    }


def _event_line(event: dict[str, Any]) -> str:
    """A run's event as the line a person reads (:class:`~device_runtime.stream._summary.RunEvents`)."""
    if event["event"] == "split_change":
        reason = Reason.from_dict(event["reason"]).text() if event["reason"] else "unknown"
        was = f" (was {event['from']})" if event["from"] is not None else ""
        where = f" on {event['host']}" if event["host"] else ""
        return f"#{event['index']:<4d} split {event['to']}{was}{where}: {reason}"
    splits = ", ".join(f"{split} {share:.0%}" for split, share in event["splits"].items()) or "none"
    latency = (f"total p50 {event['p50_ms']:.1f} ms, p95 {event['p95_ms']:.1f} ms" if event["p50_ms"] is not None
               else "nothing answered")
    fps = f"{event['fps']:.1f} fps" if event["fps"] is not None else "fps unknown"
    hosts = ", ".join(event["hosts"]) or "none"
    if event["event"] == "summary":
        return (f"last {event['seconds']:.0f} s: {event['answered']} answered ({fps}), {event['dropped']} dropped, "
                f"{event['fallbacks']} fell back; {latency}; splits {splits}; host {hosts}{_drops_text(event)}")
    frames, dropped = event["frames"], event["dropped"]
    switches = f", {event['policy_switches']} split switches" if "policy_switches" in event else ""
    by_split = ", ".join(f"{k} {v}" for k, v in event["by_split"].items())
    return (f"{frames} frames: {dropped} dropped ({dropped / frames if frames else 0.0:.1%}), {event['fallbacks']} "
            f"answered locally after a host failure{switches}; by split: {by_split}; {latency}, {fps}"
            f"{_drops_text(event)}")


def _drops_text(event: dict[str, Any]) -> str:
    """A summary's drops against its forecast from the stage times measured, with the stage behind
    them (every drop reads ``queue_full``: this says why the queue was full). Nothing where there is
    no forecast (no live camera, nothing answered yet) or nothing dropped nor forecast to be."""
    forecast = event["forecast"]
    if forecast is None or not (event["dropped"] or forecast["drop_share"]):
        return ""
    return (f"; {event['drop_share']:.0%} dropped, {forecast['drop_share']:.0%} forecast from the last "
            f"{forecast['measured_frames']} answered: {forecast['cause']}")


async def _hosts(settings: RunSettings, bundle: Bundle, credentials: Credentials, out: Output) -> HostLink:
    """The host link, connected where a host answers; a fixed split without one is an error,
    ``--split auto`` starts locally and keeps looking."""
    connection = settings.connection
    hosts = HostLink(bundle, connection.host, connection.interface, timeout=connection.timeout,
                     credentials=credentials)
    if await hosts.connect():
        out.progress(f"host {hosts.address}: bundle {bundle.id}")
    elif not settings.auto:
        await hosts.close()
        raise SplitEdgeError(f"{hosts.last_error} (or run with --split auto to start locally and offload when "
                             "a host appears)")
    else:
        out.progress(f"no host yet ({hosts.last_error}); running locally, looking for one every {hosts.retry_s:g} s")
    return hosts


def _says_each_frame(out: Output, settings: RunSettings, source: FrameSource) -> bool:
    """A line per frame: with ``--verbose``; by default too in text where the run ends by itself
    (``--frames N``, a folder not looped, a video file), whose answers a person reads, and not for
    a live camera (or a synthetic one, its stand-in) without ``--frames``, run as a service."""
    if out.detail != DEFAULT:
        return out.detail == VERBOSE
    return not out.json and (settings.frames is not None or source.ends)


def _bandit(settings: RunSettings, bundle: Bundle) -> tuple[str, Bandit] | None:
    """The semantic split and the bandit choosing it per batch, where the run has one: a deadline,
    a semantic split in the bundle, and --split auto or a layer split (the other arm). The bandit
    goes on from what it learned before (``bandit.json`` beside ``calibration.json``)."""
    semantic = [s.id for s in bundle.manifest.splits if s.fragments]
    if settings.given_deadline_ms is None or not semantic or settings.split in (*semantic, LOCAL):
        if settings.learn:
            why = ("needs --deadline-ms" if settings.given_deadline_ms is None else "needs a semantic split in the "
                   "bundle (split-export build --semantic K)" if not semantic else f"chooses for --split auto or a layer "
                   f"split, not {settings.split}")
            raise SplitEdgeError(f"--learn: the layer/semantic bandit {why}")
        return None
    path = bundle.root / BANDIT_FILENAME
    bandit = Bandit.load(path) if path.is_file() else Bandit()
    bandit.mode = "learn" if settings.learn else "run"
    return semantic[0], bandit


async def _spread_fragments(bundle: Bundle, connection: Connection, out: Output) -> dict[str, tuple[str, ...]]:
    """Each semantic split's fragments over the hosts zeroconf finds serving the bundle
    (:func:`calibration.place_fragments`: the least loaded, no two on one host while another is
    free), from the loads they advertise. Nothing found: every fragment on the connected host."""
    semantic = [s for s in bundle.manifest.splits if s.fragments]
    if not semantic:
        return {}
    adverts = await discover(bundle.id, connection.interface, timeout=connection.timeout)
    placed = {}
    for split in semantic:
        names = [split.stage_id(f.index) for f in split.fragments]
        views = [HostView(f"{a.address}:{a.port}", {n: {1: 0.0} for n in names}, a.load, rate_bps=1.0) for a in adverts]
        placement = place_fragments(split.id, names, split.tensor.bytes_per_sample, {1: 0.0}, views, batch=1) if views else None
        if placement is not None:
            placed[split.id] = placement.hosts
            out.progress(f"semantic split {split.id}: fragments on {', '.join(placement.hosts)}")
    return placed


def _placements(
    bundle: Bundle, split_id: str, first: str, hops: tuple[str, ...], placed: Mapping[str, tuple[str, ...]]
) -> dict[str, dict[str, tuple[str, ...]]]:
    """:class:`PipelineConfig`'s ``routes`` (each chain's hosts after the connected one) and
    ``fragments`` (each semantic split's fragments' hosts): the ``--host`` flags (``first``, then
    ``hops``) for the split named by ``--split``; otherwise a chain where calibration placed it
    (``placed``), else every stage or fragment on the connected host."""
    several = [s for s in bundle.manifest.splits if s.parts]
    later = {"routes": {s.id: tuple(placed.get(s.id, ())) for s in several if s.stages},
             "fragments": {s.id: () for s in several if s.fragments}}
    if not hops:
        return later
    split = next((s for s in several if s.id == split_id), None)
    if split is None:
        known = ", ".join(s.id for s in several) or "none in this bundle"
        raise SplitEdgeError(f"--host given {1 + len(hops)} times: the later ones are the hosts of a chain's stages "
                             f"or a semantic split's fragments; name it with --split (these splits: {known})")
    word = "stage" if split.stages else "fragment"
    if len(hops) != len(split.parts) - 1:
        raise SplitEdgeError(f"{split.kind} split {split.id} runs {word}s 1..{len(split.parts)} on hosts: give --host "
                             f"once per {word}, in order ({len(split.parts)}), or once for all of them on one host; "
                             f"got {1 + len(hops)}")
    if split.stages:
        later["routes"][split.id] = tuple(hops)
    else:
        later["fragments"][split.id] = (first, *hops)
    return later


def _open_camera(camera: str, settings: RunSettings, chosen: str, resize: int) -> FrameSource:
    """The source, its camera asked for frames at the model's ``resize`` so the board need not scale them."""
    try:
        return open_source(camera, loop=settings.loop, realtime=settings.realtime, resize=resize)
    except CameraError as exc:
        raise CameraError(f"{exc}{chosen}") from exc  # with why --camera auto took this one


def _camera(spec: str, board: DetectedBoard) -> tuple[str, str]:
    """The source ``--camera auto`` stands for here, and a note saying why (empty when named)."""
    if spec != AUTO:
        return spec, ""
    if not (board.model or "").startswith("Raspberry Pi"):
        return "0", " (auto: not a Raspberry Pi, so OpenCV camera 0)"
    absent = pi_camera_absent()
    if absent is None:
        return "picam", " (auto: a Raspberry Pi with a camera module)"
    return "0", f" (auto: OpenCV camera 0, no Pi camera: {absent})"


def _tables(bundle: Bundle, out: Output) -> Calibrations | None:
    """The bundle's calibration tables for ``--split auto`` (None, with a warning, when there are
    none: the run then holds the smallest cut)."""
    try:
        return calibrations_for(bundle)
    except BundleError as exc:
        out.warn(f"warning: {exc}; using split {default_split(bundle)} (the smallest cut) until then")
        return None


def _calibrated_backend(tables: Calibrations, bundle: Bundle, split_id: str, board: DetectedBoard) -> str:
    """``--backend auto`` with a calibration: the board profile's backend when it was calibrated, else the
    backend of the latest table that can run here (the table's timings are its backend's)."""
    preferred = resolve_backend(AUTO, bundle, split_id, board)
    if any(t.backend == preferred for t in tables.tables):
        return preferred
    installed = {b.format for b in installed_backends()}
    role = FULL if split_id == LOCAL else HEAD
    usable = tuple(t for t in tables.tables if t.backend in installed and bundle.has(split_id, role, fmt=t.backend))
    if not usable:
        return preferred
    return Calibrations(tables.bundle_id, tables.manifest_sha256, usable).latest().backend


def _table_for(
    runner: DeviceRunner, tables: Calibrations, bundle_dir: str, out: Output, recorded: dict[str, Any] | None = None,
) -> Calibration:
    """The table of the backend and precision ``runner`` runs. Without one, a one-line warning naming
    both and the command that measures it, and the nearest table (the same backend, else the same
    precision): its link and host times hold for any backend, and the head times of the splits
    this run takes are replaced by the ones it measures (AutoPolicy), which holds the cut better
    than no table at all would. Deciding with a trace's head times (``recorded``: its run record),
    the table that run chose with, where the bundle has it: its head times are the trace's anyway."""
    key = recorded.get("calibration_key") if recorded is not None else None
    if isinstance(key, list) and len(key) == 2 and (table := tables.get(*key)) is not None:
        return table
    backend, precision = runner.backend, precision_of(runner)
    table = tables.get(backend, precision)
    if table is not None:
        return table
    table = tables.nearest(backend, precision)
    out.warn(f"warning: {Path(bundle_dir) / FILENAME} was measured for {tables.describe()}, not for "
             f"{backend}/{precision}, which this run uses; choosing splits with the {'/'.join(table.key)} table "
             f"(its head times corrected as this run measures its own) — to measure this one, run split-device "
             f"calibrate {bundle_dir} --backend {backend} --precision {precision}")
    return table


def _own_table(bundle: Bundle, runner: DeviceRunner) -> Calibration | None:
    """The calibration table of what ``runner`` runs, for a run with a fixed split (which takes no
    table to choose with, so says nothing when there is none): the frames it will drop are still
    worth a line."""
    try:
        return calibrations_for(bundle).get(runner.backend, precision_of(runner))
    except BundleError:
        return None


def _forecast(
    settings: RunSettings, calibration: Calibration | None, hosts: HostLink | None, source: FrameSource,
) -> str | None:
    """:func:`drop_forecast` for the split the run starts with: ``--split auto`` starts with the
    table's choice at the calibrated link rate where a host answers (the run's first rate
    estimate is a probe of that link), locally without one; a fixed split is itself."""
    if calibration is None:
        return None
    split = settings.split
    if settings.auto:
        connected = hosts is not None and hosts.client is not None and calibration.link is not None
        split = calibration.table.lookup(settings.batch, calibration.link["rate_bps"]) if connected else LOCAL
    return drop_forecast(calibration, split, settings.batch, source)


def drop_forecast(calibration: Calibration, split: str, batch: int, source: FrameSource) -> str | None:
    """One line saying how many of a live camera's frames a stream through ``split`` will answer
    and how many it will drop, when the camera is faster than the board: the calibration's stages
    (:meth:`calibration.LatencyModel.stages_ms`) in the model the run's summaries forecast with
    from measured times (:class:`~device_runtime.stream.DropForecast`), naming the slowest. None
    when it keeps up, or when it cannot tell (no frame rate, a split the calibration did not time,
    a remote split calibrated without a link)."""
    interval = source.frame_interval_s if source.live else None
    model = calibration.model
    rate = calibration.link["rate_bps"] if calibration.link is not None else 0.0
    if not interval or split not in model.names or (split != LOCAL and not rate > 0):
        return None
    stages = model.stages_ms(split, batch, rate)
    preprocess = model.preprocess_ms or 0.0  # a frame's; the board's stage holds the batch's
    forecast = DropForecast(preprocess, stages["board"] / batch - preprocess, stages["link"] / batch,
                            stages["host"] / batch, interval * 1000.0)
    if forecast.share == 0.0:
        return None
    timed, got = calibration.preprocess, source.got
    if timed is None:
        note = ("; preprocessing is not in this calibration (counted as 0, so more will be dropped): calibrate "
                "again to time it")
    elif got is not None and got != (timed.width, timed.height):  # preprocessing's cost grows with the frame
        frame = f"{got[0]}x{got[1]}"
        note = f"; preprocessing timed on {timed.frame} frames, this camera gives {frame}: calibrate --frame {frame}"
    else:
        note = ""
    return (f"this board answers about {forecast.answered_fps:.2g} fps of this {1.0 / interval:.3g} fps camera; "
            f"{100.0 * forecast.share:.0f} % of frames will be dropped ({split}, batch {batch}: "
            f"{forecast.cause()}, as calibrated{note})")


def _run_record(
    settings: RunSettings, camera: str, bundle: Bundle, runner: DeviceRunner, calibration: Calibration | None,
) -> dict[str, object]:
    return {
        "bundle_id": bundle.id, "policy": settings.split, "batch": settings.batch, "source": camera,
        "calibration": str(Path(settings.bundle) / FILENAME) if calibration is not None else None,
        # The table the run chose its splits with, and what it ran: the report compares with the same table.
        "calibration_key": list(calibration.key) if calibration is not None else None,
        "backend": runner.backend, "precision": precision_of(runner), "threads": runner.threads,
        "transmit": settings.transmit, "host": settings.connection.host, "queue": settings.queue, "drop": settings.drop,
        "realtime": settings.realtime, "head_times": settings.head_times, "pace": settings.pace,
    }


async def calibrate_board(settings: CalibrateSettings, out: Output = Output()) -> Calibration:
    """Time the board's heads, the host's tails and the link; write ``calibration.json`` beside the
    bundle (keeping the other backends' tables) and return the new table."""
    connection = settings.connection
    bundle = Bundle.load(settings.bundle, roles=(HEAD, FULL))
    board = detect_board()
    runner = _runner(settings.runtime, bundle, bundle.manifest.splits[0].id if bundle.manifest.splits else LOCAL, board)
    out.progress(f"{board.describe()}: {runner.backend} backend, {runner.threads or 'default'} threads; "
            f"batches {', '.join(map(str, settings.batches))}, {settings.repeats} repeats"
            + (f" at {settings.fps:g} runs/s" if settings.fps > 0 else ""))
    credentials = _credentials(connection)
    client = None if settings.no_host else await connect_host(
        bundle, connection.host, connection.interface, timeout=connection.timeout, credentials=credentials,
        without_host="--no-host",
    )
    peers, loads = ([], {}) if client is None else await _chain_peers(bundle, connection, credentials,
                                                                      client.address, out)
    try:
        with ExitStack() as stack:
            camera = None if settings.camera is None else stack.enter_context(
                _camera_load(_camera(settings.camera, board)[0], bundle, out))
            fps = settings.fps or (1.0 / camera.source.frame_interval_s if camera is not None else 0.0)
            scene = Scene(fps, settings.frame) if camera is None else Scene(fps, camera.size, camera.latest)
            rounds = Rounds(settings.batches, settings.repeats, out.progress, settings.floor)
            result = await calibrate(runner, client, rounds,
                                     board.to_dict(), scene, peers, loads)
            if camera is not None:
                out.progress(f"camera {camera.source.description}: {camera.frames} frames captured while the board "
                             "was timed")
    finally:
        for host in (client, *peers):
            if host is not None:
                await host.close()
    warning = spread_warning(result.head_spread)
    if warning is not None:
        out.warn(warning)
    path = bundle.root / FILENAME
    tables = save(result, path)
    others = [f"{'/'.join(t.key)} ({t.created})" for t in tables.tables if t.key != result.key]
    out.progress(f"wrote {path}: the {'/'.join(result.key)} table" + (f", kept {', '.join(others)}" if others else ""))
    out.progress(table_text(result))
    if out.json:
        out.say(json.dumps(_calibration_summary(result, path, others)))
    return result


def _camera_load(spec: str, bundle: Bundle, out: Output) -> CameraLoad:
    """``calibrate --camera``: the run's camera, opened as the run opens it (a video file replayed at
    its own rate), capturing in a thread of its own while the board is timed. A source with no pace
    (a folder of images) is no camera: it would only spin."""
    no_pace = CameraError(f"--camera {spec}: calibrate times the board beside a live camera or a video file "
                          "replayed at its rate, and this source has no frame rate; give --frame WIDTHxHEIGHT instead")
    if Path(spec).is_dir():
        raise no_pace
    source = open_source(spec, loop=True, realtime=True, resize=bundle.manifest.model.preprocess.resize)
    if not source.live or not source.frame_interval_s:
        source.close()
        raise no_pace
    out.progress(f"camera {source.description}: capturing while the board is timed")
    return CameraLoad(source)


def _calibration_summary(calibration: Calibration, path: Path, kept: list[str]) -> dict[str, Any]:
    """What ``calibrate`` says of the table it wrote, as ``--json`` prints it."""
    timed = calibration.preprocess
    return {
        "calibration": str(path), "bundle_id": calibration.bundle_id, "backend": calibration.backend,
        "precision": calibration.precision, "created": calibration.created, "kept": kept,
        "preprocess_ms": None if timed is None else timed.spread.p50, "link": calibration.link,
        "table": {str(batch): [{"split": split, "lo_bps": lo, "hi_bps": hi} for split, lo, hi in
                               _spans(calibration.table, batch)] for batch in calibration.table.batches},
        "chains": {chain: list(hosts) for chain, hosts in calibration.routes.items()},
    }


async def _chain_peers(
    bundle: Bundle, connection: Connection, credentials: Credentials, first: str, out: Output
) -> tuple[list[HostClient], dict[str, float]]:
    """The other hosts a chain's later stages may run on: the later ``--host`` flags, or with
    ``--host auto`` every other host zeroconf finds serving the bundle (and the loads they
    advertise). One that cannot be reached is named and left out: the chain is placed on the others."""
    if not any(s.stages for s in bundle.manifest.splits):
        return [], {}
    addresses, loads = list(connection.hops), {}
    if connection.host == AUTO:
        adverts = await discover(bundle.id, connection.interface, timeout=connection.timeout)
        loads = {f"{a.address}:{a.port}": a.load for a in adverts}
        addresses = list(loads)
    peers = []
    for address in dict.fromkeys(a for a in addresses if a != first):
        try:
            peers.append(await connect_host(bundle, address, timeout=connection.timeout, credentials=credentials))
        except HostUnavailableError as exc:
            out.warn(f"peer {address} left out of chain placement: {exc}")
    return peers, loads


def table_text(calibration: Calibration) -> str:
    """For each batch size, the rate ranges over which each split is best (DSC Eq. 6), and what
    preprocessing a frame costs: every option pays it, so it changes no choice, but it adds to
    every time and can be the board's slowest stage."""
    table = calibration.table
    lines = [f"best split by batch size and link rate (bundle {calibration.bundle_id}, "
             f"{'/'.join(calibration.key)} heads, calibrated {calibration.created}):"]
    timed = calibration.preprocess
    if timed is None:
        lines.append("  preprocessing: not in this calibration (counted as 0); calibrate again to time it")
    else:
        lines.append(f"  preprocessing a {timed.frame} frame ({timed.path} path): {timed.spread.p50:.1f} ms, "
                     "in every option's time (it changes no choice)")
    for batch in table.batches:
        spans = [f"{split} {_mbit(lo)}–{_mbit(hi)}" if hi is not None else f"{split} ≥{_mbit(lo)}"
                 for split, lo, hi in _spans(table, batch)]
        lines.append(f"  B={batch:<3d} " + ";  ".join(spans))
    for chain, hosts in calibration.routes.items():
        lines.append(f"  chain {chain}: stage 1 on the host the board sends to, then {' > '.join(hosts)}")
    return "\n".join(lines)


def _spans(table: SplitTable, batch: int) -> list[tuple[str, float, float | None]]:
    """(split, from, to) along the rate axis for ``batch``, from the grid's first rate; the last
    one's ``to`` is None (no bound above)."""
    spans, low, current = [], table.rates_bps[0], table.lookup(batch, table.rates_bps[0])
    for rate, _, above in table.boundaries(batch):
        spans.append((current, low, rate))
        low, current = rate, above
    return [*spans, (current, low, None)]


def _mbit(rate_bps: float) -> str:
    return f"{rate_bps / 1e6:.3g} Mbit/s"
