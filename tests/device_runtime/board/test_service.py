"""split-device install-service: a hardened Type=notify unit running run on the release in use, checked by systemd."""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from device_runtime import cli

ROOT = Path(__file__).resolve().parents[3]
ME = pwd.getpwuid(__import__("os").getuid()).pw_name


def device(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "device_runtime.cli", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=None if env is None else {**os.environ, **env})


def test_the_unit_runs_the_release_in_use_as_the_user_and_systemd_accepts_it(tmp_path: Path) -> None:
    releases = tmp_path / "splitedge"
    out = device("install-service", "--user", ME, "--root", str(releases), "--dry-run")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    for line in ("Type=notify", "NotifyAccess=main", f"User={ME}", f"ReadWritePaths={releases}", "TimeoutStartSec=180",
                 "Restart=on-failure", "NoNewPrivileges=yes", "ProtectSystem=strict", "StartLimitBurst=5"):
        assert line in lines, line
    assert "PrivateDevices=yes" not in lines  # the camera is a device
    (start,) = [line.removeprefix("ExecStart=") for line in lines if line.startswith("ExecStart=")]
    argv = shlex.split(start)
    assert argv[:3] == [sys.executable, "-m", "device_runtime.cli"]
    parsed = cli.build_parser().parse_args(argv[3:])  # the unit's command line, read back by run's own parser
    assert parsed.command == "run" and parsed.bundle == str(releases / "current")
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (apt install systemd)")
    unit = tmp_path / "splitedge-device.service"
    unit.write_text(out.stdout)
    verified = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert verified.returncode == 0 and verified.stderr == "", verified.stderr


def test_no_enable_writes_the_unit_and_without_systemd_it_says_so(tmp_path: Path) -> None:
    out = device("install-service", "--user", ME, "--root", str(tmp_path), "--unit-dir", str(tmp_path / "units"),
                 "--no-enable")
    assert out.returncode == 0 and (tmp_path / "units" / "splitedge-device.service").is_file()
    if Path("/run/systemd/system").is_dir():
        pytest.skip("systemd runs here: enabling would start a real service")
    out = device("install-service", "--user", ME, "--root", str(tmp_path), "--unit-dir", str(tmp_path / "units"))
    assert out.returncode == 1
    assert out.stderr.strip() == ("split-device: not running: systemd is not running on this machine "
                                  "(no /run/systemd/system)")


def test_an_unknown_user_is_one_line() -> None:
    out = device("install-service", "--user", "no-such-user-here", "--dry-run")
    assert out.returncode == 2
    assert out.stderr.strip() == ("split-device: error: no user 'no-such-user-here' on this board: give --user an "
                                  "existing one (the one that owns the releases)")


@pytest.mark.parametrize("text, message", [
    ("batch = 0\n", "device.toml: batch: expected a whole number from 1 to 1024"),
    ("timeout = \n", "not valid TOML"),
])
def test_a_settings_file_the_service_could_not_run_with_is_refused_in_one_line(
    tmp_path: Path, text: str, message: str
) -> None:
    """The same checks as run's: the unit is not written for a board that would fail at boot."""
    (tmp_path / "device.toml").write_text(text)
    out = device("install-service", "--user", ME, "--root", str(tmp_path / "r"), "--dry-run",
                 env={"SPLITEDGE_CONFIG_DIRS": str(tmp_path)})
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1 and str(tmp_path / "device.toml") in out.stderr
    assert message in out.stderr
