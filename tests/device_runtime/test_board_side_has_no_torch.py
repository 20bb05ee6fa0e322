"""The board installs without torch: importing and running device_runtime must never load it."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "torchvision", "onnx", "onnxscript")

SCRIPT = """
import asyncio, json, sys
import numpy as np
import device_runtime, device_runtime.cli, host_runtime.cli
from device_runtime.bundle import Bundle
from device_runtime.stream._camera import open_source
from device_runtime.engine._runner import DeviceRunner
from device_runtime.stream._pipeline import Pipeline
from device_runtime.stream._policy import StaticPolicy
bundle = Bundle.load(sys.argv[1], roles=("head", "full"))
runner = DeviceRunner(bundle, threads=1)
async def go():
    with open_source(sys.argv[2]) as source:
        return [r async for r in Pipeline(runner, StaticPolicy("local", bundle)).run(source, frames=2)]
results = asyncio.run(go())
split = bundle.manifest.splits[0].id
runner.session(split, "head").run(np.zeros((1, *bundle.manifest.model.input_shape), np.float32))
print(json.dumps({"labels": [r.label for r in results], "loaded": sorted(m for m in sys.modules if m.split(".")[0] in %r)}))
""" % (HEAVY,)


def test_running_device_runtime_never_imports_torch(mobilenet_bundle: Path, photos_dir: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(mobilenet_bundle), str(photos_dir)],
        capture_output=True, text=True, timeout=120, check=True,
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["loaded"] == []
    assert len(report["labels"]) == 2


@pytest.mark.skipif(os.environ.get("SPLITEDGE_DEVICE_ENV") != "1", reason="only in the device-only environment")
def test_device_environment_has_no_heavy_packages() -> None:
    """`pip install .[device]` must not have pulled torch, torchvision or onnx in."""
    assert [name for name in HEAVY if importlib.util.find_spec(name) is not None] == []
