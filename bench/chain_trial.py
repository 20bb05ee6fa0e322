"""The seed-003 paper's experiment, on splitedge: device → edge → cloud chains of its 14-layer CNN.

The DNN-slicing simulator (seed-003 paper) cuts its CNN (Table 1, ``bench/seed003_cnn.py``)
twice: the device runs it up to the first cut (after layer 1 or 3), the edge to the second
(after layer 8, 9, 10 or 11), the cloud the rest, and it reports, for 50 frames under three
network configurations (Table 2), the total processing time and the frame drop rate (Tables
3-5). Here the same eight cut pairs are splitedge chains (``split-export build --chain``), and
for comparison the two single cuts (device, then the edge runs the rest) and the device alone:

* **tiers** (``bench/three_tiers.py``): three network namespaces (board, edge, cloud), each
  behind its own veth pair shaped by the kernel's tbf (:class:`testbed.EmulatedLink`); the root
  namespace joins them, as docker-compose's bridge joins the paper's containers. The edge (``split-host serve --peer``
  the cloud) and the cloud (``split-host serve``) run in theirs; the board is ``split-device
  run --split CHAIN --host EDGE --host CLOUD`` in its own, a synthetic camera at ``--fps``.
* **latency**: the paper's ``tc`` delays every agent's interface both ways (device 2.5 ms, edge
  2.5 ms, cloud 250 or 1000 ms), so a message between two agents takes both agents' delays: a
  :class:`testbed.DelayRelay` in the root namespace adds device + edge (5 ms) each way between
  board and edge, and edge + cloud (252.5 or 1002.5 ms) between edge and cloud (the kernel here
  has no netem). The paper states no bandwidth for any link but its "max throughput".
* **throughput**: Table 2's "max throughput" (500,000 or 50,000, in bytes of serialized tensor)
  is read as bytes per second on every agent's interface: each veth shaped to 4 or 0.4 Mbit/s
  (tbf counts the packets' headers too; the paper's limit counted payload).
* **overhead**: the paper's x10 / x5 / x1 (device / edge / cloud) is a sleep of that many times
  each inference's time, as its agents did (``bench/tier.py``).
* **frames**: the paper's 50 frames at ``--fps`` (1 by default: its 50 frames took 47.8-50.8 s,
  about one a second), then a longer stream (``--stream-frames`` at ``--stream-fps``). The camera
  is live: a frame that arrives while the pipeline is full replaces the waiting one (dropped, the
  drop rate's numerator). Frames have no deadline at the hosts (``--deadline-ms 0``): a chain
  whose cloud is a WAN away would otherwise be refused and answered on the board.

Per run: total processing time (first capture to last answer, the paper's "Time"), the drop rate,
per-frame latency (mean, p50, p95), and each hop's link, queue and compute times from the replies.
Results: a table, ``--out`` (JSON) and a PNG beside it. Needs root (namespaces, tbf). Everything it
creates is removed on exit, Ctrl-C and SIGTERM included.

    python bench/chain_trial.py --out build/bench/chain_trial.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from seed003_cnn import CUT_AFTER, TABLE_1
from seed003_cnn import train as train_model
from three_tiers import Network, cancelled_by_sigterm, run_board, three_tiers

from device_runtime.bundle import LOCAL
from testbed import unavailable_reason

MODEL = "bench.seed003_cnn:make"
DEVICE_ROWS, CLOUD_ROWS = (1, 3), (8, 9, 10, 11)  # Section 4.2's candidate cuts, by Table 1 row
OVERHEAD = {"board": 10.0, "edge": 5.0, "cloud": 1.0}  # Table 2
BOARD_TIMEOUT_S = 15.0  # a host silent this long is gone: well past a 0.4 Mbit/s upload behind another


@dataclass(frozen=True)
class NetConfig:
    """One of Table 2's configurations."""

    name: str
    latency_ms: tuple[float, float, float]  # tc's delay on the device's, edge's, cloud's interface, each way
    throughput: int  # "max throughput": bytes per second, every interface

    @property
    def rate_mbit(self) -> float:
        return self.throughput * 8 / 1e6

    def one_way_ms(self, a: int, b: int) -> float:
        """A message from tier ``a`` to tier ``b`` leaves one delayed interface and enters another."""
        return self.latency_ms[a] + self.latency_ms[b]

    @property
    def network(self) -> Network:
        return Network((self.rate_mbit,) * 3, self.one_way_ms(0, 1), self.one_way_ms(1, 2))


CONFIGS = {c.name: c for c in (NetConfig("1", (2.5, 2.5, 250.0), 500_000), NetConfig("2", (2.5, 2.5, 250.0), 50_000),
                               NetConfig("3", (2.5, 2.5, 1000.0), 500_000))}

#: Tables 3-5: (first cut's row, second cut's row) -> (time for 50 frames in s, frame drop rate), per configuration.
PAPER: dict[str, dict[tuple[int, int], tuple[float, float]]] = {
    "1": {(1, 8): (49.7454, 0.18), (1, 9): (49.7391, 0.14), (1, 10): (49.7301, 0.34), (1, 11): (49.8100, 0.18),
          (3, 8): (49.8244, 0.16), (3, 9): (49.8072, 0.18), (3, 10): (50.2666, 0.22), (3, 11): (49.5615, 0.20)},
    "2": {(1, 8): (50.7831, 0.68), (1, 9): (49.5615, 0.78), (1, 10): (50.2550, 0.62), (1, 11): (50.2487, 0.64),
          (3, 8): (49.3895, 0.68), (3, 9): (49.3894, 0.66), (3, 10): (48.3246, 0.56), (3, 11): (47.8205, 0.60)},
    "3": {(1, 8): (49.8217, 0.28), (1, 9): (49.7521, 0.22), (1, 10): (49.7888, 0.08), (1, 11): (49.7549, 0.08),
          (3, 8): (49.8062, 0.14), (3, 9): (49.7817, 0.08), (3, 10): (49.7446, 0.12), (3, 11): (49.7721, 0.10)},
}


@dataclass(frozen=True)
class Option:
    """What the board runs: a chain over edge and cloud, a single cut with the edge, or the model alone."""

    split: str
    label: str  # as the paper's tables name a cut pair
    rows: tuple[int, ...]  # the Table 1 rows it is cut after

    @property
    def hosts(self) -> int:
        return len(self.rows)


def options() -> list[Option]:
    def named(rows: tuple[int, ...]) -> Option:
        label = " - ".join(TABLE_1[r - 1][0] for r in rows) + (" | edge" if len(rows) == 1 else "")
        return Option("+".join(CUT_AFTER[r] for r in rows), label, rows)

    return [*(named((d, c)) for d in DEVICE_ROWS for c in CLOUD_ROWS), *(named((d,)) for d in DEVICE_ROWS),
            Option(LOCAL, "local (device only)", ())]


# --------------------------------------------------------------------------- the bundle


def build(root: Path, random_weights: bool, epochs: int) -> tuple[Path, dict]:
    """The bundle (both single cuts and the eight chains), with the model trained on Fashion-MNIST
    unless ``random_weights``; cached in ``root``. Returns it and what is known of the model."""
    from exporter._build import BuildSpec, build_bundle

    weights, info_path, bundle = root / "weights.pt", root / "model.json", root / "bundle"
    if not random_weights and not weights.is_file():
        print(f"training the CNN on Fashion-MNIST ({epochs} epochs) ...", flush=True)
        info_path.write_text(json.dumps({"epochs": epochs, "test_accuracy": train_model(weights, epochs)}))
    info = json.loads(info_path.read_text()) if not random_weights else {"weights": "random"}
    if not (bundle / "manifest.json").is_file():
        chains = [o.rows for o in options() if o.hosts == 2]
        build_bundle(BuildSpec(MODEL, weights=None if random_weights else weights, splits=[CUT_AFTER[r] for r in DEVICE_ROWS], chains=[[CUT_AFTER[r] for r in rows] for rows in chains]), bundle, progress=False)
    return bundle, info


# --------------------------------------------------------------------------- figures


def print_config(name: str, results: dict[str, dict], paper_frames: int) -> None:
    config = CONFIGS[name]
    print(f"\nconfiguration {name}: latency {'/'.join(f'{v:g}' for v in config.latency_ms)} ms, "
          f"{config.throughput:,} B/s ({config.rate_mbit:g} Mbit/s) per interface")
    print(f"{'split points':36s} {'paper s':>7s} {'drop':>5s} | {'ours s':>6s} {'mean':>6s} {'p50':>6s} {'p95':>6s} "
          f"{'drop':>5s} | stream: {'s':>5s} {'mean':>6s} {'p50':>6s} {'p95':>6s} {'drop':>5s} | hops p50 ms")
    for r in results.values():
        paper = PAPER[name].get(tuple(r["rows"]))
        p = f"{paper[0]:7.2f} {paper[1]:5.2f}" if paper else f"{'':7s} {'':5s}"
        a, s = r["paper_frames"], r["stream"]
        hops = ", ".join(f"{leg} {t['p50']:.1f}" for leg, t in a["hops_ms"].items() if "queue" not in leg)
        print(f"{r['label']:36s} {p} | {a['time_s']:6.2f} {a['mean_ms']:6.0f} {a['p50_ms']:6.0f} {a['p95_ms']:6.0f} "
              f"{a['drop_rate']:5.2f} | {s['time_s']:13.2f} {s['mean_ms']:6.0f} {s['p50_ms']:6.0f} {s['p95_ms']:6.0f} "
              f"{s['drop_rate']:5.2f} | {hops}")
    print(f"(paper: {paper_frames} frames; times in s, latencies in ms; drop = frame drop rate)")


def plot(report: dict, out: Path) -> None:
    """Per configuration: the time for the paper's frames, the drop rate (paper, ours, our stream), latency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["results"])
    fig, axes = plt.subplots(3, len(names), figsize=(6 * len(names), 11), squeeze=False)
    for col, name in enumerate(names):
        rows = list(report["results"][name].values())
        x = np.arange(len(rows))
        paper = [PAPER[name].get(tuple(r["rows"]), (np.nan, np.nan)) for r in rows]
        time_ax, drop_ax, lat_ax = axes[:, col]
        time_ax.bar(x - 0.2, [p[0] for p in paper], 0.4, label="paper", color="lightgray")
        time_ax.bar(x + 0.2, [r["paper_frames"]["time_s"] for r in rows], 0.4, label="ours", color="steelblue")
        time_ax.set_title(f"configuration {name}: time for {report['frames']} frames at {report['fps']:g} fps (s)")
        drop_ax.bar(x - 0.27, [p[1] for p in paper], 0.27, label="paper", color="lightgray")
        drop_ax.bar(x, [r["paper_frames"]["drop_rate"] for r in rows], 0.27, label=f"ours, {report['frames']} frames",
                    color="steelblue")
        drop_ax.bar(x + 0.27, [r["stream"]["drop_rate"] for r in rows], 0.27,
                    label=f"ours, {report['stream_frames']} at {report['stream_fps']:g} fps", color="darkorange")
        drop_ax.set_title("frame drop rate")
        for offset, run, color in ((-0.2, "paper_frames", "steelblue"), (0.2, "stream", "darkorange")):
            p50 = np.array([r[run]["p50_ms"] for r in rows])
            p95 = np.array([r[run]["p95_ms"] for r in rows])
            lat_ax.bar(x + offset, p50, 0.4, yerr=[np.zeros_like(p50), p95 - p50], color=color, capsize=2,
                       label=f"p50 (bar) to p95, {report['frames'] if run == 'paper_frames' else report['stream_frames']} frames")
        lat_ax.set_title("per-frame latency (ms)")
        for ax in (time_ax, drop_ax, lat_ax):
            ax.set_xticks(x, [r["label"] for r in rows], rotation=60, ha="right", fontsize=7)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- main


async def trial(args: argparse.Namespace, bundle: Path, report: dict, work: Path) -> None:
    chosen = [o for o in options() if args.only is None or o.split in args.only]
    first = CONFIGS[args.configs[0]]
    async with three_tiers(bundle, first.network, OVERHEAD) as tiers:
        for name in args.configs:
            tiers.apply(CONFIGS[name].network)
            results = report["results"].setdefault(name, {})
            for option in chosen:
                board = [(args.fps, args.frames), (args.stream_fps, args.stream_frames)]
                hosts = ("edge", "cloud")[: max(option.hosts, 1)]
                paper, stream = [await run_board(tiers, bundle, option.split, hosts, fps, frames, work, BOARD_TIMEOUT_S)
                                 for fps, frames in board]
                entry = {**asdict(option), "paper_frames": paper, "stream": stream}
                results[option.split] = entry
                a, s = entry["paper_frames"], entry["stream"]
                print(f"  config {name} {option.label:36s} {args.frames} frames: {a['time_s']:6.2f} s, p50 "
                      f"{a['p50_ms']:6.0f} ms, drops {a['drop_rate']:.2f}; {args.stream_frames} frames: "
                      f"{s['time_s']:6.2f} s, p50 {s['p50_ms']:6.0f} ms, drops {s['drop_rate']:.2f}", flush=True)
            print_config(name, results, args.frames)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default="1,2,3", type=lambda s: [c for c in s.split(",") if c],
                        help="Table 2's configurations to run (default 1,2,3)")
    parser.add_argument("--only", type=lambda s: set(s.split(",")), help="only these split ids (default: all)")
    parser.add_argument("--frames", type=int, default=50, help="the paper's frames per run (default 50)")
    parser.add_argument("--fps", type=float, default=1.0, help="their camera's rate (default 1: the paper's ~1 s a frame)")
    parser.add_argument("--stream-frames", type=int, default=300, help="the longer stream's frames (default 300)")
    parser.add_argument("--stream-fps", type=float, default=10.0, help="the longer stream's rate (default 10)")
    parser.add_argument("--epochs", type=int, default=2, help="Fashion-MNIST training epochs (default 2)")
    parser.add_argument("--random-weights", action="store_true", help="do not train: only time matters")
    parser.add_argument("--build", type=Path, default=Path("build/bench/seed003"), help="weights and bundle (cached)")
    parser.add_argument("--out", type=Path, default=Path("build/bench/chain_trial.json"))
    args = parser.parse_args()
    unknown = [c for c in args.configs if c not in CONFIGS]
    if unknown or min(args.fps, args.stream_fps) <= 0 or min(args.frames, args.stream_frames) < 1:
        parser.error(f"configurations are {', '.join(CONFIGS)}; frames and rates must be positive")
    reason = unavailable_reason()
    if reason is not None:
        raise SystemExit(f"cannot emulate the tiers' links here: {reason}")
    args.build.mkdir(parents=True, exist_ok=True)
    bundle, model = build(args.build.resolve(), args.random_weights, args.epochs)
    report = {"benchmark": "chain_trial", "machine": platform.machine(), "cpus": os.cpu_count(),
              "python": platform.python_version(), "load_average": os.getloadavg(), "started": time.strftime("%F %T"),
              "model": model, "frames": args.frames, "fps": args.fps, "stream_frames": args.stream_frames,
              "stream_fps": args.stream_fps, "overhead": OVERHEAD,
              "configs": {n: asdict(CONFIGS[n]) for n in args.configs}, "results": {}}
    with tempfile.TemporaryDirectory(prefix="chain-trial-") as work:
        try:
            asyncio.run(cancelled_by_sigterm(trial(args, bundle.resolve(), report, Path(work))))
        except (KeyboardInterrupt, asyncio.CancelledError):
            raise SystemExit("stopped: the namespaces, links, relays and processes it made are removed") from None
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    plot(report, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
