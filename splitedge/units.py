"""systemd service units for splitedge's long-running commands, rendered once for the host and the board.

A unit is hardened the way systemd's documentation recommends for a network service
(systemd.exec(5), ``systemd-analyze security``): its own user (``DynamicUser=`` unless a named
user must own devices, as the camera's ``video`` group needs on a board), no new privileges,
the file system read-only but for what the service writes (``ProtectSystem=strict``), home
directories hidden (or read-only where the service's files live there), a private /tmp and
/dev, kernel tunables, modules and control groups protected, address families limited to
what TCP and zeroconf need; restarted on failure, within a start limit. Secrets (the
pre-shared key, a TLS private key) are handed over with ``LoadCredential=``: the service reads
a copy only it can read, under ``%d``, wherever the original lies. Standard library only.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from splitedge.errors import SplitEdgeError

__all__ = ["SYSTEMD_RUNNING", "UNIT_DIR", "Credential", "ServiceUnit", "enable_offline", "enable_unit", "exec_line",
           "needs_home", "write_unit"]

UNIT_DIR = Path("/etc/systemd/system")
SYSTEMD_RUNNING = Path("/run/systemd/system")  # sd_booted(): systemd is PID 1 here

_PLAIN = re.compile(r"^[A-Za-z0-9_@%+=:,./-]+$")
HOMES = (Path("/home"), Path("/root"), Path("/run/user"))


@dataclass(frozen=True)
class Credential:
    """A secret file passed with ``LoadCredential=NAME:PATH``; on the command line it is ``%d/NAME``."""

    name: str
    path: Path

    @property
    def argument(self) -> str:
        return f"%d/{self.name}"


def _quote(argument: str | Credential) -> str:
    """One ExecStart= word: ``%`` and ``$`` escaped (systemd expands both), quoted when it must be."""
    if isinstance(argument, Credential):
        return argument.argument  # %d is meant: the credentials directory
    text = argument.replace("%", "%%").replace("$", "$$")
    if _PLAIN.match(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def exec_line(argv: Sequence[str | Credential]) -> str:
    return " ".join(_quote(a) for a in argv)


def needs_home(paths: Sequence[Path]) -> bool:
    """Whether any of ``paths`` (the interpreter, bundles, certificates) lies under a home directory."""
    for path in paths:
        resolved = Path(os.path.abspath(path))
        if any(resolved == home or home in resolved.parents for home in HOMES):
            return True
    return False


@dataclass(frozen=True)
class ServiceUnit:
    """What differs between splitedge's services; the hardening is the same for all of them."""

    description: str
    argv: tuple[str | Credential, ...]  # absolute interpreter first
    user: str | None = None  # None: DynamicUser=yes
    groups: tuple[str, ...] = ()  # SupplementaryGroups= (video: the camera)
    read_paths: tuple[Path, ...] = ()  # bundles, certificates, the interpreter: ProtectHome=read-only if at home
    write_paths: tuple[Path, ...] = ()  # ReadWritePaths= (a board's releases: calibration.json, last-run.json)
    environment: tuple[tuple[str, str], ...] = ()
    devices: bool = False  # needs /dev (a camera, a GPU): no PrivateDevices=
    bind_below_1024: bool = False  # AmbientCapabilities=CAP_NET_BIND_SERVICE
    restart_sec: float = 2.0
    start_limit_interval_s: int = 60
    start_limit_burst: int = 5
    stop_timeout_s: int = 30  # SIGTERM first: splitedge drains within a bound
    notify: bool = False  # Type=notify: active only once the service says READY=1 (sd_notify)
    start_timeout_s: int | None = None  # TimeoutStartSec=: how long READY=1 may take (loading a model)
    header: str = ""

    @property
    def credentials(self) -> list[Credential]:
        return [a for a in self.argv if isinstance(a, Credential)]

    def render(self) -> str:
        interpreter = str(self.argv[0])  # a venv's python links to the interpreter it was made from
        home = needs_home([*self.read_paths, *self.write_paths, Path(interpreter), Path(os.path.realpath(interpreter))])
        unit = [
            ("Description", self.description),
            ("Wants", "network-online.target"),
            ("After", "network-online.target"),
            ("StartLimitIntervalSec", str(self.start_limit_interval_s)),
            ("StartLimitBurst", str(self.start_limit_burst)),
        ]
        service: list[tuple[str, str]] = [("Type", "notify"), ("NotifyAccess", "main")] if self.notify else \
            [("Type", "exec")]
        service.append(("ExecStart", exec_line(self.argv)))
        if self.start_timeout_s is not None:
            service.append(("TimeoutStartSec", str(self.start_timeout_s)))
        service += [("Environment", f"{k}={v}") for k, v in self.environment]
        service += [("User", self.user)] if self.user else [("DynamicUser", "yes")]
        if self.groups:
            service.append(("SupplementaryGroups", " ".join(self.groups)))
        service += [("LoadCredential", f"{c.name}:{c.path}") for c in self.credentials]
        service += [("ReadWritePaths", str(p)) for p in self.write_paths]
        if self.bind_below_1024:
            service.append(("AmbientCapabilities", "CAP_NET_BIND_SERVICE"))
        service += [
            ("Restart", "on-failure"),
            # A stop by SIGTERM (or Ctrl-C) ends every command with one line and 143 (130): a clean stop.
            ("SuccessExitStatus", "130 143"),
            ("RestartSec", f"{self.restart_sec:g}"),
            ("TimeoutStopSec", str(self.stop_timeout_s)),
            ("NoNewPrivileges", "yes"),
            ("ProtectSystem", "strict"),
            # Hidden unless the service's own files live in a home directory (a venv in ~, a bundle in ~).
            ("ProtectHome", "read-only" if home else "yes"),
            ("PrivateTmp", "yes"),
            *([] if self.devices else [("PrivateDevices", "yes")]),
            ("ProtectKernelTunables", "yes"),
            ("ProtectKernelModules", "yes"),
            ("ProtectKernelLogs", "yes"),
            ("ProtectControlGroups", "yes"),
            ("ProtectClock", "yes"),
            ("ProtectHostname", "yes"),
            ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX AF_NETLINK"),  # TCP, zeroconf, interface lists
            ("RestrictNamespaces", "yes"),
            ("RestrictRealtime", "yes"),
            ("RestrictSUIDSGID", "yes"),
            ("LockPersonality", "yes"),
            ("SystemCallArchitectures", "native"),
            ("UMask", "0077"),
        ]
        sections = [("Unit", unit), ("Service", service), ("Install", [("WantedBy", "multi-user.target")])]
        lines = [f"# {line}".rstrip() for line in self.header.splitlines()] if self.header else []
        for name, entries in sections:
            if lines:
                lines.append("")
            lines.append(f"[{name}]")
            lines += [f"{key}={value}" for key, value in entries]
        return "\n".join(lines) + "\n"


def write_unit(text: str, unit_dir: Path, name: str) -> Path:
    """``unit_dir/NAME.service`` with ``text``, replaced whole (a reader never sees half a unit)."""
    path = Path(unit_dir) / f"{name}.service"
    temp = path.with_name(f".{path.name}.new")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp.write_text(text)
        temp.chmod(0o644)
        os.replace(temp, path)
    except OSError as exc:
        raise SplitEdgeError(f"cannot write {path} ({exc.strerror}): run with sudo, or choose --unit-dir") from None
    return path


def enable_unit(name: str, restart: bool = False, systemd_dir: Path = SYSTEMD_RUNNING) -> str | None:
    """``systemctl daemon-reload``, ``enable --now`` and, with ``restart``, ``restart`` (a running
    service picks up a new release; with ``Type=notify`` it returns once the service is ready, and
    fails when it never is). None when done, else why not, in one line."""
    systemctl = shutil.which("systemctl")
    if systemctl is None or not systemd_dir.is_dir():
        return "systemd is not running on this machine (no /run/systemd/system)"
    commands = [["daemon-reload"], ["enable", "--now", f"{name}.service"]]
    if restart:
        commands.append(["restart", f"{name}.service"])
    for command in commands:
        out = subprocess.run([systemctl, *command], capture_output=True, text=True, timeout=300)
        if out.returncode != 0:
            said = (out.stderr or out.stdout).strip().splitlines()
            return (f"systemctl {' '.join(command)} failed: {said[0] if said else f'exit {out.returncode}'} "
                    f"(journalctl -u {name} says why)")
    return None


def enable_offline(root: Path, name: str) -> str | None:
    """``systemctl --root=ROOT enable NAME``: the unit starts at the next boot of the system whose
    root file system is mounted at ``root`` (a board's SD card); nothing runs here. None when done."""
    systemctl = shutil.which("systemctl")
    if systemctl is None:
        return "systemctl is not installed here (apt install systemd) to enable the unit on the card"
    out = subprocess.run([systemctl, f"--root={root}", "enable", f"{name}.service"], capture_output=True, text=True,
                         timeout=60)
    if out.returncode != 0:
        said = (out.stderr or out.stdout).strip().splitlines()
        return f"systemctl --root={root} enable {name} failed: {said[0] if said else f'exit {out.returncode}'}"
    return None
