"""``split-device calibrate``/``plan``/``run --split auto``: measured on this machine, against a real host."""

from __future__ import annotations

import asyncio
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from calibration import FILENAME, load
from device_runtime.board.calibrate import calibration_for, manifest_sha256, profile_host
from device_runtime.bundle import LOCAL, OFFLOAD, Bundle, write_manifest
from device_runtime.cli import main
from device_runtime.wire.ops import HelloReply
from splitedge.errors import BundleError, RemoteError
from tests.conftest import TEST_SPLITS, RunningHost


@pytest.fixture(scope="module")
def calibrated(mobilenet_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the test bundle, calibrated against a real host on 127.0.0.1."""
    from tests.conftest import start_host

    root = tmp_path_factory.mktemp("calibrated") / "bundle"
    shutil.copytree(mobilenet_bundle, root)
    for host in start_host([root]):
        assert main(["calibrate", str(root), "--host", f"{host.host}:{host.port}", "--batch", "1,2",
                     "--repeats", "3", "--threads", "1"]) == 0
        profiles = host.server.stats.as_dict()["requests"]["profile"]
    # One bounded profile request per tail (the host refuses one request past its budget).
    assert profiles == len(TEST_SPLITS) + 1  # every cut, and the full model for offload
    return root


class BusyHost:
    """A host client's stand-in whose host is timing another board's tails for a while: its
    ``profile`` answers ``overloaded`` ``busy`` times, then the real figures."""

    def __init__(self, busy: int) -> None:
        self.busy = busy
        self.hello = HelloReply(1, 1, {"b": ["s1", "s2"]}, False, 1 << 20, "cpu")
        self.asked: list[list[str]] = []

    async def profile(self, bundle_id, batches, repeats, splits):
        self.asked.append(list(splits))
        if self.busy:
            self.busy -= 1
            raise RemoteError("overloaded", "another profile is running; try again shortly")
        return {splits[0]: {b: 1.0 for b in batches}}


@pytest.mark.parametrize("busy, waits", [(0, 0), (2, 2)])
def test_a_busy_host_is_asked_again_tail_by_tail(busy: int, waits: int) -> None:
    client, slept = BusyHost(busy), []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    tails = asyncio.run(profile_host(client, "b", (1, 2), 5, lambda line: None, busy_wait_s=60, sleep=sleep))
    assert tails == {"s1": {1: 1.0, 2: 1.0}, "s2": {1: 1.0, 2: 1.0}}
    assert client.asked == [["s1"]] * (busy + 1) + [["s2"]] and len(slept) == waits


def test_a_host_busy_for_too_long_is_an_error() -> None:
    async def sleep(seconds: float) -> None:
        pass

    with pytest.raises(RemoteError, match="overloaded"):
        asyncio.run(profile_host(BusyHost(100), "b", (1,), 5, lambda line: None, busy_wait_s=20, sleep=sleep))


def test_calibration_has_every_option_at_every_batch(calibrated: Path, capsys) -> None:
    bundle = Bundle.load(calibrated, roles=())
    calibration = calibration_for(bundle)
    assert calibration.bundle_id == bundle.id and calibration.manifest_sha256 == manifest_sha256(bundle)
    assert set(calibration.model.names) == {LOCAL, OFFLOAD, *TEST_SPLITS}
    assert calibration.batches == (1, 2) and calibration.link is not None
    for split in calibration.model.splits:
        if split.split != OFFLOAD:
            assert set(split.head_ms) == {1, 2} and all(ms > 0 for ms in split.head_ms.values())
        if split.split != LOCAL:
            assert set(split.tail_ms) == {1, 2} and all(ms > 0 for ms in split.tail_ms.values())
    # The table is Eq. 6 of the measured model, and spans 0.1 Mbit/s to 1 Gbit/s.
    table = calibration.table
    assert table.rates_bps[0] == pytest.approx(1e5) and table.rates_bps[-1] == pytest.approx(1e9)
    for batch in table.batches:
        for rate in table.rates_bps[::10]:
            assert table.lookup(batch, rate) == calibration.model.best(batch, rate, table.splits)
    # 0.1 Mbit/s: nothing is worth sending (the smallest cut alone would take 2.5 s). Which
    # option wins at 1 Gbit/s depends on this machine's timings: board and host are the same CPU.
    assert table.lookup(1, 1e5) == LOCAL


def test_calibrate_paces_the_board_as_its_camera_will(mobilenet_bundle: Path, tmp_path: Path, capsys) -> None:
    root = tmp_path / "bundle"
    shutil.copytree(mobilenet_bundle, root)
    assert main(["calibrate", str(root), "--no-host", "--batch", "1", "--repeats", "2", "--fps", "8",
                 "--threads", "1"]) == 0
    assert "2 repeats at 8 runs/s" in capsys.readouterr().out
    assert load(root).fps == 8.0
    with pytest.raises(SystemExit):
        main(["calibrate", str(root), "--no-host", "--fps", "-1"])
    assert "frame rate '-1': expected frames per second >= 0" in capsys.readouterr().err


def test_plan_prints_and_plots_the_table(calibrated: Path, tmp_path: Path, capsys) -> None:
    assert main(["plan", str(calibrated), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "B=1" in out and "B=2" in out and "local" in out and "0.1 Mbit/s" in out
    assert (tmp_path / "plan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "plan.json").read_text())["batches"] == [1, 2]


def test_calibration_of_another_bundle_is_refused(calibrated: Path, tmp_path: Path, capsys) -> None:
    other = tmp_path / "other"
    shutil.copytree(calibrated, other)
    manifest = Bundle.load(other, roles=()).manifest  # a different bundle, same files:
    write_manifest(other, replace(manifest, model=replace(manifest.model, labels=manifest.model.labels[::-1])))
    with pytest.raises(BundleError, match=r"was calibrated for bundle .* not for"):
        calibration_for(Bundle.load(other, roles=()))
    assert main(["plan", str(other)]) == 2
    assert "run split-device calibrate again" in capsys.readouterr().err


def test_auto_without_calibration_says_so_and_runs_the_smallest_cut(mobilenet_bundle: Path, tmp_path: Path, host: RunningHost, capsys) -> None:
    bare = tmp_path / "bare"
    shutil.copytree(mobilenet_bundle, bare)
    (bare / FILENAME).unlink(missing_ok=True)
    assert main(["run", str(bare), "--camera", "synthetic", "--frames", "2", "--host", f"{host.host}:{host.port}"]) == 0
    captured = capsys.readouterr()
    assert "no calibration for this bundle" in captured.err and "run split-device calibrate" in captured.err
    assert captured.out.count("split=features_14_conv_2") == 2


def test_auto_runs_from_the_table_and_traces(calibrated: Path, tmp_path: Path, capsys) -> None:
    from tests.conftest import start_host

    trace = tmp_path / "run.jsonl"
    for host in start_host([calibrated]):
        assert main(["run", str(calibrated), "--camera", "synthetic", "--frames", "20", "--drop", "none",
                     "--host", f"{host.host}:{host.port}", "--trace", str(trace), "--threads", "1"]) == 0
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    assert lines[0]["type"] == "run" and lines[0]["policy"] == "auto" and lines[0]["calibration"]
    frames = lines[1:]
    assert [f["index"] for f in frames] == list(range(20))
    calibration = load(calibrated / FILENAME)
    # Each split taken is one the table can choose; with a rate estimate, remote frames record it.
    assert {f["split"] for f in frames} <= set(calibration.table.splits)
    assert all(f["rate_bps"] for f in frames if f["where"] == "remote")
    assert "20 frames: 0 dropped" in capsys.readouterr().out
