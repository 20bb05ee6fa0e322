"""A long synthetic trace for measuring ``split-device report`` (issue 45: 10 M records in bounded
memory): ``python -m tests.fieldtrial.make_big_trace OUT.jsonl N``.

N frame records of a 30 fps run over five splits, a fallback and a deadline refusal now and then,
a drop in twenty, a rate estimate that steps, waits and deadlines, and a ``link_rate`` record every
10,000 frames: every field the report reads, as the trace writer writes it. The records are written
a line at a time (a 10 M trace is about 5 GB), from a fixed seed, so a figure can be measured again.
``… OUT N hostile``: the same at their worst for memory (:func:`hostile`).
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any, Iterator

from device_runtime.bundle import LOCAL, OFFLOAD
from device_runtime.stream.trace import TRACE_SCHEMA

SPLITS = (OFFLOAD, "features_4", "features_8", "features_12", LOCAL)
KINDS = ("table", "hold", "refined", "no_rate")


def records(n: int, seed: int = 45) -> Iterator[dict[str, Any]]:
    """The run record, then ``n`` frames (and a link_rate record every 10,000)."""
    rng = random.Random(seed)
    yield {"type": "run", "schema": TRACE_SCHEMA, "started_unix": 1.7e9, "bundle_id": "big-0123456789ab",
           "policy": "auto", "batch": 1, "calibration": None, "source": "synthetic"}
    split = SPLITS[1]
    for i in range(n):
        t = i / 30.0
        if i % 10_000 == 0:
            yield {"type": "link_rate", "t": t, "rate_bps": (2e6, 8e6, 20e6)[(i // 10_000) % 3], "set_by": "netem"}
        if rng.random() < 0.05:
            yield {"type": "frame", "t": t, "index": i, "name": f"f{i}.png", "dropped": True,
                   "drop_reason": "queue_full"}
            continue
        if rng.random() < 0.01:
            split = rng.choice(SPLITS)
        reason: dict[str, Any] = {"kind": rng.choice(KINDS)}
        error = None
        if rng.random() < 0.002:
            frame_split, reason, error = LOCAL, {"kind": "fallback"}, "cut: host went away"
        elif rng.random() < 0.002:
            frame_split, reason = LOCAL, {"kind": "deadline"}
        else:
            frame_split = split
        head, tail = rng.uniform(2, 40), rng.uniform(1, 10)
        transfer = 0.0 if frame_split == LOCAL else rng.uniform(1, 30)
        waits = {"queue_ms": rng.expovariate(0.5), "slot_ms": rng.expovariate(1.0),
                 "host_queue_ms": rng.expovariate(2.0)}
        total = 2.0 + head + transfer + tail + sum(waits.values())
        yield {"type": "frame", "t": t, "index": i, "name": f"f{i}.png", "label": "espresso", "probability": 0.9,
               "split": frame_split, "batch": 1, "bytes": 0 if frame_split == LOCAL else 150_528,
               "rate_bps": rng.choice((2e6, 8e6, 20e6)), "preprocess_ms": 2.0, "head_ms": head,
               "transfer_ms": transfer, "tail_ms": tail, "total_ms": total, **waits, "deadline_ms": 100.0,
               "dropped": False, "where": "local" if frame_split == LOCAL else "host", "host": None, "error": error,
               "reason": reason}


def hostile(n: int, seed: int = 45) -> Iterator[dict[str, Any]]:
    """:func:`records` at their worst for a report's memory: every split name and split reason
    distinct and as long as a trace may have them (256 characters), a 256-character error and 2 KB
    of fields no report reads on every frame."""
    for record in records(n, seed):
        if record["type"] == "frame" and not record["dropped"]:
            i = record["index"]
            record.update(split=f"s{i:0255d}", reason={"kind": f"k{i:0255d}", "pad": "p" * 1024},
                          error="e" * 256, junk="j" * 1024)
        yield record


def write(path: Path, n: int, worst: bool = False) -> Path:
    with path.open("w", encoding="utf-8") as file:
        for record in (hostile if worst else records)(n):
            file.write(json.dumps(record) + "\n")
    return path


if __name__ == "__main__":  # OUT N [hostile]
    write(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:] == ["hostile"])
