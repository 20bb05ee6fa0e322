"""One tier of the seed-003 experiment: a splitedge command run as the paper's slower machine.

The DNN-slicing simulator (seed-003 paper, Section 3.3) makes its device and edge slower than
its cloud in software: after each inference an agent sleeps ``OverheadRatio x ProcessTime``
(x10 on the device, x5 on the edge, x1 in the cloud, Table 2). ``bench/chain_trial.py`` runs
every tier on this one machine, so it does the same: this runs ``python -m MODULE ARGS``
(``split-device`` or ``split-host``) with every onnxruntime inference (``OnnxBackend.run``: a
board's heads and full model, a host's tails and chain stages) followed by that sleep, in the
thread that ran it, so the times the runtimes measure and report include it as the paper's did.

With ``--replies FILE`` every infer reply the board receives is appended to FILE as one JSON
line: its round trip, the first host's queue and compute, the board's link time, and each later
hop's queue, compute and link, because a trace keeps only their sums.

    python bench/tier.py --overhead 10 --replies replies.jsonl -m device_runtime.cli run bundle/ ...
"""

from __future__ import annotations

import argparse
import json
import runpy
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from device_runtime.engine._backend import OnnxBackend
from device_runtime.link import HostClient, InferResult


def slow_down(ratio: float) -> None:
    """Every ``OnnxBackend.run`` in this process then sleeps ``ratio`` times what it took (seed 003's overhead)."""
    if ratio <= 0:
        return
    run = OnnxBackend.run

    def slowed(self: OnnxBackend, x: np.ndarray) -> np.ndarray:
        start = time.perf_counter()
        out = run(self, x)
        time.sleep(ratio * (time.perf_counter() - start))
        return out

    OnnxBackend.run = slowed  # type: ignore[method-assign]


def record_replies(path: Path) -> None:
    """Append each ``HostClient.infer`` reply's timings, one JSON line each, to ``path``."""
    infer = HostClient.infer
    out = path.open("a", encoding="utf-8")

    async def recorded(self: HostClient, bundle_id: str, split_id: str, *args: Any, **kwargs: Any) -> InferResult:
        result = await infer(self, bundle_id, split_id, *args, **kwargs)
        out.write(json.dumps({
            "split": split_id, "address": self.address, "round_trip_ms": result.round_trip_ms,
            "transfer_ms": result.transfer_ms, "queue_ms": result.queue_ms, "compute_ms": result.compute_ms,
            "hops": [hop.as_map() for hop in result.hops],
        }) + "\n")
        out.flush()
        return result

    HostClient.infer = recorded  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--overhead", type=float, default=0.0, help="sleep this many times each inference's time")
    parser.add_argument("--replies", type=Path, help="append every infer reply's timings here (JSON lines)")
    parser.add_argument("-m", dest="module", required=True, help="the module to run, as python -m runs it")
    args, rest = parser.parse_known_args()
    slow_down(args.overhead)
    if args.replies is not None:
        record_replies(args.replies)
    sys.argv = [args.module, *rest]
    runpy.run_module(args.module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
