"""split-export deploy --card: a board's SD card root file system, written here, as the board will read it.

The card is the board in a box's arm64 Bookworm root file system (``SPLITEDGE_BOARD_ROOT``,
``make board``) seen through an overlay, so the cached box is never changed: a real Raspberry
Pi OS-like root, its own users and groups, the board's own Python and splitedge under
emulation to check what the deploy wrote.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from device_runtime.bundle import BOARD_PART, Bundle, write_manifest
from device_runtime._bundle_slice import slice_manifest
from testbed.board_box import VENV, BoardBox
from testbed._ssh_boards import one_head_changed
from tests.deploy.conftest import split_export

BOX = os.environ.get("SPLITEDGE_BOARD_ROOT")
needs_box = pytest.mark.skipif(not BOX or os.geteuid() != 0 or not shutil.which("useradd"),
                               reason="needs the board in a box (make board: SPLITEDGE_BOARD_ROOT) and root")


def slice_id(bundle: Path) -> str:
    manifest, _ = slice_manifest(Bundle.load(bundle, roles=()), BOARD_PART)
    with tempfile.TemporaryDirectory() as tmp:
        return write_manifest(tmp, manifest).bundle_id


def card_deploy(card: Path, bundle: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return split_export("deploy", str(bundle), "--card", str(card), *extra)


def test_a_path_that_is_not_a_root_file_system_is_one_line(tmp_path: Path, mobilenet_bundle: Path) -> None:
    (tmp_path / "overlays").mkdir()  # what a mounted bootfs partition looks like: no etc, no usr
    out = card_deploy(tmp_path, mobilenet_bundle)
    assert out.returncode == 1 and out.stderr == ""
    assert out.stdout.strip() == (f"{tmp_path}: FAILED: not a root file system (no etc/os-release, etc/passwd, usr): "
                                  "give the card's rootfs partition, such as /media/$USER/rootfs, not bootfs; "
                                  "current left as it was")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["overlays"]


def test_json_says_the_same_as_one_object(tmp_path: Path, mobilenet_bundle: Path) -> None:
    (tmp_path / "overlays").mkdir()
    out = card_deploy(tmp_path, mobilenet_bundle, "--json")
    assert out.returncode == 1 and out.stderr.startswith(f"{tmp_path}: FAILED: not a root file system")
    summary = json.loads(out.stdout)  # the whole of stdout
    assert (summary["ok"], summary["done"], summary["failed"], summary["not_reached"]) == (False, 0, 1, [])
    (board,) = summary["boards"]
    assert board["board"] == str(tmp_path) and not board["ok"] and board["error"].startswith("not a root file system")


@pytest.fixture
def card(tmp_path: Path) -> Iterator[Path]:
    """The box through an overlay (its files untouched), with a first user pi and splitedge in ~/splitedge."""
    upper, work, mount = tmp_path / "upper", tmp_path / "work", tmp_path / "card"
    for d in (upper, work, mount):
        d.mkdir()
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir={Path(BOX).resolve()},upperdir={upper},workdir={work}", str(mount)], check=True)
    try:
        subprocess.run(["useradd", "--root", str(mount), "--create-home", "--shell", "/bin/bash", "--user-group",
                        "--groups", "video", "pi"], check=True, capture_output=True)
        (mount / "home/pi/splitedge").symlink_to(VENV)  # the box's board install, as README's ~/splitedge
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def pi_uid(card: Path) -> int:
    return next(int(line.split(":")[2]) for line in (card / "etc/passwd").read_text().splitlines()
                if line.startswith("pi:"))


@needs_box
def test_a_card_gets_the_release_settings_and_an_enabled_service_the_board_reads(
    card: Path, mobilenet_bundle: Path, tmp_path: Path,
) -> None:
    release = slice_id(mobilenet_bundle)
    out = card_deploy(card, mobilenet_bundle, "--user", "pi", "--host", "192.168.1.20:7767", "--camera", "picam",
                      "--service")
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.match(rf"{re.escape(str(card))}: current {release} \(was none\), [\d.]+ MB by copy to the card", out.stdout), \
        out.stdout
    root = card / "home/pi/.local/share/splitedge"
    assert os.readlink(root / "current") == f"releases/{release}"  # relative: holds on the board
    uid = pi_uid(card)
    for path in [root, root / "current", *(root / "releases").rglob("*"), card / "home/pi/.config/splitedge"]:
        assert path.lstat().st_uid == uid, path
    unit = (card / "etc/systemd/system/splitedge-device.service").read_text()
    assert "ExecStart=/home/pi/splitedge/bin/python -m device_runtime.cli run /home/pi/.local/share/splitedge/current" \
        in unit and "User=pi" in unit and "SupplementaryGroups=video" in unit
    wants = card / "etc/systemd/system/multi-user.target.wants/splitedge-device.service"
    assert wants.is_symlink() and os.readlink(wants) == "/etc/systemd/system/splitedge-device.service"
    # What the board will do at boot, by its own Python and splitedge (arm64, emulated).
    box = BoardBox(card)
    with box.mounted():
        verify = box.run(["runuser", "-u", "pi", "--", "/home/pi/splitedge/bin/split-device", "verify",
                          "/home/pi/.local/share/splitedge/current"], env={"HOME": "/home/pi"}, check=False)
        config = box.run(["runuser", "-u", "pi", "--", "/home/pi/splitedge/bin/split-device", "config"],
                         env={"HOME": "/home/pi"}, check=False)
    assert verify.returncode == 0 and "files match the manifest" in verify.stdout, verify.stdout + verify.stderr
    assert "192.168.1.20:7767" in config.stdout and "picam" in config.stdout, config.stdout + config.stderr
    # A second release: current moves, the first is kept for a rollback.
    changed = one_head_changed(mobilenet_bundle, tmp_path / "changed")
    out = card_deploy(card, changed, "--user", "pi")
    assert out.returncode == 0 and os.readlink(root / "current") == f"releases/{slice_id(changed)}"
    assert os.readlink(root / "previous") == f"releases/{release}"


@needs_box
@pytest.mark.parametrize("argv, message", [
    (("--user", "alice"), "no user 'alice' on the card: Raspberry Pi OS makes the first user at first boot"),
    (("--user", "pi", "--service", "--set", "threads=2"), "--service runs /home/pi/splitedge/bin/python, which is "
                                                          "not on the card: install splitedge there first"),
])
def test_a_card_that_cannot_take_the_release_is_left_as_it_was(
    card: Path, mobilenet_bundle: Path, argv: tuple[str, ...], message: str,
) -> None:
    (card / "home/pi/splitedge").unlink()  # splitedge not installed on this card
    out = card_deploy(card, mobilenet_bundle, *argv)
    assert out.returncode == 1
    assert out.stdout.startswith(f"{card}: FAILED: {message}") and out.stdout.rstrip().endswith(
        "; current left as it was")
    assert not (card / "home/pi/.local").exists() and not (card / "home/pi/.config").exists()
