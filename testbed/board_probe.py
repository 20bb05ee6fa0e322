"""The board's answers, logits and all: every split of a bundle (and ``local``) on a folder of photos.

``split-device run`` prints and traces each frame's label and probability, not its logits; to
hold the board in a box to the x86 answers logit by logit, this runs the same pieces as the
stream (the runner's preprocessing, head or full model, the link payload, the host's tail over
TCP) once per photo, split, format and precision, in one process (under emulation a process
start alone costs seconds), and prints one JSON object. Run it in the box and natively with the
same bundle, photos and host, and compare (``tests/testbed/test_board_box.py``). Under qemu
its timings mean nothing, so it reports none.

    python -m testbed.board_probe BUNDLE PHOTOS --host 127.0.0.1:PORT --variants onnx/float32,tflite/int8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
from collections.abc import Sequence
from pathlib import Path

from device_runtime import FULL, HEAD, LOCAL, Bundle
from device_runtime.engine import DeviceRunner
from device_runtime.link import HostClient
from device_runtime.hosts import host_address
from device_runtime.stream import open_source, top1
from splitedge import SplitEdgeError

__all__ = ["probe"]


async def probe(
    bundle_dir: str | Path, photos: str | Path, host: str | None, variants: Sequence[tuple[str, str]],
    splits: Sequence[str] | None = None,
) -> dict[str, object]:
    """``{"machine", "frames": [{format, precision, split, name, label, logits}]}`` for every variant
    (format, precision), every split (default: the bundle's and ``local``; remote ones need ``host``)
    and every photo."""
    bundle = Bundle.load(bundle_dir, roles=(HEAD, FULL))
    chosen = list(splits) if splits is not None else [*(s.id for s in bundle.manifest.splits), LOCAL]
    with open_source(str(photos)) as source:
        images = [(frame.name, frame.image) for frame in source]
    client = None
    if any(s != LOCAL for s in chosen):
        if host is None:
            raise SplitEdgeError("remote splits need --host IP:PORT")
        client = await HostClient.connect(*host_address(host), timeout=30.0)
    frames = []
    try:
        for fmt, precision in variants:
            runner = DeviceRunner(bundle, backend=fmt, precision=precision)
            for split in chosen:
                for name, image in images:
                    x = runner.preprocess(image)
                    if split == LOCAL:
                        logits, _ = runner.run_full(x)
                    else:
                        cut, _ = runner.run_head(split, x)
                        payload, fields = runner.payload(split, cut)
                        logits = (await client.infer(bundle.id, split, payload, timeout=120.0, **fields)).output
                    label, _ = top1(logits[0], runner.labels)
                    frames.append({"format": fmt, "precision": precision, "split": split, "name": name,
                                   "label": label, "logits": [float(v) for v in logits[0]]})
    finally:
        if client is not None:
            await client.close()
    return {"machine": platform.machine(), "python": platform.python_version(), "frames": frames}


def _variants(text: str) -> list[tuple[str, str]]:
    pairs = []
    for item in filter(None, text.split(",")):
        fmt, sep, precision = item.partition("/")
        if not sep:
            raise argparse.ArgumentTypeError(f"{item!r}: expected FORMAT/PRECISION, like onnx/int8")
        pairs.append((fmt, precision))
    return pairs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.board_probe", description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle")
    parser.add_argument("photos")
    parser.add_argument("--host", help="IP:PORT of split-host serving the bundle (needed for remote splits)")
    parser.add_argument("--variants", type=_variants, default=[("onnx", "float32")],
                        help="FORMAT/PRECISION,... (default onnx/float32)")
    parser.add_argument("--splits", help="split ids and/or local, comma-separated (default: all and local)")
    args = parser.parse_args(argv)
    splits = args.splits.split(",") if args.splits else None
    try:
        result = asyncio.run(probe(args.bundle, args.photos, args.host, args.variants, splits))
    except SplitEdgeError as exc:
        print(f"board_probe: error: {exc}", file=sys.stderr)
        return 2
    json.dump(result, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
