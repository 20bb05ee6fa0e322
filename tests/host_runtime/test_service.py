"""split-host install-service: a hardened unit running serve with the same flags, checked by systemd's own verifier."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from host_runtime import cli as host_cli
from host_runtime._settings import HostSettings
from tests.device_runtime.test_bundle_slice import fake_bundle

ROOT = Path(__file__).resolve().parents[2]
HARDENING = ("DynamicUser=yes", "NoNewPrivileges=yes", "ProtectSystem=strict", "PrivateTmp=yes",
             "Restart=on-failure", "SuccessExitStatus=130 143", "StartLimitIntervalSec=60", "StartLimitBurst=5")


def host(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "host_runtime.cli", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def systemd_verify(unit: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (apt install systemd)")
    out = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stderr == "", out.stderr


@pytest.fixture
def key(tmp_path: Path) -> Path:
    path = tmp_path / "host.key"
    path.write_text("ab" * 32 + "\n")
    path.chmod(0o600)
    return path


def exec_start(unit: str) -> list[str]:
    (line,) = [l for l in unit.splitlines() if l.startswith("ExecStart=")]
    return shlex.split(line.removeprefix("ExecStart="))


def test_dry_run_prints_a_hardened_unit_that_runs_serve_with_the_same_flags(mobilenet_bundle: Path, key: Path) -> None:
    flags = ["--port", "7800", "--max-batch", "16", "--interface", "127.0.0.1", "--no-zeroconf", "--key-file", str(key)]
    out = host("install-service", str(mobilenet_bundle), *flags, "--dry-run")
    assert out.returncode == 0, out.stderr
    unit = out.stdout
    assert all(line in unit.splitlines() for line in HARDENING)
    assert f"LoadCredential=host.key:{key}" in unit.splitlines()
    argv = exec_start(unit)
    assert argv[:4] == [sys.executable, "-m", "host_runtime.cli", "serve"]
    # The unit's command line, read back by serve's own parser, is what was asked for.
    served = host_cli.build_parser().parse_args([a.replace("%d/host.key", str(key)) for a in argv[3:]])
    asked = host_cli.build_parser().parse_args(["serve", str(mobilenet_bundle.resolve()), *flags])
    assert vars(served) == vars(asked)
    assert "--loop" not in argv and "--workers" not in argv  # defaults are left to serve


#: A value other than the default for every one of serve's flags (a switch: None).
EVERY_FLAG = {
    "--port": "7800", "--interface": "127.0.0.1", "--no-zeroconf": None, "--workers": "3", "--threads": "2",
    "--max-frame-mb": "80", "--max-partial-mb": "200", "--max-connections": "500",
    "--max-connections-per-address": "10", "--idle-timeout": "30", "--frame-timeout": "20",
    "--first-frame-timeout": "5", "--drain-timeout": "3", "--profile-budget-ms": "50", "--device": "cpu",
    "--tf32": None, "--buckets": "4,1,2", "--max-batch": "4", "--max-wait-ms": "2.5", "--share-queue": "on",
    "--max-queue": "100", "--metrics-port": "9100", "--metrics-interface": "127.0.0.2",
    "--metrics-token-file": "metrics.token", "--live": "127.0.0.1:8080",
    "--key-file": "/etc/splitedge/host.key", "--tls-cert": "/etc/splitedge/cert.pem",
    "--tls-key": "/etc/splitedge/key.pem", "--loop": "asyncio", "--peer": "127.0.0.1:7801", "--verbose": None,
}


def _settings(argv: list[str]) -> HostSettings:
    return HostSettings.from_args(host_cli.build_parser().parse_args(argv))


@pytest.mark.parametrize("only", [None, "--procs"])
def test_the_settings_written_back_as_flags_are_the_same_settings(only: str | None, tmp_path: Path) -> None:
    """install-service's unit runs serve with HostSettings.flags: every setting of every flag (a new
    flag fails here until it has a value above) reads back as itself; --procs apart, as --live refuses it."""
    (subs,) = [a for a in host_cli.build_parser()._actions if hasattr(a, "choices") and isinstance(a.choices, dict)]
    flags = {action.option_strings[-1] for action in subs.choices["serve"]._actions
             if action.option_strings and action.dest != "help"}
    assert flags == set(EVERY_FLAG) | {"--procs"}
    token = tmp_path / "metrics.token"
    token.write_text("t" * 32 + "\n")
    token.chmod(0o600)
    given = {"--procs": "2"} if only else {**EVERY_FLAG, "--metrics-token-file": str(token)}
    argv = ["serve", "b1", "b2"] + [word for flag, value in given.items() for word in (flag, value) if word is not None]
    settings, defaults = _settings(argv + ["--peer", "127.0.0.1:7802"] * (only is None)), _settings(["serve", "b1"])
    back = [word for _, flag, value in settings.flags(defaults) for word in (flag, value) if word is not None]
    assert _settings(["serve", "b1", "b2", *back]) == settings
    assert len(back) == len(argv) - 3 + 2 * (only is None)  # nothing more than was given, nothing less


def test_the_metrics_token_file_is_a_credential_too(mobilenet_bundle: Path, key: Path, tmp_path: Path) -> None:
    token = tmp_path / "metrics.token"
    token.write_text("t" * 32 + "\n")
    token.chmod(0o600)
    flags = ["--metrics-port", "9100", "--metrics-interface", "0.0.0.0", "--metrics-token-file", str(token)]
    out = host("install-service", str(mobilenet_bundle), "--key-file", str(key), *flags, "--dry-run")
    assert out.returncode == 0, out.stderr
    assert f"LoadCredential=metrics.token:{token}" in out.stdout.splitlines()
    argv = exec_start(out.stdout)
    assert argv[argv.index("--metrics-token-file") + 1] == "%d/metrics.token"
    assert argv[argv.index("--metrics-interface") + 1] == "0.0.0.0"


def test_the_written_unit_passes_systemd_analyze_verify(tmp_path: Path, key: Path) -> None:
    """A bundle path with a space and a % (systemd expands %): quoted and escaped so systemd reads it back."""
    fake_bundle(tmp_path / "my bundles 100%")
    cert = tmp_path / "cert.pem"
    cert.write_text("not checked here")
    out = host("install-service", str(tmp_path / "my bundles 100%"), "--key-file", str(key), "--tls-cert", str(cert),
               "--tls-key", str(key), "--port", "443", "--unit-dir", str(tmp_path / "units"), "--no-enable")
    assert out.returncode == 0, out.stderr
    unit = tmp_path / "units" / "splitedge-host.service"
    assert out.stdout == f"wrote {unit}\n"
    text = unit.read_text()
    assert f'"{tmp_path}/my bundles 100%%"' in text
    assert "AmbientCapabilities=CAP_NET_BIND_SERVICE" in text  # port 443 as a dynamic user
    assert f"LoadCredential=tls-key.pem:{key}" in text and "--tls-key %d/tls-key.pem" in text
    systemd_verify(unit)


def test_enabling_says_when_systemd_is_not_running(tmp_path: Path, mobilenet_bundle: Path) -> None:
    if Path("/run/systemd/system").is_dir():
        pytest.skip("systemd runs here: enabling would start a real service")
    out = host("install-service", str(mobilenet_bundle), "--unit-dir", str(tmp_path), "--name", "edge-host")
    assert out.returncode == 1
    assert (tmp_path / "edge-host.service").is_file()
    assert out.stderr.startswith("split-host: not enabled: systemd is not running on this machine")
    assert "systemctl enable --now edge-host" in out.stderr


def test_a_key_others_can_read_is_refused_before_anything_is_written(tmp_path: Path, mobilenet_bundle: Path,
                                                                     key: Path) -> None:
    key.chmod(0o644)
    out = host("install-service", str(mobilenet_bundle), "--key-file", str(key), "--unit-dir", str(tmp_path / "u"))
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and str(key) in out.stderr
    assert not (tmp_path / "u").exists()


def test_a_unit_dir_that_cannot_be_written_is_one_line(tmp_path: Path, mobilenet_bundle: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = host("install-service", str(mobilenet_bundle), "--unit-dir", str(blocker / "units"))
    assert out.returncode == 2 and "run with sudo, or choose --unit-dir" in out.stderr
