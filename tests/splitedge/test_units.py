"""The one unit renderer the host's and the board's services share."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from splitedge.units import Credential, ServiceUnit, exec_line, needs_home


def test_exec_line_escapes_what_systemd_would_expand() -> None:
    assert exec_line(["/usr/bin/python3", "-m", "x", "a b", "50%", "$HOME", Credential("k", Path("/etc/k"))]) == (
        '/usr/bin/python3 -m x "a b" 50%% "$$HOME" %d/k'
    )


def test_home_directories_make_protect_home_read_only_not_yes() -> None:
    assert needs_home([Path("/home/pi/splitedge/bin/python")]) and needs_home([Path("/root/x")])
    assert not needs_home([Path("/srv/splitedge"), Path("/homeless")])
    unit = ServiceUnit("d", ("/usr/bin/python3", "-m", "x"), read_paths=(Path("/home/pi/bundle"),)).render()
    assert "ProtectHome=read-only" in unit.splitlines()
    assert "ProtectHome=yes" in ServiceUnit("d", ("/usr/bin/python3",)).render().splitlines()


def test_a_board_style_unit_with_a_user_the_camera_group_and_devices(tmp_path: Path) -> None:
    """What the board's unit will be: a named user in the video group, /dev visible, its releases writable."""
    unit = ServiceUnit(
        "splitedge device", (sys.executable, "-m", "device_runtime.cli", "run", "/srv/splitedge/current"),
        user="root", groups=("video",), devices=True, write_paths=(Path("/srv/splitedge"),),
        environment=(("SPLITEDGE_ROOT", "/srv/splitedge"),),
    ).render()
    lines = unit.splitlines()
    assert {"User=root", "SupplementaryGroups=video", "ReadWritePaths=/srv/splitedge",
            "Environment=SPLITEDGE_ROOT=/srv/splitedge"} <= set(lines)
    assert "DynamicUser=yes" not in lines and "PrivateDevices=yes" not in lines
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (apt install systemd)")
    path = tmp_path / "splitedge-device.service"
    path.write_text(unit)
    out = subprocess.run([analyze, "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stderr == "", out.stderr


def test_systemd_analyze_catches_a_broken_unit(tmp_path: Path) -> None:
    """The check above can fail: a unit whose command does not exist is refused."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (apt install systemd)")
    path = tmp_path / "broken.service"
    path.write_text(ServiceUnit("d", ("/nonexistent/python3", "-m", "x")).render())
    out = subprocess.run([analyze, "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "/nonexistent/python3" in out.stderr
