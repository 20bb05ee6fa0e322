"""What typing the ops costs: instructions per ``infer`` round trip, typed ops against plain maps.

Both ends of one round trip in one process, no sockets: the device builds the request, the
host's framing cuts it, the codec decodes it and the host parses it; the host builds the reply,
the device's framing cuts it, decodes and parses it. Two ways, in the same run:

- ``typed``: what the runtimes do (``wire.ops``: ``InferRequest``/``InferReply``, their
  ``parts()`` and ``parse_request``/``parse_reply``), the host's framing with its frame budget;
- ``maps``: the same frames built as plain dicts and read with ``dict.get`` and the checks the
  host made before the ops were typed (the baseline).

Instructions, not seconds: each way runs under ``valgrind --tool=callgrind`` at N and 2N round
trips with ``PYTHONHASHSEED=0``, and the difference over N is one round trip without start-up
(repeatable on a busy machine, unlike wall time on this VM). Needs valgrind (Debian's package).

    python bench/codec_instructions.py --rounds 800 --out build/bench/codec_instructions.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

SHAPES = ("1x160x7x7", "1x32x56x56")  # features_14_conv_2's cut (31 KB); features_4_conv_2's (401 KB)


def round_trips(way: str, n: int, shape: tuple[int, ...]) -> None:
    """The measured work (run in the child under callgrind)."""
    import numpy as np

    from device_runtime.wire import FrameBudget, FrameDecoder
    from device_runtime.wire.ops import InferReply, InferRequest, parse_reply, parse_request
    from device_runtime.wire import decode, encode

    x = np.zeros(shape, np.float32)
    host, device = FrameDecoder(budget=FrameBudget(1 << 28)), FrameDecoder()
    for i in range(n):
        if way == "typed":
            message, tensor, fields = InferRequest(i, "bundle-1", "features_14_conv_2", x, 50.0).parts()
        else:
            message, tensor, fields = {"op": "infer", "bundle": "bundle-1", "split": "features_14_conv_2",
                                       "deadline_ms": 50.0, "id": i}, x, {}
        for buf in encode(message, tensor, **fields):
            for body in host.feed(buf):
                got = decode(body)
                if way == "typed":
                    request = parse_request(got)
                    reply = InferReply(request.id, request.tensor, 1.0, 1.0, 1).parts()
                else:
                    assert got.get("op") == "infer" and isinstance(got.get("tensor"), np.ndarray)
                    _ = (got["bundle"], got["split"], got.get("quantization"), float(got.get("deadline_ms")))
                    reply = ({"id": got.get("id"), "ok": True, "compute_ms": 1.0, "queue_ms": 1.0, "batch": 1},
                             got["tensor"], {})
                for rbuf in encode(reply[0], reply[1], **reply[2]):
                    for rbody in device.feed(rbuf):
                        answer = decode(rbody)
                        if way == "typed":
                            parse_reply("infer", answer)
                        else:
                            assert isinstance(answer.get("tensor"), np.ndarray)
                            _ = (float(answer.get("compute_ms", 0.0)), float(answer.get("queue_ms", 0.0)))


def instructions(way: str, n: int, shape: str) -> int:
    """Instructions of a child doing ``n`` round trips, start-up included."""
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__,
         "--child", way, str(n), shape],
        capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"}, timeout=600, check=True,
    )
    match = re.search(r"Collected : (\d+)", out.stderr)
    assert match, f"no callgrind total in: {out.stderr[-400:]}"
    return int(match.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=800, help="N: round trips of the shorter run (default 800)")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        way, n, shape = args.child
        round_trips(way, int(n), tuple(int(d) for d in shape.split("x")))
        return
    if shutil.which("valgrind") is None:
        sys.exit("codec_instructions: valgrind is not installed (apt-get install valgrind)")
    rows = []
    print(f"{'cut':12s} {'maps':>10s} {'typed':>10s} {'ratio':>6s}   instructions per infer round trip")
    for shape in SHAPES:
        per = {way: (instructions(way, 2 * args.rounds, shape) - instructions(way, args.rounds, shape)) / args.rounds
               for way in ("maps", "typed")}
        rows.append({"shape": shape, **per, "ratio": per["typed"] / per["maps"]})
        print(f"{shape:12s} {per['maps']:10.0f} {per['typed']:10.0f} {per['typed'] / per['maps']:6.3f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"benchmark": "codec_instructions", "rounds": args.rounds, "rows": rows}, indent=2))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
