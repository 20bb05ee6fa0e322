"""Does a chain pay? The best chain against the best single cut and the board alone, predicted and measured.

Issue 17's benchmark. A board on weak Wi-Fi, a slow edge box near it, a fast cloud behind the edge
on a fast link (``bench/three_tiers.py``: three shaped namespaces, delay relays, real hosts):

* **links**: the board's veth 30 Mbit/s and 5 ms each way to the edge (a Pi's 2.4 GHz Wi-Fi);
  the edge's and the cloud's veths 500 Mbit/s and 2 ms each way between them (wired).
  The board reaches the edge only, as in the seed-003 paper's topology (a board on an isolated
  IoT network; the cloud takes requests from the fleet's hosts). Where the board can reach the
  cloud as fast as the edge, skipping the edge wins (the placement tests show that case).
* **compute**: every inference followed by a sleep of ``overhead`` times its duration
  (``bench/tier.py``): x40 on the board (this machine's core is ~40 times a Pi Zero 2 W's on
  MobileNetV2), x20 on the edge (a Pi 4-class gateway), none in the cloud; one thread each.
* **model**: MobileNetV2 with its ImageNet weights, cut after ``features_4_conv_2`` (32x28x28,
  100 KB a frame) and ``features_7_conv_2`` (64x14x14, 50 KB): the two single cuts (the edge
  runs the rest) and the chain (edge from the first cut to the second, cloud the rest).

**Predicted** (the hand calculation, DSC Eq. 4 extended to chains, :mod:`calibration.chains`):
each piece timed here with onnxruntime on one thread (median of ``--repeats``) times its tier's
1 + overhead, the links' rates and round trips as configured: ``local = full``, ``cut =
head + 8·bytes/r + rtt + tail``, and the chain's best placement by :func:`calibration.place`.
**Measured**, each option in the same run on the testbed: per-frame latency p50/p95 of
``--frames`` frames at ``--fps`` (spaced so none waits for another), and throughput (answers per
second) of a ``--stream-frames`` stream at ``--stream-fps`` (live camera: frames the pipeline
cannot take are dropped). Target (issue 17): where the prediction says a chain wins, it wins
(measured p50 against the best other option's) by at least 80% of the predicted margin.

    make build/bench/chain-bundle/manifest.json   # the bundle (see ``bundle_command``)
    python bench/chain_vs_cut.py --out build/bench/chain_vs_cut.json

Needs root. Writes a table, JSON and a PNG beside it; everything it creates is removed on exit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from three_tiers import Network, cancelled_by_sigterm, run_board, three_tiers

from calibration import LatencyModel, SplitTimings
from calibration.chains import ChainStage, HostView, place
from device_runtime.bundle import FULL, HEAD, LOCAL, TAIL, Bundle
from device_runtime.engine._backend import OnnxBackend
from testbed import unavailable_reason

NETWORK = Network(rates_mbit=(30.0, 500.0, 500.0), board_edge_ms=5.0, edge_cloud_ms=2.0)
OVERHEAD = {"board": 40.0, "edge": 20.0, "cloud": 0.0}
CUTS = ("features_4_conv_2", "features_7_conv_2")
TARGET = 0.8  # of the predicted margin
BOARD_TIMEOUT_S = 10.0
EDGE, CLOUD = "edge", "cloud"


def bundle_command(out: Path) -> str:
    return (f"split-export build torchvision:mobilenet_v2 --weights WEIGHTS --splits {','.join(CUTS)} "
            f"--chain {','.join(CUTS)} --out {out}")


@dataclass(frozen=True)
class Option:
    split: str
    kind: str  # local | cut | chain
    hops: int  # hosts its stages run on

    @property
    def label(self) -> str:
        return {"local": "board alone", "cut": f"{self.split} | edge", "chain": f"{self.split} | edge > cloud"}[self.kind]


def options(bundle: Bundle) -> list[Option]:
    found = [Option(LOCAL, "local", 0)]
    for split in bundle.manifest.splits:
        found.append(Option(split.id, "chain", len(split.stages)) if split.stages else Option(split.id, "cut", 1))
    return found


# --------------------------------------------------------------------------- the hand calculation


def time_ms(path: Path, shape: tuple[int, ...], repeats: int) -> float:
    """Median ms of one batch-1 run on one thread, after a warm-up."""
    backend = OnnxBackend(path, threads=1)
    x = np.random.default_rng(0).random((1, *shape), dtype=np.float32)
    for _ in range(3):
        backend.run(x)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        backend.run(x)
        times.append((time.perf_counter() - start) * 1000.0)
    return statistics.median(times)


def predict(bundle: Bundle, repeats: int) -> dict[str, dict]:
    """Each option's predicted latency at batch 1 and the terms it is made of."""
    slow = {tier: 1.0 + ratio for tier, ratio in OVERHEAD.items()}
    manifest = bundle.manifest
    inputs = manifest.model.input_shape
    rate = NETWORK.rates_mbit[0] * 1e6  # the board's veth is the narrowest on the way to the edge
    rtt = 2 * NETWORK.board_edge_ms
    edge_cloud = (min(NETWORK.rates_mbit[1:]) * 1e6, 2 * NETWORK.edge_cloud_ms)
    full = time_ms(bundle.artifact(LOCAL, FULL), inputs, repeats) * slow["board"]
    predicted = {LOCAL: {"predicted_ms": full, "terms": {"board full model": full}}}
    for split in manifest.splits:
        head = time_ms(bundle.artifact(split.id, HEAD), inputs, repeats) * slow["board"]
        if not split.stages:
            tail = time_ms(bundle.artifact(split.id, TAIL), split.tensor.shape, repeats) * slow["edge"]
            model = LatencyModel((SplitTimings(split.id, split.tensor.bytes_per_sample, {1: head}, {1: tail}),), rtt)
            predicted[split.id] = {"predicted_ms": model.predict_ms(split.id, 1, rate), "hosts": [EDGE],
                                   "terms": {"board head": head, **model.terms_ms(split.id, 1, rate)}}
            continue
        stages = [ChainStage(split.stage_id(s.index), s.tensor.bytes_per_sample) for s in split.stages]
        base = {stage.name: time_ms(bundle.stage_artifact(split.id, s.index), s.tensor.shape, repeats)
                for stage, s in zip(stages, split.stages)}
        edge = HostView(EDGE, {n: {1: ms * slow["edge"]} for n, ms in base.items()}, rate_bps=rate, rtt_ms=rtt,
                        peers={CLOUD: edge_cloud})
        cloud = HostView(CLOUD, {n: {1: ms * slow["cloud"]} for n, ms in base.items()})  # the board cannot reach it
        placement = place(split.id, stages, {1: head}, [edge, cloud], batch=1)
        assert placement is not None, f"no placement of {split.id}"
        predicted[split.id] = {
            "predicted_ms": placement.predicted_ms, "hosts": list(placement.hosts),
            "terms": {"board head": head, "board link": 8 * stages[0].bytes_per_sample * 1e3 / rate + rtt,
                      **{f"{n} on {EDGE}": ms * slow[EDGE] for n, ms in base.items()},
                      **{f"{n} on {CLOUD}": ms * slow[CLOUD] for n, ms in base.items()},
                      "hosts' part (placed)": placement.timings.tail_at(1)},
        }
    return predicted


# --------------------------------------------------------------------------- the testbed runs


async def measure(args: argparse.Namespace, bundle: Path, chosen: list[Option], predicted: dict, work: Path) -> dict:
    """Each option's latency run and throughput run, one after another on the same tiers."""
    results = {}
    async with three_tiers(bundle, NETWORK, OVERHEAD) as tiers:
        for option in chosen:
            hosts = predicted[option.split].get("hosts", [EDGE])
            latency, stream = [await run_board(tiers, bundle, option.split, hosts, fps, frames, work, BOARD_TIMEOUT_S)
                               for fps, frames in ((args.fps, args.frames), (args.stream_fps, args.stream_frames))]
            results[option.split] = {"latency": latency, "stream": stream}
            print(f"  {option.label:44s} p50 {latency['p50_ms']:6.1f} ms, p95 {latency['p95_ms']:6.1f} ms "
                  f"(predicted {predicted[option.split]['predicted_ms']:6.1f}); {stream['throughput_fps']:5.2f} frames/s",
                  flush=True)
    return results


def verdict(chosen: list[Option], predicted: dict, measured: dict) -> dict:
    """Where the prediction has a chain best: its predicted margin over the best other option, the
    measured one (p50 against the best other option measured), and whether it met the target."""
    chains = [o.split for o in chosen if o.kind == "chain"]
    others = [o.split for o in chosen if o.kind != "chain"]
    best_chain = min(chains, key=lambda s: predicted[s]["predicted_ms"])
    rival = min(others, key=lambda s: predicted[s]["predicted_ms"])
    margin = predicted[rival]["predicted_ms"] - predicted[best_chain]["predicted_ms"]
    measured_rival = min(others, key=lambda s: measured[s]["latency"]["p50_ms"])
    won = measured[measured_rival]["latency"]["p50_ms"] - measured[best_chain]["latency"]["p50_ms"]
    return {"chain": best_chain, "predicted_rival": rival, "predicted_margin_ms": margin,
            "measured_rival": measured_rival, "measured_margin_ms": won,
            "fraction": won / margin if margin > 0 else None,
            "met": None if margin <= 0 else won >= TARGET * margin}


def print_table(chosen: list[Option], predicted: dict, measured: dict, result: dict) -> None:
    print(f"\n{'option':44s} {'predicted':>9s} {'p50':>7s} {'p95':>7s} {'mean':>7s} | {'frames/s':>8s} {'drop':>5s} | where")
    for option in chosen:
        p, m = predicted[option.split], measured[option.split]
        lat, st = m["latency"], m["stream"]
        print(f"{option.label:44s} {p['predicted_ms']:9.1f} {lat['p50_ms']:7.1f} {lat['p95_ms']:7.1f} "
              f"{lat['mean_ms']:7.1f} | {st['throughput_fps']:8.2f} {st['drop_rate']:5.2f} | "
              f"{' > '.join(['board', *p.get('hosts', [])])}")
    if result["met"] is None:
        print(f"the prediction has no chain winning (best chain {result['chain']} is "
              f"{-result['predicted_margin_ms']:.1f} ms behind {result['predicted_rival']}): no target applies")
        return
    print(f"predicted: {result['chain']} beats {result['predicted_rival']} by {result['predicted_margin_ms']:.1f} ms; "
          f"measured: by {result['measured_margin_ms']:.1f} ms against {result['measured_rival']} "
          f"({result['fraction']:.0%} of the predicted margin; target {TARGET:.0%}: "
          f"{'met' if result['met'] else 'NOT met'})")


def plot(chosen: list[Option], predicted: dict, measured: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = np.arange(len(chosen))
    fig, (lat_ax, thr_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    p50 = np.array([measured[o.split]["latency"]["p50_ms"] for o in chosen])
    p95 = np.array([measured[o.split]["latency"]["p95_ms"] for o in chosen])
    lat_ax.bar(x - 0.2, [predicted[o.split]["predicted_ms"] for o in chosen], 0.4, color="lightgray",
               label="predicted (Eq. 4, chains extended)")
    lat_ax.bar(x + 0.2, p50, 0.4, yerr=[np.zeros_like(p50), p95 - p50], capsize=3, color="steelblue",
               label="measured p50 (bar) to p95")
    lat_ax.set_title("per-frame latency (ms), frames spaced")
    thr_ax.bar(x, [measured[o.split]["stream"]["throughput_fps"] for o in chosen], 0.5, color="darkorange")
    thr_ax.set_title("throughput (answers/s), live camera stream")
    for ax in (lat_ax, thr_ax):
        ax.set_xticks(x, [o.label for o in chosen], rotation=20, ha="right", fontsize=8)
    lat_ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=Path, default=Path("build/bench/chain-bundle"),
                        help="a MobileNetV2 bundle with the two cuts and their chain (default build/bench/chain-bundle)")
    parser.add_argument("--frames", type=int, default=60, help="frames of each latency run (default 60)")
    parser.add_argument("--fps", type=float, default=3.0, help="their rate: spaced, none waits (default 3)")
    parser.add_argument("--stream-frames", type=int, default=150, help="frames of each throughput run (default 150)")
    parser.add_argument("--stream-fps", type=float, default=30.0, help="its camera's rate (default 30)")
    parser.add_argument("--repeats", type=int, default=50, help="timed runs per piece for the prediction (default 50)")
    parser.add_argument("--out", type=Path, default=Path("build/bench/chain_vs_cut.json"))
    args = parser.parse_args()
    if min(args.fps, args.stream_fps) <= 0 or min(args.frames, args.stream_frames, args.repeats) < 1:
        parser.error("frames, rates and repeats must be positive")
    if not (args.bundle / "manifest.json").is_file():
        raise SystemExit(f"{args.bundle}: no bundle; build it first: {bundle_command(args.bundle)}")
    reason = unavailable_reason()
    if reason is not None:
        raise SystemExit(f"cannot emulate the tiers' links here: {reason}")
    bundle = Bundle.load(args.bundle)
    chosen = options(bundle)
    if not any(o.kind == "chain" for o in chosen):
        raise SystemExit(f"{args.bundle}: no chain in it; build it with: {bundle_command(args.bundle)}")
    predicted = predict(bundle, args.repeats)
    with tempfile.TemporaryDirectory(prefix="chain-vs-cut-") as work:
        try:
            measured = asyncio.run(cancelled_by_sigterm(measure(args, args.bundle.resolve(), chosen, predicted, Path(work))))
        except (KeyboardInterrupt, asyncio.CancelledError):
            raise SystemExit("stopped: the namespaces, links, relays and processes it made are removed") from None
    result = verdict(chosen, predicted, measured)
    print_table(chosen, predicted, measured, result)
    report = {"benchmark": "chain_vs_cut", "machine": platform.machine(), "cpus": os.cpu_count(),
              "python": platform.python_version(), "started": time.strftime("%F %T"), "load_average": os.getloadavg(),
              "network": NETWORK.to_dict(), "overhead": OVERHEAD, "bundle": bundle.id, "frames": args.frames,
              "fps": args.fps, "stream_frames": args.stream_frames, "stream_fps": args.stream_fps,
              "predicted": predicted, "measured": measured, "verdict": result}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    plot(chosen, predicted, measured, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
