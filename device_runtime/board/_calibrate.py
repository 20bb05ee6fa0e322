"""``split-device calibrate``: measure this board, ask the host for its tail times, probe the link.

DSC (Eq. 4-6) needs the head time of every split and the full model on the board at every
batch size (not linear in the batch: measured, not extrapolated), the tail times on the
host, and the link. The board also pays for making each camera frame the model's input,
which DSC's model leaves out and which can cost more than a head (issue 29): it is timed on
a frame of the camera's size (``--frame``), by the path the run will take (``--preprocess``).
Each of these is measured where it runs: the board times its own sessions (warm-up, then
``repeats`` runs of each, with the threads the board profile says), the host times its tails
itself (the ``profile`` request), and the link is timed with pings: a small one for the round
trip, payloads for the rate. The table best_split[batch][rate] is computed from these and
stored in ``calibration.json`` beside the bundle, with the bundle's identity, so a board never
uses another bundle's timings, and under the backend and precision that ran the heads, beside
the tables of the others.

The board's options are timed round robin (every repeat runs every head at every batch size
once, and preprocesses one frame), so a slow spell of the board spreads over all of them
rather than making one look slow; each median is kept with its p10 and p90, and a wide spread
is reported: it means the board was busy while it was timed, and its table is worth measuring
again.
"""

from __future__ import annotations

import asyncio
import functools
import math
import statistics
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable, Mapping, NamedTuple, Sequence

import numpy as np

from calibration import CalibrationError, LatencyModel, SplitTable, SplitTimings, Spread, measure_round_robin
from calibration.calibration_file import Calibration, Calibrations, FILENAME, Preprocessing, load, load_all
from calibration.chains import ChainStage, HostView, Placement, chain_timings, place
from calibration import WIDE_MIN_MS, WIDE_RATIO, widest
from device_runtime.board._codings import AccuracyFloor
from device_runtime.bundle import FULL, HEAD, LOCAL, OFFLOAD, Bundle
from device_runtime.engine import DeviceRunner
from device_runtime.link import HostClient
from device_runtime.wire.ops import MAX_PROFILE_REPEATS
from splitedge.errors import BundleError, RemoteError

__all__ = [
    "DEFAULT_BATCHES", "DEFAULT_FRAME", "BoardTimes", "calibrate", "calibration_for", "calibrations_for",
    "manifest_sha256", "measure_board", "measure_link", "precision_of", "profile_host", "spread_warning",
]

DEFAULT_BATCHES = (1, 2, 4, 8, 16)
#: The frame (width, height) preprocessing is timed on unless ``--frame`` says: what a camera
#: opened without a size gives (an OpenCV camera's usual default, and ``picam``'s).
DEFAULT_FRAME = (640, 480)
#: The round robin's key of preprocessing: batch 0 is no head's (heads are keyed (split, batch >= 1)).
_PREPROCESS = ("preprocess", 0)
RTT_PINGS = 20
PROBE_BYTES = (256 * 1024, 1024 * 1024)  # two sizes: the rate is the slope, free of per-request costs
PROBE_REPEATS = 3
#: A host times one board's tails at a time: how long to wait for another board's calibration.
BUSY_WAIT_S = 300.0
BUSY_RETRY_S = 5.0
#: What of a host's announced profile budget a request is planned to fill: less than the host plans
#: with itself (its runs vary), so that the host runs what was asked rather than trimming it unseen.
BUDGET_SHARE = 0.7

Progress = Callable[[str], None]


def manifest_sha256(bundle: Bundle) -> str:
    """The manifest's identity digest (``manifest_sha256`` inside it, checked on load): the content the
    timings were measured for, whatever the file's whitespace."""
    return bundle.manifest.manifest_sha256


def calibration_for(bundle: Bundle, backend: str | None = None, precision: str | None = None) -> Calibration:
    """The bundle's ``calibration.json`` table for ``backend`` and ``precision`` (the latest table
    when not given), refused if missing, malformed or made for another bundle."""
    try:
        return load(bundle.root / FILENAME, bundle.id, manifest_sha256(bundle), backend, precision)
    except CalibrationError as exc:
        raise BundleError(str(exc)) from exc


def calibrations_for(bundle: Bundle) -> Calibrations:
    """Every table of the bundle's ``calibration.json``, refused as :func:`calibration_for` refuses."""
    try:
        return load_all(bundle.root / FILENAME, bundle.id, manifest_sha256(bundle))
    except CalibrationError as exc:
        raise BundleError(str(exc)) from exc


@dataclass(frozen=True)
class Rounds:
    """What every step of a calibration times: these batch sizes, this many repeats of each, the
    coded options whose measured answers clear ``floor`` beside the splits, and where it says how it
    goes (a line at a time)."""

    batches: Sequence[int] = DEFAULT_BATCHES
    repeats: int = 20
    progress: Progress = lambda line: None
    floor: AccuracyFloor = AccuracyFloor()

    def for_host(self) -> Rounds:
        """These rounds as a ``profile`` request may ask them (at most MAX_PROFILE_REPEATS repeats)."""
        return replace(self, repeats=min(self.repeats, MAX_PROFILE_REPEATS))


@dataclass(frozen=True)
class Scene:
    """What the board sees while it is timed: ``fps`` paces its runs as a camera would (0: back to
    back), preprocessing is timed on a frame of ``frame`` (width, height), or on ``camera``'s newest
    frame where the run's camera captures meanwhile (:class:`~device_runtime.stream.CameraLoad`)."""

    fps: float = 0.0
    frame: tuple[int, int] = DEFAULT_FRAME
    camera: Callable[[], np.ndarray] | None = None


class BoardTimes(NamedTuple):
    """What :func:`measure_board` timed: every head's spread (split -> batch -> spread; ``local``
    is the full model; a coded option's, ``SPLIT@k4``, its split's head and its encoding) and one
    frame's preprocessing."""

    heads: dict[str, dict[int, Spread]]
    preprocess: Spread


def _camera_frame(width: int, height: int) -> np.ndarray:
    """A (height, width, 3) RGB frame laid out as an OpenCV camera hands it over: BGR memory read
    with the channel axis reversed (:mod:`device_runtime.stream._camera`), since preprocessing's
    cost depends on how it reads the frame, not on what the frame shows."""
    bgr = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return bgr[..., ::-1]


def measure_board(
    runner: DeviceRunner, rounds: Rounds, scene: Scene = Scene(),
    clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], object] = time.sleep,
) -> BoardTimes:
    """p10/p50/p90 ms of every split's head and of the full model (``local``) at every batch
    size of ``rounds``, here, and of preprocessing one of the ``scene``'s frames by the runner's
    path, timed round robin (:func:`calibration.measure_round_robin`: every repeat runs every
    option once), paced as the scene's camera would."""
    batches, repeats, progress = rounds.batches, rounds.repeats, rounds.progress
    frame, camera = scene.frame, scene.camera
    shape = runner.bundle.manifest.model.input_shape
    rng = np.random.default_rng(0)
    inputs = {batch: rng.standard_normal((batch, *shape)).astype(np.float32) for batch in batches}
    targets = [(s.id, HEAD) for s in runner.bundle.manifest.splits] + [(LOCAL, FULL)]
    calls: dict[tuple[str, int], Callable[[], object]] = {
        (split_id, batch): functools.partial(runner.session(split_id, role).run, inputs[batch])
        for split_id, role in targets for batch in batches
    }
    calls[_PREPROCESS] = functools.partial(runner.preprocess, _camera_frame(*frame)) if camera is None \
        else (lambda: runner.preprocess(camera()))
    coded = _encodings(runner, rounds, inputs)
    calls.update(coded)
    quarters = {max(1, round(repeats * q / 4)) for q in (1, 2, 3)}

    def cycle_done(cycle: int) -> None:
        if cycle in quarters and cycle < repeats:
            progress(f"board  {cycle}/{repeats} rounds of {len(calls)} runs (every head at every batch size, "
                     f"{'each coded option encoding its cut, ' if coded else ''}a frame's preprocessing)")

    samples = measure_round_robin(calls, repeats, fps=scene.fps, clock=clock, sleep=sleep, on_cycle=cycle_done)
    preprocess = Spread.of(samples[_PREPROCESS])
    progress(f"board  {'preprocess ' + 'x'.join(map(str, frame)):24s} {preprocess.p50:8.2f} ms "
             f"({preprocess.p10:.2f}–{preprocess.p90:.2f}) a frame, {runner.preprocess_path} path")
    times: dict[str, dict[int, Spread]] = {}
    for split_id, _ in targets:
        times[split_id] = {batch: Spread.of(samples[(split_id, batch)]) for batch in batches}
        progress(f"board  {split_id:24s} " + "  ".join(
            f"B={b}: {s.p50:8.2f} ms ({s.p10:.2f}–{s.p90:.2f})" for b, s in times[split_id].items()
        ))
    for option in dict.fromkeys(option for option, _ in coded):
        encode = {batch: Spread.of(samples[(option, batch)]) for batch in batches}
        times[option] = {batch: times[runner.option(option)[0]][batch].plus(encode[batch]) for batch in batches}
        progress(f"board  {option + ' encode':24s} " + "  ".join(
            f"B={b}: {s.p50:8.2f} ms ({s.p10:.2f}–{s.p90:.2f})" for b, s in encode.items()))
    return BoardTimes(times, preprocess)


def _encodings(runner: DeviceRunner, rounds: Rounds,
               inputs: Mapping[int, np.ndarray]) -> dict[tuple[str, int], Callable[[], object]]:
    """The round robin's calls encoding each offered coded option's cut (its split's head's output
    on the inputs) at every batch size, keyed (option, batch); a line for each option left out."""
    offered, left_out = rounds.floor.offered(runner.bundle.manifest)
    for line in left_out:
        rounds.progress(line)
    calls: dict[tuple[str, int], Callable[[], object]] = {}
    cuts: dict[tuple[str, int], np.ndarray] = {}
    for split, coding in offered:
        option = split.option(coding)
        for batch, x in inputs.items():
            cut = cuts.get((split.id, batch))
            if cut is None:
                cut = cuts[(split.id, batch)] = runner.session(split.id, HEAD).run(x)
            calls[(option, batch)] = functools.partial(runner.payload, option, cut)
    return calls


def spread_warning(heads: Mapping[str, Mapping[int, Spread]]) -> str | None:
    """One line naming the option timed with the widest spread, when any is wide (p90 more than
    WIDE_RATIO times p10 and WIDE_MIN_MS above it); None for a board that ran its repeats alike."""
    found = widest({(split, batch): s for split, by_batch in heads.items() for batch, s in by_batch.items()})
    if found is None:
        return None
    (split, batch), s = found
    return (
        f"warning: head times spread widely: {split} at B={batch} took {s.p10:.2f}–{s.p90:.2f} ms (p10–p90, "
        f"{s.ratio:.1f}x; wide above {WIDE_RATIO:g}x and {WIDE_MIN_MS:g} ms): the board was busy while timed; "
        "quiet it (stop other programs, let it cool, keep the camera off) and calibrate again; the table uses "
        "the medians"
    )


async def measure_link(client: HostClient, progress: Progress) -> tuple[dict[str, float], dict[str, Spread]]:
    """Round trip (median of small pings) and rate (slope of payload time over payload size),
    and the spread of each.

    The two payload sizes alternate, as the heads do, so a busy spell of the link or the host
    slows both sizes alike and leaves the slope (the rate) as it was.
    """
    rtts = [await client.ping(0) for _ in range(RTT_PINGS)]
    rtt_ms = statistics.median(rtts)
    probes: dict[int, list[float]] = {size: [] for size in PROBE_BYTES}
    for _ in range(PROBE_REPEATS):
        for size in PROBE_BYTES:
            probes[size].append(await client.ping(size))
    medians = [statistics.median(probes[size]) for size in PROBE_BYTES]
    slope_ms_per_byte = (medians[1] - medians[0]) / (PROBE_BYTES[1] - PROBE_BYTES[0])
    if slope_ms_per_byte <= 0:  # faster than the timer can tell: the largest probe over its time
        slope_ms_per_byte = max(medians[1] - rtt_ms, 1e-6) / PROBE_BYTES[1]
    rate_bps = 8.0 / (slope_ms_per_byte / 1000.0)
    spread = {"rtt_ms": Spread.of(rtts), "probe_ms": Spread.of(probes[PROBE_BYTES[1]])}
    progress(f"link   round trip {rtt_ms:.2f} ms ({spread['rtt_ms'].p10:.2f}–{spread['rtt_ms'].p90:.2f}), "
             f"rate {rate_bps / 1e6:.1f} Mbit/s ({PROBE_BYTES[1] // 1024} KiB in {medians[1]:.1f} ms)")
    link = {"rtt_ms": rtt_ms, "probe_bytes": float(PROBE_BYTES[1]), "probe_ms": medians[1], "rate_bps": rate_bps}
    return link, spread


def precision_of(runner: DeviceRunner) -> str:
    """The precision ``runner`` runs the heads at (``auto`` resolves per artifact; heads decide the
    table): with its backend, the key of the calibration table that describes it."""
    splits = runner.bundle.manifest.splits
    if not splits:
        return runner.artifact_precision(LOCAL, FULL)
    return runner.artifact_precision(splits[0].id, HEAD)


def latency_model(
    runner: DeviceRunner, heads: dict[str, dict[int, float]], tails: dict[str, dict[int, float]], rtt_ms: float,
    preprocess_ms: float | None = None,
) -> LatencyModel:
    """DSC's terms for every option: each split, full offload (l = 0) and local only (l = L), each
    chain with every stage on the host that was profiled (:func:`calibration.chain_timings`: two
    stages on one host cross no link), and each coded option (``SPLIT@k4``) timed on both sides, its
    coding's bytes on the link; and one frame's preprocessing, which every option pays (None: not timed)."""
    manifest = runner.bundle.manifest
    # what full offload sends: the preprocessed input, uint8 pixels where the bundle folded the normalisation
    input_bytes = runner.payload(OFFLOAD, np.zeros((1, *manifest.model.input_shape), np.float32))[0].nbytes
    splits = [SplitTimings(LOCAL, 0, heads[LOCAL], {})]
    host = HostView("host", tails)
    for split in manifest.splits:
        sent = runner.payload(split.id, np.zeros((1, *split.tensor.shape), np.float32))[0].nbytes
        if split.stages:
            stages = [ChainStage(split.stage_id(s.index), sent if s.index == 1 else s.tensor.bytes_per_sample)
                      for s in split.stages]
            chain = chain_timings(split.id, stages, heads[split.id], [host] * len(stages), sorted(heads[split.id]))
            if chain is not None:  # None: the host lacks a stage
                splits.append(chain)
        elif split.id in tails:  # else the host has no tail for it: not an option
            splits.append(SplitTimings(split.id, sent, heads[split.id], tails[split.id]))
        for coding in split.codings:  # timed where the floor offered it and the host decodes it
            option = split.option(coding)
            if option in heads and option in tails:
                splits.append(SplitTimings(option, coding.bytes_per_sample, heads[option], tails[option]))
    if OFFLOAD in tails:
        splits.append(SplitTimings(OFFLOAD, input_bytes, {}, tails[OFFLOAD]))
    return LatencyModel(tuple(splits), rtt_ms, preprocess_ms)


async def profile_host(
    client: HostClient, bundle_id: str, rounds: Rounds, busy_wait_s: float = BUSY_WAIT_S,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep, splits: Sequence[str] | None = None,
    label: str = "host",
) -> dict[str, dict[int, float]]:
    """The host's tail times (of ``splits``, or of every tail it serves), fitted to what one
    ``profile`` request may cost the host; ``label`` begins each line of progress.

    A host bounds the work of one request (``--profile-budget-ms``, which its ``hello`` announces)
    and runs one profile at a time (docs/protocol.md, "Host limits"), and the board's user may not
    be the host's operator: on a one-core host even the full model at batch 1 took 109 ms of the
    default 100, and calibration died. So each tail is timed in requests of its own, sized by
    :class:`_TailProfile` from what the tail's earlier replies measured; the host's refusal
    (``bad_request``) stays the final word, since it may be slower than its replies said. A host
    busy with another board's calibration, or whose rate for profiles is spent (``overloaded``), is
    asked again every few seconds, for at most ``busy_wait_s`` without an answer: a slow host's
    calibration is many small requests, and each answer shows it is still being served.

    What one run cannot time within the budget is left out, with one line naming it, and the
    calibration goes on with the rest. A tail with no time at all is no option of the table
    (:func:`latency_model`). A tail timed at some batch sizes only stays an option: the host
    predicts a run from its cost per sample, so the sizes it cannot time are always above the
    ones it did, and the latency model extrapolates them from the largest timed ones
    (:meth:`calibration.SplitTimings.tail_at`), as it does for any batch beyond the calibrated ones:
    never cheaper than the largest timed size, and in proportion to the batch from a single one
    (more than a batched run takes). Leaving the whole tail out would drop an option the table
    prices from measurements at every size it was timed at.
    """
    rounds = rounds.for_host()
    batches, repeats, progress = rounds.batches, rounds.repeats, rounds.progress
    budget_ms = client.hello.profile_budget_ms
    waited = 0.0

    async def ask(split_id: str, sizes: Sequence[int], runs: int) -> dict[int, float]:
        nonlocal waited
        while True:
            try:
                times = (await client.profile(bundle_id, sizes, runs, splits=[split_id])).get(split_id, {})
                waited = 0.0
                return times
            except RemoteError as exc:
                if exc.code != "overloaded" or waited >= busy_wait_s:
                    raise
                progress(f"host busy ({exc.message}); asking again in {BUSY_RETRY_S:g} s")
                await sleep(BUSY_RETRY_S)
                waited += BUSY_RETRY_S

    tails: dict[str, dict[int, float]] = {}
    for split_id in client.hello.bundles.get(bundle_id, ()) if splits is None else splits:
        tail = _TailProfile(sorted(set(batches)), repeats, budget_ms)
        while (request := tail.next_request()) is not None:
            sizes, runs = request
            try:
                times = await ask(split_id, sizes, runs)
            except RemoteError as exc:
                if exc.code != "bad_request":
                    raise
                if len(sizes) > 1:
                    progress(f"{label:6s} {split_id}: over its budget for one request at B={_sizes(sizes)}; "
                             "one batch size at a time")
                tail.refused(sizes, exc.message)
                continue
            tail.measured(sizes, runs, times)
        timed = tail.medians()
        if timed:
            tails[split_id] = timed
            progress(f"{label:6s} {split_id:24s} " + "  ".join(f"B={b}: {ms:8.2f} ms" for b, ms in timed.items()))
        if tail.untimed:
            progress(tail.untimed_line(f"{label:6s} {split_id}"))
    return tails


def _sizes(batches: Sequence[int]) -> str:
    return ",".join(map(str, batches))


class _TailProfile:
    """One tail's profile requests, each sized to the host's budget from what earlier replies measured.

    The first request asks for every batch size and every repeat, as nothing is known of the tail:
    a host with room times it all at once, and refuses what one run of each size cannot fit. Later
    requests hold the smallest sizes left whose every wanted run, after a warm-up run, fits
    :data:`BUDGET_SHARE` of the budget (small sizes share a request, and a size that needs several
    does not pay the others' warm-up in each), else the smallest alone with the runs that fit; the
    rest follow in more requests, and a size's median is the median of its replies' medians, each
    counted for its runs (a reply is a median, not its samples). A host that announces no budget
    (older ones) is asked as the first request asks.
    """

    def __init__(self, batches: Sequence[int], repeats: int, budget_ms: float | None) -> None:
        self.budget_ms = budget_ms
        self.wanted = {b: repeats for b in batches}  # runs still to time at each size
        self.replies: dict[int, list[tuple[float, int]]] = {b: [] for b in batches}  # (median ms, runs)
        self.width = len(batches)  # sizes one request may hold: one after a refusal of several
        self.untimed: list[int] = []  # sizes the host refused to run even alone
        self.refusal = ""  # the host's words when it did

    def _estimate(self, batch: int) -> float | None:
        """ms of one run at ``batch``: measured, else from the costliest sample measured (a run
        costs about its samples, as the host predicts it), else None."""
        timed = self.medians()
        if batch in timed:
            return timed[batch]
        if not timed:
            return None
        return max(ms / b for b, ms in timed.items()) * batch

    def next_request(self) -> tuple[list[int], int] | None:
        """The sizes and repeats of the next request; None when every size is timed or left out."""
        left = [b for b, runs in self.wanted.items() if runs > 0 and b not in self.untimed][: self.width]
        if not left:
            return None
        estimates = [ms for ms in map(self._estimate, left) if ms is not None]
        if self.budget_ms is None or len(estimates) < len(left):
            return left, max(self.wanted[b] for b in left)
        sizes, round_ms, runs = left[:1], estimates[0], self.wanted[left[0]]
        for b, ms in zip(left[1:], estimates[1:]):
            more = max(runs, self.wanted[b])
            if (more + 1) * (round_ms + ms) > BUDGET_SHARE * self.budget_ms:  # every run, after a warm-up one
                break
            sizes.append(b)
            round_ms, runs = round_ms + ms, more
        return sizes, min(runs, _fit(self.budget_ms, round_ms))

    def measured(self, sizes: Sequence[int], runs: int, times: Mapping[int, float]) -> None:
        """Count a reply for the runs that fit by its own times, at most those asked: a host slower
        than the estimate trimmed the repeats, and the missing runs are asked for again."""
        counted = runs
        if self.budget_ms is not None:
            counted = min(runs, _fit(self.budget_ms, sum(times.get(b, 0.0) for b in sizes)))
        for b in sizes:
            if b in times:
                self.replies[b].append((times[b], counted))
            self.wanted[b] = max(0, self.wanted[b] - counted)

    def refused(self, sizes: Sequence[int], why: str) -> None:
        """Several sizes: ask one at a time. One size: it is not timed, nor any larger one, which the
        host, predicting a run from its cost per sample, would refuse too."""
        if len(sizes) > 1:
            self.width = 1
            return
        self.untimed = [b for b in self.wanted if b >= sizes[0] and not self.replies[b]]
        self.wanted = {b: 0 if b >= sizes[0] else runs for b, runs in self.wanted.items()}
        self.refusal = " ".join(why.split())  # the host's words, on the one line that reports them

    def medians(self) -> dict[int, float]:
        """Each timed size's median over its replies, each reply weighing its runs."""
        return {b: _weighted_median(replies) for b, replies in self.replies.items() if replies}

    def untimed_line(self, prefix: str) -> str:
        """The one line saying what was not timed, why, how the table copes, and what would time it."""
        budget = "its budget" if self.budget_ms is None else f"its budget of {self.budget_ms:g} ms"
        sizes = _sizes(self.untimed)
        timed = sorted(self.medians())
        if not timed:
            return (f"{prefix}: not timed at B={sizes}: one run is over what one profile request may cost the host "
                    f"({budget}); left out of the table: to offer it, ask the host's operator for a larger "
                    f"--profile-budget-ms (the host said: {self.refusal})")
        largest = max(ms / b for b, ms in self.medians().items()) * self.untimed[-1]
        # a budget whose planned share holds a warm-up run and one timed run of the largest
        wanted_ms = math.ceil(2 * largest / BUDGET_SHARE / 10) * 10
        return (f"{prefix}: not timed at B={sizes}: one run is over what one profile request may cost the host "
                f"({budget}; about {largest:.0f} ms at B={self.untimed[-1]}); the table extrapolates them from "
                f"B={_sizes(timed)}: to time them, ask the host's operator for --profile-budget-ms {wanted_ms}")


def _fit(budget_ms: float, round_ms: float) -> int:
    """Timed runs of a round of ``round_ms`` that fit the planned share of the budget after a warm-up
    run: at least one (the host drops its warm-up when that is all that fits, and refuses what does not)."""
    if round_ms <= 0:  # faster than the host's clock can tell
        return MAX_PROFILE_REPEATS
    return max(1, int(BUDGET_SHARE * budget_ms / round_ms) - 1)


def _weighted_median(replies: Sequence[tuple[float, int]]) -> float:
    """The median of the replies' medians, each repeated as many times as the runs it stands for."""
    return float(statistics.median([ms for ms, runs in replies for _ in range(runs)]))


async def calibrate(
    runner: DeviceRunner,
    client: HostClient | None,
    rounds: Rounds = Rounds(),
    board: dict[str, Any] | None = None,
    scene: Scene = Scene(),
    peers: Sequence[HostClient] = (),
    loads: Mapping[str, float] | None = None,
) -> Calibration:
    """Measure everything and build the table. Without a host, only ``local`` is an option. The model
    takes the medians; the spreads are kept beside them (:func:`spread_warning` says when one is wide).

    The ``scene``'s ``fps`` paces the board's timed runs as a camera would (0: back to back); the
    host's tails are timed back to back whatever it is: a host serving a fleet is never idle for
    long. Its ``frame`` (width, height) is the camera's frame size, which preprocessing is timed on
    (its cost grows with the frame); its ``camera``, the newest frame of the run's camera capturing
    while the board is timed (its capture is the run's load on the board too: ``calibrate
    --camera``). ``peers`` are other hosts a chain's later stages may run on
    (:func:`place_chains`), ``loads`` the hosts' advertised loads by address, where zeroconf gave them.
    """
    started = time.perf_counter()
    batches, repeats, progress, frame = rounds.batches, rounds.repeats, rounds.progress, scene.frame
    board_times = measure_board(runner, rounds, scene)  # the caller warns of a wide one
    head_spread = board_times.heads
    heads = {split: {b: s.p50 for b, s in by_batch.items()} for split, by_batch in head_spread.items()}
    preprocess = Preprocessing(runner.preprocess_path, frame[0], frame[1], board_times.preprocess)
    tails: dict[str, dict[int, float]] = {}
    link, link_spread = None, {}
    routes: dict[str, tuple[str, ...]] = {}
    if client is not None:
        # what the host serves, less the coded options the floor left out (their heads were not timed)
        coded = {split.option(c) for split in runner.bundle.manifest.splits for c in split.codings}
        served = [s for s in client.hello.bundles.get(runner.bundle.id, ()) if s not in coded or s in heads]
        tails = await profile_host(client, runner.bundle.id, rounds, splits=served)
        link, link_spread = await measure_link(client, progress)
    model = latency_model(runner, heads, tails, link["rtt_ms"] if link else 0.0, preprocess.spread.p50)
    if client is not None and peers and link is not None:
        loads = loads or {}
        entry = HostView(client.address, tails, loads.get(client.address, 0.0), link["rate_bps"], link["rtt_ms"])
        placements = await place_chains(runner, model, heads, entry, (client, *peers), rounds, loads)
        model = LatencyModel(tuple(placements[t.split].timings if t.split in placements else t for t in model.splits),
                             model.rtt_ms, model.preprocess_ms)
        routes = {chain: placement.hosts[1:] for chain, placement in placements.items()
                  if set(placement.hosts) != {client.address}}
    table = SplitTable.build(model, batches)
    progress(f"done in {time.perf_counter() - started:.1f} s")
    return Calibration(
        bundle_id=runner.bundle.id,
        manifest_sha256=manifest_sha256(runner.bundle),
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        board=board or {},
        backend=runner.backend,
        precision=precision_of(runner),
        threads=runner.threads,
        repeats=repeats,
        fps=scene.fps,
        batches=tuple(batches),
        link=link,
        model=model,
        table=table,
        head_spread=head_spread,
        link_spread=link_spread,
        routes=routes,
        preprocess=preprocess,
    )


async def place_chains(
    runner: DeviceRunner, model: LatencyModel, heads: Mapping[str, Mapping[int, float]], entry: HostView,
    clients: Sequence[HostClient], rounds: Rounds, loads: Mapping[str, float],
) -> dict[str, Placement]:
    """Each chain's cheapest placement (:func:`calibration.place`) with its first stage on the host
    the board calibrated against (``entry``, whose client is the first of ``clients``; the others
    are its peers) and its later stages on any
    host that serves them: each peer's stage times from its own ``profile``, the hosts' links to
    each other from their own ``links``, their queues from ``loads``. A chain no placement serves
    keeps its one-host timings."""
    chains = [s for s in runner.bundle.manifest.splits if s.stages and s.id in model.names]
    if not chains:
        return {}
    peers, batches, progress = clients[1:], rounds.batches, rounds.progress
    names = {chain.stage_id(stage.index) for chain in chains for stage in chain.stages}
    views = {entry.address: entry}
    for peer in peers:
        served = [n for n in peer.hello.bundles.get(runner.bundle.id, ()) if n in names]
        stage_ms = await profile_host(peer, runner.bundle.id, rounds, splits=served, label=f"peer   {peer.address}")
        views[peer.address] = HostView(peer.address, stage_ms, loads.get(peer.address, 0.0))
        progress(f"peer   {peer.address}: serves {', '.join(served) or 'no stage of a chain'}")
    for client in clients:
        measured = await client.links([a for a in views if a != client.address])
        views[client.address] = replace(views[client.address], peers=measured.links)
        for other, (rate, rtt) in measured.links.items():
            progress(f"link   {client.address} -> {other}: {rate / 1e6:.1f} Mbit/s, round trip {rtt:.2f} ms")
        for other, why in measured.failed.items():
            progress(f"link   {client.address} -> {other}: not measured ({why})")
    placements = {}
    for chain in chains:
        stages = [ChainStage(chain.stage_id(s.index), model.timings(chain.id).bytes_per_sample if s.index == 1
                             else s.tensor.bytes_per_sample) for s in chain.stages]
        placement = place(chain.id, stages, heads[chain.id], list(views.values()), batch=batches[0], batches=batches)
        if placement is not None:
            placements[chain.id] = placement
            progress(f"chain  {chain.id}: {' > '.join(placement.hosts)}, {placement.predicted_ms:.2f} ms at "
                     f"B={batches[0]} (predicted)")
    return placements
