"""SplitPlace on a fleet: layer-only, semantic-only, random, SplitPlace's ε-greedy bandit and ours.

Issue 18's benchmark, after the SplitPlace paper's comparison (seed 004, §6): the same frames with
the same deadlines through five policies, on an emulated fleet of edge hosts.

* **model**: :func:`exporter.zoo.fmnist_camera` trained on Fashion-MNIST, cut at ``_14`` twice: a
  layer split (the host runs the rest) and a semantic split of 3 fragments at width 0.5
  (``split-export build --semantic 3``). The manifest's accuracies (full, layer, semantic) are
  what the bandits weigh; the frames' true labels measure what each policy got right.
* **fleet**: four hosts, each ``split-host serve`` in its own network namespace behind a tbf-shaped
  veth and a delay relay, each slowed like a machine busy with others' work (``bench/tier.py``:
  every inference followed by ``overhead`` times its time asleep). The layer split runs on the
  host the board connects to; the semantic split's fragments are placed on the others by
  :func:`calibration.place_fragments` from their loads (the overheads, as a host advertises its
  queue), one per host.
* **board**: this process (the root namespace), one onnxruntime thread, slowed x``--board-overhead``.
* **workload**: Fashion-MNIST test images at ``--fps`` (spaced: a frame does not wait for the one
  before), each with a deadline drawn, seeded, from the tight distribution (half the frames) or
  the loose one; the same frames and deadlines for every policy.
* **policies**: ``layer`` and ``semantic`` (always that split), ``random`` (a fair coin per frame),
  ``splitplace`` (the paper's two-context bandit, feedback ε-greedy, learning as it goes: Eq. 2-8)
  and ``ours`` (the same bandit as ``split-device run`` uses it: ε-greedy while learning
  (``--learn``) for the first ``--learn-frames``, then discounted UCB on what it learned, still
  learning: Eq. 9 with D-UCB; :mod:`calibration.bandit`). Both start knowing nothing.

Per policy: mean response time (capture to answer), deadline-violation rate, top-1 accuracy on the
frames' labels, mean reward (SplitPlace's: 0.5·[on time] + 0.5·clip((accuracy − 0.9)·10, 0, 1),
with the arm's accuracy from the manifest, as the bandits see it), and the share sent semantic;
for each deadline class apart too. Target (issue 18): the bandit beats both single strategies on
reward and cuts violations against layer-only by at least a third.

    python bench/splitplace.py --out build/bench/splitplace.json

Needs root (namespaces, tbf). Writes a table, JSON and a PNG beside it; removes what it made.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Collection, Iterator

import numpy as np
from three_tiers import HOST_ARGS, PORT, cancelled_by_sigterm, tier_command
from tier import slow_down

from calibration.bandit import Bandit, LAYER, SEMANTIC, reward
from calibration.chains import HostView
from calibration.fragments import place_fragments
from device_runtime.bundle import Bundle
from device_runtime.engine._runner import DeviceRunner
from device_runtime.hosts._host_link import HostLink
from device_runtime.stream import (
    BanditPolicy, Choice, Frame, FrameResult, FrameSource, Pipeline, PipelineConfig, Reason, SplitPolicy, StaticPolicy,
)
from device_runtime.stream._reason import FIXED
from testbed import DelayRelay, EmulatedLink, unavailable_reason
from testbed._namespace_host import running_host

CUT, FRAGMENTS = "_14", 3
SEMANTIC_SPLIT = f"{CUT}~{FRAGMENTS}"
POLICIES = ("layer", "semantic", "random", "splitplace", "ours")


@dataclass(frozen=True)
class Host:
    """One edge host of the fleet: its link from the board and how busy it is."""

    name: str
    rate_mbit: float
    one_way_ms: float
    overhead: float  # bench/tier.py's: every inference followed by this many times its time asleep


#: The layer split's host first (the board connects to it): a capable host further away, which can
#: run the whole tail; then the semantic split's candidates, small edge hosts near the board, busy
#: with others' work, on which the narrow fragments fit (SplitPlace's premise). Small overheads:
#: a sleep of N times an inference's time multiplies its jitter by N too.
FLEET = (Host("h0", 50.0, 20.0, 10.0), Host("h1", 20.0, 3.0, 50.0), Host("h2", 20.0, 3.0, 50.0),
         Host("h3", 10.0, 4.0, 100.0))


# --------------------------------------------------------------------------- the bundle and the frames


def build(root: Path, epochs: int, images: int | None) -> Path:
    """The model trained and cut (cached in ``root``)."""
    import torch

    from exporter._build import BuildSpec, build_bundle
    from exporter._datasets import load_images
    from exporter._semantic import SemanticOptions
    from exporter._train import accuracy, train_classifier
    from exporter.zoo import fmnist_camera

    weights, bundle = root / "fmnist-camera.pt", root / "bundle"
    if not weights.is_file():
        print(f"training fmnist_camera on Fashion-MNIST ({epochs} epochs) ...", flush=True)
        model = train_classifier(fmnist_camera(), load_images("fashion-mnist:train", (3, 28, 28)).subset(images),
                                 epochs=epochs)
        torch.save(model.state_dict(), weights)
        print(f"top-1 {accuracy(model, load_images('fashion-mnist:test', (3, 28, 28))):.4f}", flush=True)
    if not (bundle / "manifest.json").is_file():
        build_bundle(BuildSpec("exporter.zoo:fmnist_camera", weights=weights, splits=[CUT], semantic=SemanticOptions(FRAGMENTS, "fashion-mnist:train", "fashion-mnist:test", cut=CUT)), bundle)
    return bundle


def write_frames(folder: Path, count: int) -> list[Path]:
    """The first ``count`` Fashion-MNIST test images as PNG files named ``<index>_<label>.png``."""
    import cv2

    from exporter._datasets import load_images

    folder.mkdir(parents=True, exist_ok=True)
    test = load_images("fashion-mnist:test", (1, 28, 28))
    paths = []
    for i in range(count):
        path = folder / f"{i:05d}_{int(test.y[i])}.png"
        if not path.is_file():
            cv2.imwrite(str(path), (test.x[i, 0] * 255).round().astype(np.uint8))
        paths.append(path)
    return paths


def deadlines(count: int, tight: tuple[float, float], loose: tuple[float, float], seed: int) -> list[tuple[str, float]]:
    """Per frame: ("tight" or "loose", a deadline drawn uniformly from that class's range), half each."""
    rng = np.random.default_rng(seed)
    kinds = rng.permutation(["tight"] * (count // 2) + ["loose"] * (count - count // 2))
    return [(str(k), float(rng.uniform(*(tight if k == "tight" else loose)))) for k in kinds]


class Workload(FrameSource):
    """The frames at ``fps``, each with its deadline, paced like a camera (a frame read late does not
    make the next come early)."""

    description = "Fashion-MNIST test images with deadlines"

    def __init__(self, paths: list[Path], plan: list[tuple[str, float]], fps: float) -> None:
        import cv2

        self.images = [cv2.cvtColor(cv2.imread(str(p)), cv2.COLOR_BGR2RGB) for p in paths]
        self.names, self.plan, self.period = [p.name for p in paths], plan, 1.0 / fps

    def __iter__(self) -> Iterator[Frame]:
        due = time.monotonic()
        for i, (image, name, (_, deadline)) in enumerate(zip(self.images, self.names, self.plan)):
            time.sleep(max(due - time.monotonic(), 0.0))
            due = max(due + self.period, time.monotonic())
            yield Frame(i, name, image, time.monotonic(), deadline)


class RandomPolicy(StaticPolicy):
    """A fair coin per batch between the layer split and the semantic split (the paper's Random)."""

    def __init__(self, bundle: Bundle, seed: int) -> None:
        super().__init__(CUT, bundle)
        self.rng = random.Random(seed)

    def choose(self, batch: int, rate_bps: float | None, available: Collection[str], link_busy: bool = False,
               deadline_ms: float | None = None, uncapped_bps: float | None = None) -> Choice:
        split = SEMANTIC_SPLIT if self.rng.random() < 0.5 else CUT
        return Choice(split, Reason(FIXED)) if split in available else super().choose(batch, rate_bps, available)


class LearnThenRun(BanditPolicy):
    """The bandit as a board uses it: a run with ``--learn`` first (ε-greedy), then runs without
    (UCB on what was learned): here one run, switching after ``learn_frames`` answers."""

    def __init__(self, bundle: Bundle, bandit: Bandit, learn_frames: int) -> None:
        super().__init__(StaticPolicy(CUT, bundle), bundle, SEMANTIC_SPLIT, bandit)
        self.left = learn_frames

    def observe_result(self, result: FrameResult) -> None:
        super().observe_result(result)
        self.left -= 1
        if self.left == 0:
            self.bandit.mode = "run"


def policy(name: str, bundle: Bundle, seed: int, learn_frames: int) -> SplitPolicy:
    layer = StaticPolicy(CUT, bundle)
    return {
        "layer": lambda: layer,
        "semantic": lambda: StaticPolicy(SEMANTIC_SPLIT, bundle),
        "random": lambda: RandomPolicy(bundle, seed),
        "splitplace": lambda: BanditPolicy(layer, bundle, SEMANTIC_SPLIT, Bandit(random.Random(seed), mode="learn")),
        "ours": lambda: LearnThenRun(bundle, Bandit(random.Random(seed), mode="learn"), learn_frames),
    }[name]()


# --------------------------------------------------------------------------- the fleet


@contextlib.asynccontextmanager
async def fleet(bundle: Path, hosts: tuple[Host, ...]) -> AsyncIterator[dict[str, str]]:
    """Each host in its own shaped namespace behind a delay relay on loopback; host name -> the
    address the board dials. All removed on the way out."""
    async with contextlib.AsyncExitStack() as stack:
        addresses = {}
        for host in hosts:
            link = await stack.enter_async_context(EmulatedLink(host.rate_mbit))
            relay = await stack.enter_async_context(DelayRelay((link.namespace_address, PORT), host.one_way_ms))
            serve = ["serve", str(bundle), "--port", str(PORT), "--no-zeroconf", *HOST_ARGS]
            process = link.popen(tier_command(host.overhead, "host_runtime.cli", serve), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
            stack.enter_context(running_host(process, link.namespace_address, PORT))
            addresses[host.name] = "{}:{}".format(*relay.address)
        yield addresses


def fragment_hosts(bundle: Bundle, hosts: tuple[Host, ...], addresses: dict[str, str]) -> tuple[str, ...]:
    """The semantic split's fragments on the hosts other than the layer split's, by their loads."""
    split = bundle.manifest.split(SEMANTIC_SPLIT)
    names = [split.stage_id(f.index) for f in split.fragments]
    views = [HostView(addresses[h.name], {n: {1: 0.0} for n in names}, h.overhead, rate_bps=h.rate_mbit * 1e6,
                      rtt_ms=2 * h.one_way_ms) for h in hosts[1:]]
    placement = place_fragments(SEMANTIC_SPLIT, names, split.tensor.bytes_per_sample, {1: 0.0}, views, batch=1)
    assert placement is not None, "no placement of the fragments"
    return placement.hosts


async def run_policy(name: str, runner: DeviceRunner, workload: Workload, layer_host: str, placed: tuple[str, ...],
                     seed: int, learn_frames: int) -> list[FrameResult]:
    hosts = HostLink(runner.bundle, layer_host, timeout=10.0)
    if not await hosts.connect():
        raise RuntimeError(f"the layer split's host {layer_host}: {hosts.last_error}")
    config = PipelineConfig(drop="none", request_timeout_s=5.0, deadline_ms=None, fragments={SEMANTIC_SPLIT: placed})
    chosen = policy(name, runner.bundle, seed, learn_frames)
    try:
        return [r async for r in Pipeline(runner, chosen, hosts, config).run(workload)]
    finally:
        await hosts.close()


# --------------------------------------------------------------------------- figures


def summarise(results: list[FrameResult], plan: list[tuple[str, float]], bundle: Bundle) -> dict:
    """Per deadline class, overall and over the second half of the frames (the bandits have learned by
    then): response, violations, accuracy, reward, the semantic share."""
    split = bundle.manifest.split(SEMANTIC_SPLIT)
    arm_accuracy = {CUT: split.accuracies["layer"], SEMANTIC_SPLIT: split.accuracies["semantic"]}
    labels = bundle.manifest.model.labels
    rows: dict[str, list[dict]] = {"all": [], "tight": [], "loose": [], "second half": []}
    for r in results:
        chosen = r.attempted or r.split
        accuracy = arm_accuracy.get(chosen, split.accuracies["full"])
        row = {"ms": r.total_ms, "late": r.late, "right": r.label == labels[int(r.name.split("_")[1][:-4])],
               "reward": reward(r.deadline_ms, r.total_ms, accuracy), "semantic": chosen == SEMANTIC_SPLIT,
               "fallback": r.error is not None, "missing": bool(r.missing)}
        rows["all"].append(row)
        rows[plan[r.index][0]].append(row)
        if r.index >= len(plan) // 2:  # once the bandits have had half the frames to learn on
            rows["second half"].append(row)
    return {kind: {
        "frames": len(rs), "mean_ms": float(np.mean([x["ms"] for x in rs])),
        "p95_ms": float(np.percentile([x["ms"] for x in rs], 95)),
        "violations": float(np.mean([x["late"] for x in rs])), "accuracy": float(np.mean([x["right"] for x in rs])),
        "reward": float(np.mean([x["reward"] for x in rs])), "semantic_share": float(np.mean([x["semantic"] for x in rs])),
        "fallbacks": int(sum(x["fallback"] for x in rs)), "partial": int(sum(x["missing"] for x in rs)),
    } for kind, rs in rows.items() if rs}


def print_table(report: dict) -> None:
    print(f"\n{'policy':11s} {'mean ms':>8s} {'p95 ms':>7s} {'violations':>10s} {'accuracy':>8s} {'reward':>7s} "
          f"{'semantic':>8s} | tight: {'viol':>5s} {'reward':>6s} {'sem':>5s} | loose: {'viol':>5s} {'reward':>6s} {'sem':>5s}"
          f" | 2nd half: {'viol':>5s} {'reward':>6s}")
    for name, s in report["results"].items():
        a, t, lo, h = s["all"], s["tight"], s["loose"], s["second half"]
        print(f"{name:11s} {a['mean_ms']:8.1f} {a['p95_ms']:7.1f} {a['violations']:10.3f} {a['accuracy']:8.4f} "
              f"{a['reward']:7.3f} {a['semantic_share']:8.2f} | {t['violations']:12.3f} {t['reward']:6.3f} "
              f"{t['semantic_share']:5.2f} | {lo['violations']:12.3f} {lo['reward']:6.3f} {lo['semantic_share']:5.2f}"
              f" | {h['violations']:15.3f} {h['reward']:6.3f}")
    v = report["verdict"]
    print(f"best bandit ({v['bandit']}): reward {v['reward']:.3f} against layer {v['layer_reward']:.3f} and semantic "
          f"{v['semantic_reward']:.3f} ({'beats both' if v['beats_both'] else 'does NOT beat both'}); violations "
          f"{v['violations']:.3f} against layer-only's {v['layer_violations']:.3f} ({v['violation_cut']:+.0%}; target "
          f"at least -33%: {'met' if v['cut_met'] else 'NOT met'})")


def verdict(results: dict) -> dict:
    bandit = max(("splitplace", "ours"), key=lambda n: results[n]["all"]["reward"])
    b, layer, semantic = results[bandit]["all"], results["layer"]["all"], results["semantic"]["all"]
    cut = (b["violations"] - layer["violations"]) / layer["violations"] if layer["violations"] else 0.0
    return {"bandit": bandit, "reward": b["reward"], "layer_reward": layer["reward"],
            "semantic_reward": semantic["reward"], "beats_both": b["reward"] > max(layer["reward"], semantic["reward"]),
            "violations": b["violations"], "layer_violations": layer["violations"], "violation_cut": cut,
            "cut_met": cut <= -1 / 3}


def plot(report: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["results"])
    x = np.arange(len(names))
    fig, axes = plt.subplots(1, 4, figsize=(16, 4))
    for ax, (key, title) in zip(axes, (("mean_ms", "mean response (ms)"), ("violations", "deadline violations"),
                                       ("accuracy", "top-1 accuracy"), ("reward", "mean reward"))):
        for offset, kind, color in ((-0.27, "tight", "indianred"), (0, "all", "steelblue"), (0.27, "loose", "seagreen")):
            ax.bar(x + offset, [report["results"][n][kind][key] for n in names], 0.27, color=color, label=kind)
        ax.set_xticks(x, names, rotation=30, ha="right")
        ax.set_title(title)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- main


async def trial(args: argparse.Namespace, bundle_dir: Path, report: dict, paths: list[Path], plan) -> None:
    bundle = Bundle.load(bundle_dir)
    runner = DeviceRunner(bundle, threads=1)
    for split in (CUT, SEMANTIC_SPLIT, "local"):
        runner.warm_up(split)
    async with fleet(bundle_dir, FLEET) as addresses:
        placed = fragment_hosts(bundle, FLEET, addresses)
        report["placement"] = {"layer": addresses[FLEET[0].name], "fragments": list(placed)}
        print(f"layer split on {addresses[FLEET[0].name]}; fragments on {', '.join(placed)}", flush=True)
        for name in args.policies:
            workload = Workload(paths, plan, args.fps)
            results = await run_policy(name, runner, workload, addresses[FLEET[0].name], placed, args.seed,
                                       args.learn_frames)
            report["results"][name] = summary = summarise(results, plan, bundle)
            a = summary["all"]
            print(f"  {name:11s} mean {a['mean_ms']:6.1f} ms, violations {a['violations']:.3f}, accuracy "
                  f"{a['accuracy']:.4f}, reward {a['reward']:.3f}, semantic {a['semantic_share']:.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=600, help="frames per policy (default 600)")
    parser.add_argument("--fps", type=float, default=8.0, help="their rate (default 8: spaced)")
    parser.add_argument("--tight", type=float, nargs=2, default=(25.0, 40.0), metavar=("LOW", "HIGH"),
                        help="the tight deadlines' range, ms (default 25 40)")
    parser.add_argument("--loose", type=float, nargs=2, default=(80.0, 160.0), metavar=("LOW", "HIGH"),
                        help="the loose deadlines' range, ms (default 80 160)")
    parser.add_argument("--policies", type=lambda s: s.split(","), default=list(POLICIES),
                        help=f"which to run (default {','.join(POLICIES)})")
    parser.add_argument("--board-overhead", type=float, default=20.0, help="the board's slowdown (default 20)")
    parser.add_argument("--epochs", type=int, default=4, help="training epochs of the model (default 4)")
    parser.add_argument("--images", type=int, default=None, help="training images (default: all 60,000)")
    parser.add_argument("--learn-frames", type=int, default=150,
                        help="ours: frames learnt ε-greedily before UCB takes over (default 150)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--build", type=Path, default=Path("build/bench/splitplace"), help="model and bundle (cached)")
    parser.add_argument("--out", type=Path, default=Path("build/bench/splitplace.json"))
    args = parser.parse_args()
    unknown = set(args.policies) - set(POLICIES)
    if unknown or args.frames < 2 or args.fps <= 0:
        parser.error(f"policies are {', '.join(POLICIES)}; frames at least 2, fps positive")
    reason = unavailable_reason()
    if reason is not None:
        raise SystemExit(f"cannot emulate the fleet's links here: {reason}")
    args.build.mkdir(parents=True, exist_ok=True)
    bundle_dir = build(args.build.resolve(), args.epochs, args.images).resolve()
    paths = write_frames(args.build / "frames", args.frames)
    plan = deadlines(args.frames, tuple(args.tight), tuple(args.loose), args.seed)
    slow_down(args.board_overhead)  # the board's inferences, in this process; the hosts are slowed in theirs
    manifest = Bundle.load(bundle_dir).manifest
    report = {"benchmark": "splitplace", "machine": platform.machine(), "cpus": os.cpu_count(),
              "python": platform.python_version(), "started": time.strftime("%F %T"), "load_average": os.getloadavg(),
              "bundle": manifest.bundle_id, "accuracies": manifest.split(SEMANTIC_SPLIT).accuracies,
              "groups": [list(f.classes) for f in manifest.split(SEMANTIC_SPLIT).fragments],
              "fleet": [vars(h) for h in FLEET], "board_overhead": args.board_overhead, "frames": args.frames,
              "fps": args.fps, "tight_ms": args.tight, "loose_ms": args.loose, "seed": args.seed,
              "learn_frames": args.learn_frames, "results": {}}
    try:
        asyncio.run(cancelled_by_sigterm(trial(args, bundle_dir, report, paths, plan)))
    except (KeyboardInterrupt, asyncio.CancelledError):
        raise SystemExit("stopped: the namespaces, links, relays and processes it made are removed") from None
    report["verdict"] = verdict(report["results"]) if set(POLICIES) <= set(report["results"]) else None
    report["load_average_end"] = os.getloadavg()
    if report["verdict"] is not None:
        print_table(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    plot(report, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        main()
