"""``python -m testbed replay run.jsonl --bundle B``: run a stream again under the link a trace recorded.

A field trial's trace says what the link did, frame by frame; a rehearsal on a made-up schedule
says nothing about that Wi-Fi. The replay reconstructs a :class:`RateSchedule` from the trace,
drives the testbed's kernel link (:class:`EmulatedLink`) through it with a host behind it
(:func:`serve_in`), and runs ``split-device run`` over it on the same input, writing a new
trace: ``split-device report run.jsonl replay/replay.jsonl`` then sets them side by side.

Where the rates come from, best first:

* the trace's ``link_rate`` records: the link's real rate, recorded where a testbed shaped it;
* else the board's own per-frame estimates (``rate_bps``): a field trial's only view of the link.
  An estimate is goodput (the link's rate less headers and the board's own delays), so the
  replayed link is a little slower than the one estimated.

The round-trip time: no trace records it (the frames' transfer times hold it, mixed with the
rate); the replay adds no delay (the veth's own, well under 0.1 ms) and says so in
``replay.json``.

The board's side of its decisions: with ``--split auto`` a board decides with the head times it
was calibrated with, refined from the ones it measures as it runs. The replaying machine's heads
take other times (another board, another load), and its table's edges would move with them. So
where the bundle replayed is the trial's (the run record's ``bundle_id``) and the trace recorded
them (its ``head_times`` records), the replay's board decides with the trial's head times, each
taken up at the frame the trial took it up (``split-device run --head-times``, :data:`RECORDED`):
the replay then differs from the trial only where the link or the host made it differ.
``--board-times measured`` (:data:`MEASURED`), and any other bundle, let the replaying board time
its own heads; ``replay.json`` says which and why (``board_times``, ``board_times_why``).

The board's speed: deciding alike is not answering alike. The replaying board's stages take its
own times, and on a shared machine even the same emulated board ran 5-18 % faster or slower from
one run to the next. So where the bundle is the trial's, the replay's board also runs at the
trial's board's speed (``split-device run --pace``, :data:`RECORDED`): each stage held to the time
it took in the trial, frame by frame, which a board at least as fast as the trial's can do.
``--board-speed own`` (:data:`OWN`) lets it run at its own; ``replay.json`` says which
(``board_speed``, ``board_speed_why``), and the board's log how many stages ran slower than the
trial's (those keep this board's time).

Time: the frames' ``t`` and the ``link_rate`` records' count from the run record's
``started_unix``. The replay starts the link at the rate in force at the original's start,
waits for the new run's record, and from then drives what is left of the schedule at the
same offsets from the new start (:func:`remaining`), so frame ``t`` of the replay meets the
rate frame ``t`` of the original met. Every step is applied and written into the new trace,
also after the board has finished, so the trace holds the whole schedule.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from splitedge import SplitEdgeError, shown
from splitedge.reading import FRAME, HEAD_TIMES, LINK_RATE, MAX_LINE_BYTES, trace_records
from testbed._kernel_link import EmulatedLink, unavailable_reason
from testbed._namespace_host import DEFAULT_PORT, own_peer, serve_in
from testbed._schedule import RateSchedule, RateStep, trace_steps

__all__ = [
    "BOARD_LOG", "ESTIMATES", "LINK_RATES", "MAX_INDEX", "MAX_LINE_BYTES", "MAX_RATE_BPS", "MAX_T_S", "MEASURED",
    "MIN_RATE_BPS", "OWN", "RECORDED", "RecordedLink", "board_argv", "board_speed", "board_times", "main",
    "read_trace", "recorded_link", "remaining", "replay", "replay_source",
]

#: Where a replay's rates came from (``replay.json``'s ``rate_from``).
LINK_RATES = "the trace's link_rate records (the link's real rate)"
ESTIMATES = "the board's rate estimates (rate_bps per frame; no link_rate records in the trace)"
NO_RTT = "not in the trace: no delay added (the veth's own)"
TRACE_FILE = "replay.jsonl"
RECORD_FILE = "replay.json"
BOARD_LOG = "board.log"
_BITS_PER_MBIT = 1e6
#: The shortest step a schedule takes: a rate recorded at the very end of a run holds this long.
_MIN_STEP_S = 1e-3
#: Bounds on the board: to start (import, warm-up, connect) and to end after the schedule.
_START_TIMEOUT_S = 120.0
_END_TIMEOUT_S = 120.0
_SOURCE_WORDS = ("synthetic", "picam")
#: ``--board-times``: the replay's board decides with the head times the trial decided with, or
#: with the ones it measures itself.
RECORDED, MEASURED = "recorded", "measured"
#: ``--board-speed``: the replay's board held to the trial's stage times (RECORDED), or at its own.
OWN = "own"


@dataclass(frozen=True)
class RecordedLink:
    """The link a trace recorded: ``schedule`` from the run's start (its t = 0) to its last frame,
    and where its rates came from (:data:`LINK_RATES` or :data:`ESTIMATES`)."""

    schedule: RateSchedule
    rate_from: str


def read_trace(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """The run record, frame records and ``link_rate`` records of a trace: what a replay needs of it.

    Read by the one reader of a trace (:func:`splitedge.reading.trace_records`, as the board and the report
    read one): a line cut short at the end (a run that lost power) is left out, any other bad line
    is an error. A trace is untrusted input: each field a replay reads is checked here
    (:func:`_checked`, in the bounds a replay can schedule), and a bad one is an error naming its
    line and field."""
    frames, rates = [], []
    (_, run), *records = trace_records(path, kinds=(FRAME, LINK_RATE))
    for number, record in records:
        (frames if record["type"] == FRAME else rates).append(_checked(Path(path), number, record))
    if not frames:
        raise SplitEdgeError(f"{path}: no frames to replay")
    return run, frames, rates


#: The bounds of what a replay takes from a trace: a frame's or a link_rate's ``t`` within a day of the
#: run's start (a last frame at t = 1e12 scheduled a link for 31,700 years), a frame's ``index``
#: under ten million (the replay runs that many frames), a rate from 1 bit/s to 10 Tbit/s (a link's).
MAX_T_S = 86_400.0
MAX_INDEX = 10_000_000
MIN_RATE_BPS, MAX_RATE_BPS = 1.0, 1e13


def _number(value: Any, low: float, high: float) -> bool:
    """A JSON number (not a bool) in [low, high]; NaN and the infinities fail the comparison."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and low <= value <= high


def _checked(path: Path, number: int, record: dict[str, Any]) -> dict[str, Any]:
    """A frame or link_rate record with the fields a replay reads in their bounds; else an error naming
    the line and the field: ``t`` always; a frame's ``index``, and its ``rate_bps`` (null or a rate)
    where it was answered; a link_rate's ``rate_bps``."""
    kind = record["type"]

    def bad(name: str, expected: str) -> SplitEdgeError:
        return SplitEdgeError(f"{path}:{number}: a {kind} record's {name} must be {expected}, got "
                              f"{shown(record.get(name))}")

    if not _number(record.get("t"), -MAX_T_S, MAX_T_S):
        raise bad("t", f"a number of seconds within ±{MAX_T_S:g} of the run's start")
    rate = record.get("rate_bps")
    rate_ok = _number(rate, MIN_RATE_BPS, MAX_RATE_BPS)
    if kind == LINK_RATE:
        if not rate_ok:
            raise bad("rate_bps", f"a rate from {MIN_RATE_BPS:g} to {MAX_RATE_BPS:g} bit/s")
        return record
    index = record.get("index")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < MAX_INDEX:
        raise bad("index", f"an integer from 0 to {MAX_INDEX - 1}")
    if not isinstance(record.get("dropped", False), bool):
        raise bad("dropped", "true or false")
    if not record.get("dropped") and rate is not None and rate != 0 and not rate_ok:
        raise bad("rate_bps", f"null or a rate from {MIN_RATE_BPS:g} to {MAX_RATE_BPS:g} bit/s")
    return record


def _records_head_times(path: str | Path) -> bool:
    """Whether a trace holds ``head_times`` records (what ``--split auto`` decided with)."""
    return any(True for _ in itertools.islice(trace_records(path, kinds=(HEAD_TIMES,)), 1, 2))


def _schedule(points: Sequence[tuple[float, float]], end: float) -> RateSchedule:
    """The steps of ``points`` (``(t, rate_bps)``: that rate from ``t`` on) from 0 to ``end``.

    The first rate also holds before its ``t`` (a testbed sets the link's rate before it starts
    the schedule; a board has no estimate before its first transfer); a repeat of the rate in
    force is no step; of points at one instant, the last holds; a point after ``end`` changes
    nothing a frame met (and the last rate holds at least :data:`_MIN_STEP_S`)."""
    ordered = sorted(points, key=lambda p: p[0])
    steps: list[tuple[float, float]] = []  # (start, rate_mbit)
    for t, rate_bps in ordered:
        start, rate = max(t, 0.0), rate_bps / _BITS_PER_MBIT
        if steps and start > end:
            break
        if steps and steps[-1][0] == start:
            steps.pop()
        if not steps or steps[-1][1] != rate:
            steps.append((start if steps else 0.0, rate))
    bounds = [s for s, _ in steps[1:]] + [max(end, steps[-1][0] + _MIN_STEP_S)]
    return RateSchedule([RateStep(duration_s=b - s, rate_mbit=r) for (s, r), b in zip(steps, bounds)])


def recorded_link(frames: Sequence[dict[str, Any]], link_rates: Sequence[dict[str, Any]]) -> RecordedLink:
    """The link of a trace as a schedule up to its last frame's capture: from its ``link_rate``
    records where it has them, else from the board's rate estimates (see the module docstring)."""
    end = max(f["t"] for f in frames)
    if link_rates:
        return RecordedLink(_schedule([(r["t"], r["rate_bps"]) for r in link_rates], end), LINK_RATES)
    estimates = [(f["t"], f["rate_bps"]) for f in frames if not f.get("dropped") and f.get("rate_bps")]
    if not estimates:
        raise SplitEdgeError("the trace has no link_rate records and no frame with a rate estimate (nothing was "
                             "offloaded): there is no link to replay")
    return RecordedLink(_schedule(estimates, end), ESTIMATES)


def remaining(schedule: RateSchedule, elapsed_s: float) -> RateSchedule | None:
    """What is left of ``schedule`` ``elapsed_s`` after its start: the step in force then, shortened,
    and the ones after it (``remaining(s, e).rate_at(t) == s.rate_at(e + t)``); None past the end."""
    steps, boundary = [], 0.0
    for step in schedule.steps:
        boundary += step.duration_s
        if boundary > elapsed_s:
            steps.append(RateStep(duration_s=min(step.duration_s, boundary - elapsed_s), rate_mbit=step.rate_mbit))
    return RateSchedule(steps) if steps else None


def replay_source(run: dict[str, Any], given: str | None) -> str:
    """The input of the replay: ``given`` (``--source``), else the original's when it is a file or a
    folder that is still there; a camera cannot be replayed, so it takes ``--source``."""
    if given:
        return given
    recorded = run.get("source")
    if isinstance(recorded, str) and (Path(recorded).is_file() or Path(recorded).is_dir()):  # no FIFO, no device
        return recorded
    why = (f"its source {shown(recorded)} is a live camera or synthetic frames" if isinstance(recorded, str)
           and (recorded.isdigit() or recorded.startswith(_SOURCE_WORDS))
           else f"its source {shown(recorded)} is not here as a file or folder")
    raise SplitEdgeError(f"the trace cannot be replayed on its own input ({why}): give --source (the same video or "
                         "folder of images, or synthetic:FPS at its frame rate)")


def board_times(
    run: dict[str, Any], head_times: bool, bundle_id: str | None, policy: str, asked: str | None = None,
) -> tuple[str | None, str]:
    """What the replay's board decides with, :data:`RECORDED` or :data:`MEASURED` (None: nothing, a
    fixed split), and why, for ``replay.json``. ``run``: the trial's run record; ``head_times``:
    whether its trace recorded them; ``bundle_id``: the replayed bundle's id; ``asked``:
    ``--board-times`` (None: recorded where they can be, else measured)."""
    if policy != "auto":
        if asked == RECORDED:
            raise SplitEdgeError(f"--board-times recorded is for --policy auto: --policy {policy} is one split, "
                                 "which no head time changes")
        return None, f"--policy {policy}: one split, which no head time changes"
    if asked == MEASURED:
        return MEASURED, "asked (--board-times measured): the replaying board times its own heads"
    trial = run.get("bundle_id")
    if trial == bundle_id and head_times:
        return RECORDED, (f"the trial's bundle ({bundle_id}): the board decides with the trial's head times, each "
                          "from the frame the trial took it up")
    cannot = (f"the trial ran another bundle ({trial}, not {bundle_id}), whose head times are another model's"
              if trial != bundle_id else
              f"the trace records no head times (trace schema {shown(run.get('schema'))}, --split "
              f"{shown(run.get('policy'))})")
    if asked == RECORDED:
        raise SplitEdgeError(f"--board-times recorded: {cannot}; leave --board-times out, or give measured")
    why = f"{cannot}: the replaying board times its own heads"
    return MEASURED, why


def board_speed(run: dict[str, Any], bundle_id: str | None, asked: str | None = None) -> tuple[str, str]:
    """How fast the replay's board runs, :data:`RECORDED` (held to the trial's stage times) or
    :data:`OWN`, and why, for ``replay.json``. ``asked``: ``--board-speed`` (None: recorded where
    the bundle is the trial's, else own)."""
    if asked == OWN:
        return OWN, "asked (--board-speed own): the replaying board's stages take its own times"
    trial = run.get("bundle_id")
    if trial == bundle_id:
        return RECORDED, ("the trial's bundle: each stage held to the time it took on the trial's board, frame by "
                          "frame (where this board is at least as fast)")
    cannot = f"the trial ran another bundle ({trial}, not {bundle_id}), whose stages are another model's"
    if asked == RECORDED:
        raise SplitEdgeError(f"--board-speed recorded: {cannot}; leave --board-speed out, or give own")
    return OWN, f"{cannot}: the replaying board's stages take its own times"


def board_argv(
    run: dict[str, Any], frames: int, bundle: str | Path, policy: str, source: str, host: str, trace: Path,
    head_times: str | Path | None = None, pace: str | Path | None = None,
) -> list[str]:
    """``split-device run``'s arguments for the replay: the original's stream (batch, queue, drop
    policy, real-time pacing, frame count) and runtime (the inference threads and the cut tensor's
    type on the link, where its trace recorded them) on ``bundle`` with ``policy``, the host behind
    the link, deciding with the head times recorded in the trace ``head_times`` and held to the
    stage times of the trace ``pace`` where they are given.
    The backend and precision are left to the replaying board (its calibrated ones): a trial's may
    not be installed there."""
    argv = ["run", str(bundle), "--camera", source, "--split", policy, "--host", host, "--trace", str(trace),
            "--frames", str(frames), "--batch", str(run.get("batch") or 1)]
    if run.get("threads"):
        argv += ["--threads", str(run["threads"])]  # a head on 4 threads takes other times than on 1
    if run.get("transmit"):
        argv += ["--transmit", str(run["transmit"])]
    if head_times is not None:
        argv += ["--head-times", str(head_times)]
    if pace is not None:
        argv += ["--pace", str(pace)]
    if run.get("queue"):
        argv += ["--queue", str(run["queue"])]
    if run.get("drop"):
        argv += ["--drop", str(run["drop"])]
    if run.get("realtime"):
        argv.append("--realtime")
    if Path(source).is_dir():
        argv.append("--loop")  # a folder's images again, in the same order, up to --frames (as the original ran)
    return argv


def _started_unix(trace: Path, board: subprocess.Popen) -> float:
    """The new run's ``started_unix``, once its run record is written (the frames' t = 0)."""
    deadline = time.monotonic() + _START_TIMEOUT_S
    while time.monotonic() < deadline:
        if trace.is_file():
            with trace.open(encoding="utf-8") as file:
                line = file.readline()
            if line.endswith("\n"):
                return float(json.loads(line)["started_unix"])
        if board.poll() is not None:
            raise SplitEdgeError(f"the board exited with status {board.returncode} before its trace started")
        time.sleep(0.02)
    raise SplitEdgeError(f"the board wrote no trace within {_START_TIMEOUT_S:g} s")


async def _drive(link: EmulatedLink, schedule: RateSchedule, trace: Path, board: subprocess.Popen, set_by: str) -> None:
    record = trace_steps(trace, set_by)  # first: it imports the board runtime (half a second), not on the clock
    started = await asyncio.to_thread(_started_unix, trace, board)
    rest = remaining(schedule, time.time() - started)
    if rest is not None:
        await rest.drive(link, record)


def _bundle_id(bundle: str | Path) -> str:
    """The id the bundle answers to (a trace's run record's ``bundle_id``)."""
    from device_runtime import Bundle  # the board runtime, only once a replay runs (see trace_steps)

    return Bundle.load(bundle, roles=()).id


def _launch(argv: Sequence[str], log: Any) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "device_runtime.cli", *argv], stdout=log, stderr=subprocess.STDOUT)


def replay(
    trace: str | Path, bundle: str | Path, out: str | Path, policy: str = "auto", source: str | None = None,
    port: int = DEFAULT_PORT, launch: Callable[[Sequence[str], Any], subprocess.Popen] = _launch,
    times: str | None = None, speed: str | None = None,
) -> dict[str, Any]:
    """Replay ``trace``'s link with ``bundle`` (served by a host behind the link) and ``policy``;
    write ``replay.jsonl`` (the new trace), ``replay.json`` (what was replayed, and how) and
    ``board.log`` into ``out``; return ``replay.json``'s content. ``launch(argv, log)`` starts
    ``split-device ARGV`` (a benchmark pins the board to a CPU of its own); ``times``: what the
    board decides with (:func:`board_times`' ``asked``: ``--board-times``); ``speed``: how fast it
    runs (:func:`board_speed`'s ``asked``: ``--board-speed``)."""
    run, frames, link_rates = read_trace(trace)  # a bad trace is refused anywhere, first
    reason = unavailable_reason()
    if reason is not None:
        raise SplitEdgeError(f"cannot emulate a link here: {reason} (a replay needs root, ip and tc)")
    recorded_times = _records_head_times(trace)
    decided_with, why = board_times(run, recorded_times, _bundle_id(bundle), policy, times)
    paced, paced_why = board_speed(run, _bundle_id(bundle), speed)
    link_record = recorded_link(frames, link_rates)
    input_source = replay_source(run, source)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    new_trace = folder / TRACE_FILE
    new_trace.unlink(missing_ok=True)  # the new run's record is waited for: not an older one's
    count = max(f["index"] for f in frames) + 1
    schedule = link_record.schedule
    record: dict[str, Any] = {
        "original": str(trace), "trace": str(new_trace), "bundle": str(bundle), "policy": policy,
        "source": input_source, "frames": count, "rate_from": link_record.rate_from,
        "rtt": NO_RTT, "board_times": decided_with, "board_times_why": why, "board_speed": paced,
        "board_speed_why": paced_why,
        "schedule": [[s.rate_mbit, s.duration_s] for s in schedule.steps],
    }
    # The host passes a chain's later stages on to itself, as the trial's did where it ran chains.
    with EmulatedLink(rate_mbit=schedule.rate_at(0.0)) as link, \
            serve_in(link, [bundle], port, own_peer(link, port)) as host, \
            (folder / BOARD_LOG).open("w", encoding="utf-8") as log:
        record["board_argv"] = argv = board_argv(run, count, bundle, policy, input_source, host, new_trace,
                                                 trace if decided_with == RECORDED else None,
                                                 trace if paced == RECORDED else None)
        board = launch(argv, log)
        try:
            asyncio.run(_drive(link, schedule, new_trace, board, f"testbed replay of {Path(trace).name}"))
            board.wait(timeout=_END_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise SplitEdgeError(f"the board did not finish {count} frames within {_END_TIMEOUT_S:g} s of the "
                                 f"schedule's end (see {folder / BOARD_LOG})") from None
        finally:
            if board.poll() is None:
                board.kill()
                board.wait()
    if board.returncode != 0:
        raise SplitEdgeError(f"the board's run failed with status {board.returncode}: see {folder / BOARD_LOG}")
    (folder / RECORD_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return record


EXAMPLES = """\
examples (as root: the link is a network namespace shaped by tc):
  python -m testbed replay trial.jsonl --bundle bundle/ --out replay/                 # the same bundle and policy
  python -m testbed replay trial.jsonl --bundle bundle/ --board-times measured --out replay-here/  # this board's heads
  python -m testbed replay trial.jsonl --bundle bundle/ --board-speed own --out replay-fast/  # this board's speed
  python -m testbed replay trial.jsonl --bundle other-bundle/ --policy local --out replay-local/
  python -m testbed replay trial.jsonl --bundle bundle/ --source synthetic:10 --out replay/  # a camera's trial
  split-device report trial.jsonl replay/replay.jsonl --out compare/                  # the two side by side
"""


def add_parser(commands: Any) -> None:
    """``replay``'s subcommand in ``python -m testbed``."""
    parser = commands.add_parser("replay", help="run a stream again under the link a trace recorded",
                                 description="Run a stream again under the link a trace recorded: its rates (the link_rate records, "
                                 "else the board's estimates) on the testbed's kernel link, the same input, a new trace.",
                                 epilog=EXAMPLES,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace", help="JSONL trace written by split-device run --trace")
    parser.add_argument("--bundle", required=True, help="the bundle to run (the board's heads, the host's tails)")
    parser.add_argument("--policy", default="auto",
                        help="--split of the replay: auto (default: the bundle's calibration.json) or a split id, "
                             "local or offload")
    parser.add_argument("--source", help="the input, where the trace's is a camera or not here: a video file, a "
                                         "folder of images or synthetic:FPS (default: the trace's)")
    parser.add_argument("--out", default="replay", metavar="DIR",
                        help=f"directory for {TRACE_FILE}, {RECORD_FILE} and {BOARD_LOG} (default replay)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"the host's port (default {DEFAULT_PORT})")
    parser.add_argument("--board-times", choices=(RECORDED, MEASURED), default=None,
                        help="with --policy auto, the head times the board decides with: recorded (the trial's: its "
                             "calibrated ones and each refinement, from the frame it made it; the replay then differs "
                             "only where the link or the host did) or measured (this machine's own, refined as it "
                             "runs); default: recorded where the bundle is the trial's and its trace has them, else "
                             "measured (replay.json says which and why)")
    parser.add_argument("--board-speed", choices=(RECORDED, OWN), default=None,
                        help="how fast the board runs: recorded (each stage held to the time it took on the trial's "
                             "board, frame by frame, where this board is at least as fast: the replay's latency is the "
                             "trial's board's) or own (this machine's); default: recorded where the bundle is the "
                             "trial's, else own (replay.json says which and why)")


def main(args: argparse.Namespace) -> str:
    """Run ``replay`` from parsed arguments; the lines to print."""
    record = replay(args.trace, args.bundle, args.out, args.policy, args.source, args.port, times=args.board_times,
                    speed=args.board_speed)
    steps = record["schedule"]
    seconds = sum(duration for _, duration in steps)
    board = f"\nhead times: {record['board_times']}, {record['board_times_why']}" if record["board_times"] else ""
    board += f"\nboard speed: {record['board_speed']}, {record['board_speed_why']}"
    return (f"replayed {seconds:.1f} s of link in {len(steps)} steps from {record['rate_from']}; round-trip time "
            f"{record['rtt']}\n{record['frames']} frames of {record['source']} with {record['bundle']} "
            f"(--split {record['policy']}){board}\nwrote {record['trace']} and {Path(args.out) / RECORD_FILE}; "
            f"compare: split-device report {record['original']} {record['trace']} --out compare/")
