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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Credential", "ServiceUnit", "exec_line", "needs_home"]

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
        service: list[tuple[str, str]] = [("Type", "exec"), ("ExecStart", exec_line(self.argv))]
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
