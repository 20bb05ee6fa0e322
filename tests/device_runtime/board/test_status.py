"""split-device verify and status, and the last-run.json that run leaves, as a script on a board sees them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from device_runtime.board._release import Layout
from device_runtime.board._status import LAST_RUN, NO_SYSTEMD, _last_run, service_state
from device_runtime.bundle import BOARD_PART, MANIFEST_NAME
from device_runtime._bundle_slice import slice_bundle
from tests.device_runtime.test_bundle_slice import fake_bundle

ROOT = Path(__file__).resolve().parents[3]


def device(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "device_runtime.cli", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=180, env=env)


def test_verify_passes_a_whole_bundle(tmp_path: Path) -> None:
    manifest = fake_bundle(tmp_path / "b")
    out = device("verify", str(tmp_path / "b"))
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"bundle {manifest.bundle_id} at {tmp_path / 'b'}: 14 files match the manifest\n"


def test_verify_names_every_bad_file_once_and_exits_1(tmp_path: Path) -> None:
    fake_bundle(tmp_path / "b")
    (tmp_path / "b" / "head" / "a.onnx").write_bytes(b"y" * 64)  # same size, other bytes
    (tmp_path / "b" / "tail" / "b.onnx").unlink()
    (tmp_path / "b" / "full" / "model.tflite").write_bytes(b"short")
    out = device("verify", str(tmp_path / "b"))
    assert out.returncode == 1
    lines = out.stdout.splitlines()
    assert len(lines) == 3
    assert lines[0].startswith(f"{tmp_path / 'b' / 'full' / 'model.tflite'}: 5 bytes, the manifest says 64")
    assert any(l.startswith(f"{tmp_path / 'b' / 'head' / 'a.onnx'}: sha256 ") and "does not match" in l for l in lines)
    assert any(l.startswith(f"{tmp_path / 'b' / 'tail' / 'b.onnx'}: listed in the manifest but missing") for l in lines)
    assert all("copy the bundle again" in l for l in lines)
    report = json.loads(device("verify", str(tmp_path / "b"), "--json").stdout)
    assert report["ok"] is False and report["files"] == 14 and len(report["problems"]) == 3


def test_verify_of_an_edited_manifest_is_one_line(tmp_path: Path) -> None:
    fake_bundle(tmp_path / "b")
    path = tmp_path / "b" / MANIFEST_NAME
    path.write_text(path.read_text().replace('"layer"', '"bottleneck"', 1))
    out = device("verify", str(tmp_path / "b"))
    assert out.returncode == 1 and out.stdout.count("\n") == 1 and "edited after export" in out.stdout


def test_service_state_says_when_systemd_is_not_running(tmp_path: Path) -> None:
    assert service_state(systemd_dir=tmp_path / "absent") == NO_SYSTEMD


def test_service_state_asks_systemctl_where_systemd_runs(tmp_path: Path, monkeypatch) -> None:
    """systemd does not run here: a systemctl on PATH answers as the real one does for a stopped unit."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(
        '#!/bin/sh\n[ "$1 $2" = "is-active splitedge-device" ] && echo inactive\nexit 3\n'
    )
    (bin_dir / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    assert service_state(systemd_dir=tmp_path) == "inactive"


@pytest.fixture
def deployed(mobilenet_bundle: Path, tmp_path: Path) -> Layout:
    """The board slice of the test bundle installed and current, as a deploy leaves a board."""
    slice_bundle(mobilenet_bundle, tmp_path / "slice", BOARD_PART)
    layout = Layout(tmp_path / "splitedge")
    layout.switch(layout.install(tmp_path / "slice"))
    return layout


def test_status_after_a_run_from_current(deployed: Layout, photos_dir: Path) -> None:
    run = device("run", str(deployed.current), "--camera", str(photos_dir), "--split", "local", "--threads", "1")
    assert run.returncode == 0, run.stderr
    record = json.loads((deployed.release(deployed.current_id()) / LAST_RUN).read_text())
    assert (record["frames"], record["by_split"], record["error"]) == (4, {"local": 4}, None)
    assert record["release"] == deployed.current_id() and record["bundle_id"] != record["release"]
    out = device("status", "--root", str(deployed.root))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == f"release   {deployed.current_id()} ({deployed.root}/current)"
    assert lines[2] in (f"service   splitedge-device: {NO_SYSTEMD}", "service   splitedge-device: inactive")
    assert lines[3].startswith("last run  ") and ": 4 frames, 0 dropped" in lines[3]
    assert "by split: local 4; ended cleanly" in lines[3]


def test_a_failed_run_is_recorded_with_its_error(deployed: Layout, photos_dir: Path) -> None:
    run = device("run", str(deployed.current), "--camera", str(photos_dir), "--split", "features_4_conv_2",
                 "--host", "127.0.0.1:9", "--timeout", "1")
    assert run.returncode == 2
    status = json.loads(device("status", "--root", str(deployed.root), "--json").stdout)
    assert status["last_run"]["frames"] == 0 and "127.0.0.1:9" in status["last_run"]["error"]


def test_status_of_a_board_with_nothing_deployed_exits_1(tmp_path: Path) -> None:
    out = device("status", "--root", str(tmp_path))
    assert out.returncode == 1
    assert out.stdout.splitlines()[0] == f"release   none: nothing deployed under {tmp_path}"


def test_status_says_when_current_is_broken(deployed: Layout) -> None:
    shutil.rmtree(deployed.release(deployed.current_id()))
    out = device("status", "--root", str(deployed.root), "--json")
    assert out.returncode == 1 and json.loads(out.stdout)["current_ok"] is False


def test_a_last_run_record_that_is_no_file_is_reported_not_read(tmp_path: Path) -> None:
    """``status`` reads the release's last-run.json: a link to /dev/zero there was read until memory
    ran out (issue 45); it is reported unreadable, in one line."""
    (tmp_path / LAST_RUN).symlink_to("/dev/zero")
    record = _last_run(tmp_path / LAST_RUN)
    assert record is not None and "unreadable: not a regular file (a character device)" in record["error"]
