"""The board in a box as a deploy target: its own sshd (arm64, under emulation), its Python and packages.

An overlay of the box (``SPLITEDGE_BOARD_ROOT``, ``make board``; the cached box is never
changed) gets a first user ``pi`` with splitedge in ``~/splitedge`` (the box's board install) and
runs the box's own ``/usr/sbin/sshd`` on a port of 127.0.0.1; ``split-export deploy`` reaches it
as it would a Pi, and the release it leaves is run there by the board's ``split-device``. It is
emulated: its timings mean nothing.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from testbed import free_port
from testbed.board_box import VENV, BoardBox
from tests.deploy.conftest import split_export
from tests.deploy.test_card import BOX, needs_box, pi_uid, slice_id

ANSWER = re.compile(r"^#\d+\s+(\S+)\s+(.+?)\s+(\d\.\d{3})\s+split=(\S+)", re.M)


@dataclass
class BoxTarget:
    root: Path
    ssh_config: Path


@pytest.fixture
def box_target(tmp_path: Path, photos_dir: Path) -> Iterator[BoxTarget]:
    upper, work, root = tmp_path / "upper", tmp_path / "work", tmp_path / "box"
    for d in (upper, work, root):
        d.mkdir()
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                    f"lowerdir={Path(BOX).resolve()},upperdir={upper},workdir={work}", str(root)], check=True)
    sshd = None
    try:
        if not (root / "usr/sbin/sshd").exists():
            pytest.skip("the box has no sshd: python -m testbed.board_box install --ssh (make board does)")
        subprocess.run(["useradd", "--root", str(root), "--create-home", "--shell", "/bin/bash", "--user-group", "pi"],
                       check=True, capture_output=True)
        subprocess.run(["usermod", "--root", str(root), "-p", "*", "pi"], check=True)
        home = root / "home/pi"
        (home / "splitedge").symlink_to(VENV)
        key = tmp_path / "key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        (home / ".ssh").mkdir(mode=0o700)
        shutil.copy(f"{key}.pub", home / ".ssh/authorized_keys")
        shutil.copytree(photos_dir, home / "photos")
        uid = pi_uid(root)
        for path in [home, *home.rglob("*")]:
            os.chown(path, uid, uid, follow_symlinks=False)
        port = free_port()
        (root / "etc/ssh/sshd_config.d/splitedge-test.conf").write_text(
            f"Port {port}\nListenAddress 127.0.0.1\nUsePAM no\nPasswordAuthentication no\nAllowUsers pi\n")
        (root / "run/sshd").mkdir(parents=True, exist_ok=True)
        box = BoardBox(root)
        with box.mounted():
            sshd = subprocess.Popen(box.command(["/usr/sbin/sshd", "-D", "-e"]), stdout=subprocess.DEVNULL,
                                    stderr=open(tmp_path / "sshd.log", "w"))
            deadline = time.monotonic() + 60  # sshd under emulation starts in seconds
            while time.monotonic() < deadline and sshd.poll() is None:
                with socket.socket() as s:
                    if s.connect_ex(("127.0.0.1", port)) == 0:
                        break
                time.sleep(0.2)
            else:
                raise RuntimeError(f"the box's sshd did not listen: {(tmp_path / 'sshd.log').read_text()}")
            host_key = (root / "etc/ssh/ssh_host_ed25519_key.pub").read_text()
            (tmp_path / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_key}")
            config = tmp_path / "ssh_config"
            config.write_text(f"Host box\n  HostName 127.0.0.1\n  Port {port}\n  User pi\n  IdentityFile {key}\n"
                              f"  IdentitiesOnly yes\n  UserKnownHostsFile {tmp_path}/known_hosts\n"
                              "  StrictHostKeyChecking yes\n")
            yield BoxTarget(root, config)
            sshd.terminate()
            sshd.wait(10)
    finally:
        if sshd is not None and sshd.poll() is None:
            sshd.kill()
            sshd.wait()
        subprocess.run(["pkill", "-KILL", "-f", f"sshd.*{root}"], capture_output=True)
        subprocess.run(["umount", "-l", str(root)], capture_output=True)


@needs_box
def test_a_deploy_to_the_board_in_a_box_over_its_own_sshd_runs_there(
    box_target: BoxTarget, mobilenet_bundle: Path, photos_dir: Path,
) -> None:
    release = slice_id(mobilenet_bundle)
    out = split_export("deploy", str(mobilenet_bundle), "--to", "box", "--ssh-config", str(box_target.ssh_config),
                       "--connect-timeout", "60", "--camera", "/home/pi/photos")
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(rf"^box: current {release} \(was none\), [\d.]+ MB by rsync", out.stdout, re.M), out.stdout
    assert os.readlink(box_target.root / "home/pi/.local/share/splitedge/current") == f"releases/{release}"
    ran = subprocess.run(["ssh", "-F", str(box_target.ssh_config), "-o", "BatchMode=yes", "box",
                          "~/splitedge/bin/split-device run ~/.local/share/splitedge/current --split local "
                          "--preprocess exact --verbose"],
                         capture_output=True, text=True, timeout=900)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    board = {m[1]: (m[2], float(m[3])) for m in ANSWER.finditer(ran.stdout)}
    # Both sides preprocess exactly (numpy, the same arithmetic everywhere), so what is compared is the
    # network's kernels. On the fast path (OpenCV's blur and resize, NEON against AVX) the box gave
    # astronaut.png bobsled 0.206 against x86's 0.175, the same top-1: not compared here.
    here = subprocess.run([os.sys.executable, "-m", "device_runtime.cli", "run", str(mobilenet_bundle), "--camera",
                           str(photos_dir), "--split", "local", "--preprocess", "exact", "--verbose"],
                          capture_output=True, text=True, timeout=300)
    x86 = {m[1]: (m[2], float(m[3])) for m in ANSWER.finditer(here.stdout)}
    assert board.keys() == x86.keys() and len(board) == 4
    for photo, (label, probability) in x86.items():  # aarch64 kernels: same top-1, probabilities within 0.005
        assert board[photo][0] == label and abs(board[photo][1] - probability) <= 0.005, (photo, board[photo])
