"""Board and host together over real TCP: every split classifies the photos as the full model does."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from device_runtime.bundle import LOCAL, Bundle, write_manifest
from device_runtime._bundle_slice import slice_bundle
from device_runtime.engine import INT8_MARGIN, prefers_int8
from device_runtime.engine._runner import DeviceRunner, default_split
from device_runtime.hosts._connect import connect_host
from device_runtime.stream._camera import open_source
from splitedge.errors import BundleError, HostUnavailableError
from tests.conftest import TEST_SPLITS, RunningHost, run_stream, until
from tests.device_runtime.test_bundle_slice import fake_bundle


def classify(bundle: Bundle, photos: Path, split_id: str, host: RunningHost | None) -> list:
    return run_stream(DeviceRunner(bundle, threads=1), str(photos), split_id, host)


def test_every_split_gives_the_full_models_top1(mobilenet_bundle: Path, photos_dir: Path, host: RunningHost) -> None:
    bundle = Bundle.load(mobilenet_bundle)
    local = classify(bundle, photos_dir, LOCAL, None)
    labels = {r.name: r.label for r in local}
    assert labels["coffee.png"] == "espresso"
    assert labels["chelsea.png"] in {"Egyptian cat", "tabby", "tiger cat"}
    for split_id in TEST_SPLITS:
        remote = classify(bundle, photos_dir, split_id, host)
        assert {r.name: r.label for r in remote} == labels
        for r, l in zip(remote, local):
            assert r.probability == pytest.approx(l.probability, abs=1e-4)
            assert r.split == split_id and r.head_ms > 0 and r.tail_ms > 0 and r.transfer_ms >= 0
            assert r.total_ms >= r.head_ms + r.tail_ms and r.where == "remote" and r.error is None


def test_default_split_is_the_smallest_cut(mobilenet_bundle: Path) -> None:
    bundle = Bundle.load(mobilenet_bundle, roles=())
    assert default_split(bundle) == "features_14_conv_2"  # 160x7x7 is smaller than 32x28x28


def test_frames_limit_and_unknown_split(mobilenet_bundle: Path) -> None:
    bundle = Bundle.load(mobilenet_bundle, roles=("full",))
    runner = DeviceRunner(bundle, threads=1)
    results = run_stream(runner, "synthetic", LOCAL, frames=3, drop="none")
    assert [r.index for r in results] == [0, 1, 2]
    with pytest.raises(BundleError, match="unknown split 'features_99'"):
        run_stream(runner, "synthetic", "features_99", frames=3)


def test_missing_host_is_a_clear_error(mobilenet_bundle: Path) -> None:
    bundle = Bundle.load(mobilenet_bundle, roles=())
    with pytest.raises(HostUnavailableError, match="cannot connect to host 127.0.0.1:9"):
        asyncio.run(connect_host(bundle, "127.0.0.1:9", timeout=2))
    with pytest.raises(HostUnavailableError, match="expected IP:PORT or auto"):
        asyncio.run(connect_host(bundle, "somewhere"))
    with pytest.raises(HostUnavailableError, match="no splitedge host serving bundle .* found by zeroconf within 0.5 s"):
        asyncio.run(connect_host(bundle, "auto", interfaces=["127.0.0.1"], timeout=0.5))


def test_host_going_away_fails_the_request_at_once(mobilenet_bundle: Path) -> None:
    """A host killed with a request in flight: the device hears it now, not after a timeout."""
    from tests.conftest import start_host

    bundle = Bundle.load(mobilenet_bundle)
    hosts = start_host([mobilenet_bundle])
    host = next(hosts)
    runner = DeviceRunner(bundle, threads=1)

    async def go():
        client = await connect_host(bundle, f"{host.host}:{host.port}")
        with open_source("synthetic") as source:
            x = runner.preprocess(next(iter(source)).image)
        cut, _ = runner.run_head(TEST_SPLITS[1], x)
        await client.infer(bundle.id, TEST_SPLITS[1], cut)  # works
        for connection in list(host.server.connections):
            host.loop.call_soon_threadsafe(connection.transport.abort)
        # Awaited, not slept for: a busy machine may take longer than any fixed pause to deliver it.
        await until(lambda: not client.alive, what="the device hearing its connection closed")
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(HostUnavailableError, match="connection to host lost"):
            await client.infer(bundle.id, TEST_SPLITS[1], cut)
        return loop.time() - start

    assert asyncio.run(go()) < 1.0
    next(hosts, None)


def with_accuracies(root: Path, accuracy: dict[tuple[str, str, str], float | None], int8_tflite: tuple[str, ...] = ("a",)):
    """The slicing tests' made-up bundle, its (split, format, precision) heads and full model
    given ``accuracy`` (absent: not measured)."""
    manifest = fake_bundle(root, int8_tflite_heads=int8_tflite)

    def measured(split_id: str, artifacts):
        return tuple(replace(a, accuracy=accuracy.get((split_id, a.format, a.precision))) for a in artifacts)

    manifest = replace(manifest, full=measured(LOCAL, manifest.full),
                       splits=tuple(replace(s, artifacts=measured(s.id, s.artifacts)) for s in manifest.splits))
    write_manifest(root, manifest)
    return Bundle.load(root, roles=())


def test_auto_runs_int8_only_where_its_measured_top1_is_within_the_margin(tmp_path: Path) -> None:
    bundle = with_accuracies(tmp_path / "b", {
        ("a", "onnx", "float32"): 0.90, ("a", "onnx", "int8"): 0.90 - INT8_MARGIN,  # at the margin: int8
        ("b", "onnx", "float32"): 0.90, ("b", "onnx", "int8"): 0.90 - INT8_MARGIN - 0.001,  # past it: float32
        (LOCAL, "onnx", "float32"): 0.90,  # the full model's int8 never measured: float32
        ("a", "tflite", "float32"): 0.90, ("a", "tflite", "int8"): 0.95,
    })
    runner = DeviceRunner(bundle, threads=1)
    assert [runner.artifact_precision(s, r) for s, r in (("a", "head"), ("b", "head"), (LOCAL, "full"))] == [
        "int8", "float32", "float32"]
    assert DeviceRunner(bundle, threads=1, backend="tflite").artifact_precision("a", "head") == "int8"
    # "b" has no int8 TFLite head at all; an explicit precision is obeyed whatever was measured.
    assert not prefers_int8(bundle, "b", "head", "tflite")
    assert DeviceRunner(bundle, threads=1, precision="int8").artifact_precision("b", "head") == "int8"


def test_auto_runs_int8_where_a_slice_kept_only_int8(tmp_path: Path) -> None:
    with_accuracies(tmp_path / "b", {})  # nothing measured: the full bundle would run float32
    slice_bundle(tmp_path / "b", tmp_path / "board", "board", formats=["onnx"], precision="int8")
    runner = DeviceRunner(Bundle.load(tmp_path / "board", roles=()), threads=1)
    assert runner.artifact_precision("a", "head") == runner.artifact_precision(LOCAL, "full") == "int8"
    assert DeviceRunner(Bundle.load(tmp_path / "b", roles=()), threads=1).artifact_precision("a", "head") == "float32"
