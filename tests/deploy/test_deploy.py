"""split-export deploy against real OpenSSH servers: every board ends whole on the new release or untouched.

The boards (tests/deploy/conftest.py) are sshd processes on 127.0.0.1, each with its own user,
home and host key, running splitedge installed from its wheel; the deploy is this checkout's
``split-export`` in a process of its own, reaching them with an ssh config file as a user's
``~/.ssh/config`` would.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from device_runtime.bundle import BOARD_PART, HEAD, Bundle, make_artifact, write_manifest
from device_runtime.bundle_slice import slice_manifest
from tests.conftest import start_host
from tests.deploy.conftest import Boards, needs_boards, split_export

pytestmark = needs_boards

ANSWER = re.compile(r"^#\d+\s+(\S+)\s+(.+?)\s+(\d\.\d{3})\s+split=(\S+)", re.M)


def answers(stdout: str) -> dict[str, tuple[str, float, str]]:
    """``split-device run``'s lines: photo -> (label, probability, split)."""
    return {m[1]: (m[2], float(m[3]), m[4]) for m in ANSWER.finditer(stdout)}


def deploy(fleet: Boards, bundle: Path | None, *boards: str, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    to = [arg for board in boards for arg in ("--to", board)]
    return split_export("deploy", *([str(bundle)] if bundle else []), *to, "--ssh-config", str(fleet.ssh_config),
                        *extra)


def slice_id(bundle: Path) -> str:
    """The bundle_id of the board slice a deploy of ``bundle`` installs (a slice's id is its content's)."""
    manifest, _ = slice_manifest(Bundle.load(bundle, roles=()), BOARD_PART)
    with tempfile.TemporaryDirectory() as tmp:
        return write_manifest(tmp, manifest).bundle_id


@pytest.fixture(scope="module")
def changed_bundle(mobilenet_bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test bundle with one head re-exported: a valid ONNX field (doc_string) appended, so its
    bytes, its sha256 and the bundle's id differ while every other file stays the same."""
    out = tmp_path_factory.mktemp("changed") / "bundle"
    shutil.copytree(mobilenet_bundle, out)
    manifest = Bundle.load(out, roles=()).manifest
    split = manifest.splits[-1]
    head = next(a for a in split.artifacts if a.role == HEAD)
    with open(out / head.path, "ab") as fh:
        fh.write(b"\x32\x0bre-exported")  # ModelProto field 6 (doc_string): the last one read wins
    changed = make_artifact(out, head.path, head.role, head.format, head.precision)
    split = dataclasses.replace(split, artifacts=tuple(changed if a is head else a for a in split.artifacts))
    write_manifest(out, dataclasses.replace(manifest, splits=(*manifest.splits[:-1], split), bundle_id="",
                                            manifest_sha256=""))
    return out


def reference(bundle: Path, photos: Path, split: str, host: str | None = None) -> dict[str, tuple[str, float, str]]:
    import sys
    argv = [sys.executable, "-m", "device_runtime.cli", "run", str(bundle), "--camera", str(photos), "--split", split]
    out = subprocess.run([*argv, *(["--host", host] if host else [])], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return answers(out.stdout)


def same_answers(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys() and len(got) == 4
    for photo, (label, probability, split) in expected.items():
        assert got[photo][0] == label and got[photo][2] == split
        assert abs(got[photo][1] - probability) <= 0.002  # float32 ONNX on the same CPU, printed to 3 places


def test_a_fleet_deploys_and_the_full_disk_fails_alone(make_boards, mobilenet_bundle: Path, photos_dir: Path) -> None:
    fleet = make_boards(board1={}, board2={"disk_mb": 8}, board3={})
    photos = fleet.base / "photos"
    shutil.copytree(photos_dir, photos)
    photos.chmod(0o755)
    release = slice_id(mobilenet_bundle)
    for host in start_host([mobilenet_bundle]):
        address = f"127.0.0.1:{host.port}"
        out = deploy(fleet, mobilenet_bundle, "board1", "board2", "board3",
                     extra=("--max-fail", "50%", "--host", address))
        assert out.returncode == 1, out.stdout + out.stderr
        assert re.search(rf"^board1: current {release} \(was none\), [\d.]+ MB by rsync", out.stdout, re.M)
        assert re.search(rf"^board3: current {release} \(was none\)", out.stdout, re.M)
        assert re.search(r"^board2: FAILED: not enough space under .*: 8 MB free, the release needs 17 MB; .*"
                         r"; current left as it was$", out.stdout, re.M), out.stdout
        assert out.stdout.rstrip().endswith("2 of 3 board(s) done, 1 failed")
        assert fleet["board1"].current() == fleet["board3"].current() == release
        assert fleet["board2"].current() is None and fleet["board2"].releases() == []
        # The deployed release, run by the board's own split-device over ssh, its host from the deployed settings.
        for split in ("local", "features_14_conv_2"):
            run = fleet.ssh("board1", f"~/splitedge/bin/split-device run ~/.local/share/splitedge/current "
                                      f"--camera {photos} --split {split}")
            assert run.returncode == 0, run.stdout + run.stderr
            same_answers(answers(run.stdout), reference(mobilenet_bundle, photos_dir, split,
                                                        address if split != "local" else None))
        config = fleet.ssh("board3", "~/splitedge/bin/split-device config --json")
        assert f'"value": "{address}"' in config.stdout and "device.toml" in config.stdout


def test_max_fail_stops_the_rollout_before_the_next_batch(make_boards, mobilenet_bundle: Path) -> None:
    fleet = make_boards(board2={"disk_mb": 8}, board1={}, board3={})
    out = deploy(fleet, mobilenet_bundle, "board2", "board1", "board3", extra=("--serial", "1", "--max-fail", "25%"))
    assert out.returncode == 1
    assert "stopped: 1 of 3 boards failed (33% > --max-fail 25%); not reached: board1, board3" in out.stdout
    assert out.stdout.rstrip().endswith("0 of 3 board(s) done, 1 failed, 2 not reached")
    assert all(fleet[b].current() is None and fleet[b].releases() == [] for b in ("board1", "board2", "board3"))
    # The same failure within what --max-fail allows: the rollout goes on.
    out = deploy(fleet, mobilenet_bundle, "board2", "board1", "board3", extra=("--serial", "1", "--max-fail", "34%"))
    assert out.returncode == 1 and "2 of 3 board(s) done, 1 failed" in out.stdout
    assert fleet["board1"].current() == fleet["board3"].current() == slice_id(mobilenet_bundle)
