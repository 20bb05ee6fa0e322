"""``split-device calibrate``: measure this board, ask the host for its tail times, probe the link.

DSC (Eq. 4-6) needs the head time of every split and the full model on the board at every
batch size (not linear in the batch: measured, not extrapolated), the tail times on the
host, and the link. Each of these is measured where it runs: the board times its own
sessions (warm-up, then the median of ``repeats``, with the threads the board profile
says), the host times its tails itself (the ``profile`` request), and the link is timed
with pings: a small one for the round trip, payloads for the rate. The table
best_split[batch][rate] is computed from these and stored in ``calibration.json`` beside
the bundle, with the bundle's identity, so a board never uses another bundle's timings.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable, Sequence

import numpy as np

from calibration import (
    FILENAME,
    Calibration,
    CalibrationError,
    LatencyModel,
    SplitTable,
    SplitTimings,
    load,
    measure_ms,
)
from device_runtime.bundle import FULL, HEAD, LOCAL, OFFLOAD, Bundle
from device_runtime.engine.runner import DeviceRunner
from device_runtime.hosts.client import HostClient
from device_runtime.wire.ops import MAX_PROFILE_REPEATS
from splitedge.errors import BundleError, RemoteError

__all__ = ["DEFAULT_BATCHES", "calibrate", "calibration_for", "manifest_sha256", "measure_link", "profile_host"]

DEFAULT_BATCHES = (1, 2, 4, 8, 16)
RTT_PINGS = 20
PROBE_BYTES = (256 * 1024, 1024 * 1024)  # two sizes: the rate is the slope, free of per-request costs
PROBE_REPEATS = 3
#: A host times one board's tails at a time: how long to wait for another board's calibration.
BUSY_WAIT_S = 300.0
BUSY_RETRY_S = 5.0

Progress = Callable[[str], None]


def manifest_sha256(bundle: Bundle) -> str:
    """The manifest's identity digest (``manifest_sha256`` inside it, checked on load): the content the
    timings were measured for, whatever the file's whitespace."""
    return bundle.manifest.manifest_sha256


def calibration_for(bundle: Bundle) -> Calibration:
    """The bundle's ``calibration.json``, refused if missing, malformed or made for another bundle."""
    try:
        return load(bundle.root / FILENAME, bundle.id, manifest_sha256(bundle))
    except CalibrationError as exc:
        raise BundleError(str(exc)) from exc


def measure_heads(
    runner: DeviceRunner, batches: Sequence[int], repeats: int, progress: Progress, fps: float = 0.0
) -> dict[str, dict[int, float]]:
    """Median ms of every split's head and of the full model (``local``) at every batch size, here,
    at most ``fps`` runs a second (0: back to back; :func:`calibration.measure_ms`)."""
    shape = runner.bundle.manifest.model.input_shape
    rng = np.random.default_rng(0)
    targets = [(s.id, HEAD) for s in runner.bundle.manifest.splits] + [(LOCAL, FULL)]
    times: dict[str, dict[int, float]] = {}
    for split_id, role in targets:
        session = runner.session(split_id, role)
        times[split_id] = {}
        for batch in batches:
            x = rng.standard_normal((batch, *shape)).astype(np.float32)
            times[split_id][batch] = measure_ms(lambda: session.run(x), repeats, fps=fps)
        progress(f"board  {split_id:24s} " + "  ".join(f"B={b}: {ms:8.2f} ms" for b, ms in times[split_id].items()))
    return times


async def measure_link(client: HostClient, progress: Progress) -> dict[str, float]:
    """Round trip (median of small pings) and rate (slope of payload time over payload size)."""
    rtts = [await client.ping(0) for _ in range(RTT_PINGS)]
    rtt_ms = statistics.median(rtts)
    medians = []
    for size in PROBE_BYTES:
        medians.append(statistics.median([await client.ping(size) for _ in range(PROBE_REPEATS)]))
    slope_ms_per_byte = (medians[1] - medians[0]) / (PROBE_BYTES[1] - PROBE_BYTES[0])
    if slope_ms_per_byte <= 0:  # faster than the timer can tell: the largest probe over its time
        slope_ms_per_byte = max(medians[1] - rtt_ms, 1e-6) / PROBE_BYTES[1]
    rate_bps = 8.0 / (slope_ms_per_byte / 1000.0)
    progress(f"link   round trip {rtt_ms:.2f} ms, rate {rate_bps / 1e6:.1f} Mbit/s "
             f"({PROBE_BYTES[1] // 1024} KiB in {medians[1]:.1f} ms)")
    return {"rtt_ms": rtt_ms, "probe_bytes": float(PROBE_BYTES[1]), "probe_ms": medians[1], "rate_bps": rate_bps}


def _precision(runner: DeviceRunner) -> str:
    """The precision the heads were timed at (``auto`` resolves per artifact; heads decide the table)."""
    splits = runner.bundle.manifest.splits
    if not splits:
        return runner.artifact_precision(LOCAL, FULL)
    return runner.artifact_precision(splits[0].id, HEAD)


def latency_model(
    runner: DeviceRunner, heads: dict[str, dict[int, float]], tails: dict[str, dict[int, float]], rtt_ms: float
) -> LatencyModel:
    """DSC's terms for every option: each split, full offload (l = 0) and local only (l = L)."""
    manifest = runner.bundle.manifest
    input_bytes = math.prod(manifest.model.input_shape) * 4  # the preprocessed float32 input crosses for offload
    splits = [SplitTimings(LOCAL, 0, heads[LOCAL], {})]
    for split in manifest.splits:
        if split.id not in tails:
            continue  # the host has no tail for it: not an option
        sent = runner.payload(split.id, np.zeros((1, *split.tensor.shape), np.float32))[0].nbytes
        splits.append(SplitTimings(split.id, sent, heads[split.id], tails[split.id]))
    if OFFLOAD in tails:
        splits.append(SplitTimings(OFFLOAD, input_bytes, {}, tails[OFFLOAD]))
    return LatencyModel(tuple(splits), rtt_ms)


async def profile_host(
    client: HostClient, bundle_id: str, batches: Sequence[int], repeats: int, progress: Progress,
    busy_wait_s: float = BUSY_WAIT_S, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> dict[str, dict[int, float]]:
    """The host's tail times, one ``profile`` request per tail.

    A host bounds the work of one request and runs one profile at a time (docs/protocol.md,
    "Host limits"), so a bundle with many cuts is timed tail by tail, and a host busy with
    another board's calibration (``overloaded``) is asked again every few seconds, for at most
    ``busy_wait_s`` in all.
    """
    tails: dict[str, dict[int, float]] = {}
    waited = 0.0
    for split_id in client.hello.bundles.get(bundle_id, ()):
        while True:
            try:
                times = await client.profile(bundle_id, batches, repeats, splits=[split_id])
                break
            except RemoteError as exc:
                if exc.code != "overloaded" or waited >= busy_wait_s:
                    raise
                progress(f"host busy ({exc.message}); asking again in {BUSY_RETRY_S:g} s")
                await sleep(BUSY_RETRY_S)
                waited += BUSY_RETRY_S
        tails.update(times)
        for split, by_batch in times.items():
            progress(f"host   {split:24s} " + "  ".join(f"B={b}: {ms:8.2f} ms" for b, ms in by_batch.items()))
    return tails


async def calibrate(
    runner: DeviceRunner,
    client: HostClient | None,
    batches: Sequence[int] = DEFAULT_BATCHES,
    repeats: int = 20,
    board: dict[str, Any] | None = None,
    progress: Progress = lambda line: None,
    fps: float = 0.0,
) -> Calibration:
    """Measure everything and build the table. Without a host, only ``local`` is an option.

    ``fps`` paces the board's timed runs as a camera would (0: back to back); the host's tails
    are timed back to back whatever it is: a host serving a fleet is never idle for long.
    """
    started = time.perf_counter()
    heads = measure_heads(runner, batches, repeats, progress, fps)
    tails: dict[str, dict[int, float]] = {}
    link = None
    if client is not None:
        tails = await profile_host(client, runner.bundle.id, batches, min(repeats, MAX_PROFILE_REPEATS), progress)
        link = await measure_link(client, progress)
    model = latency_model(runner, heads, tails, link["rtt_ms"] if link else 0.0)
    table = SplitTable.build(model, batches)
    progress(f"done in {time.perf_counter() - started:.1f} s")
    return Calibration(
        bundle_id=runner.bundle.id,
        manifest_sha256=manifest_sha256(runner.bundle),
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        board=board or {},
        backend=runner.backend,
        precision=_precision(runner),
        threads=runner.threads,
        repeats=repeats,
        fps=fps,
        batches=tuple(batches),
        link=link,
        model=model,
        table=table,
    )
