"""``split-host install-service``: the host as a hardened systemd service, started at boot.

The unit runs ``split-host serve`` with the settings given to ``install-service`` (the same
flags, checked into the same :class:`~host_runtime._settings.HostSettings`, written back as flags
by :meth:`~host_runtime._settings.HostSettings.flags`), from this Python, on absolute paths; the key file and the TLS private
key reach the service as systemd credentials (``LoadCredential=``), so they can stay readable
by root alone. The unit is rendered by :class:`splitedge.units.ServiceUnit`, which the board's
unit shares, and enabled with ``systemctl enable --now`` where systemd runs.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from device_runtime import FULL, TAIL, Bundle
from device_runtime.wire import load_key
from host_runtime._settings import HostSettings
from splitedge import SplitEdgeError
from splitedge.units import Credential, ServiceUnit, UNIT_DIR, enable_unit, write_unit

__all__ = ["SERVICE_EXAMPLES", "ServiceOptions", "install_service", "host_unit", "service_arguments"]

NAME = "splitedge-host"
#: Secrets handed over as credentials: (setting, credential name).
SECRETS = {"key_file": "host.key", "tls_key": "tls-key.pem", "metrics_token_file": "metrics.token"}
PATHS = {"tls_cert"}

SERVICE_EXAMPLES = """\
examples:
  split-host install-service /srv/splitedge/bundle --key-file /etc/splitedge/host.key --dry-run   # print the unit
  sudo split-host install-service /srv/splitedge/bundle --key-file /etc/splitedge/host.key   # write, enable, start
  sudo split-host install-service bundle/ --port 7767 --max-batch 16 --user splitedge       # a named user
  split-host install-service bundle/ --unit-dir unit/ --no-enable                          # write it, nothing else
  systemctl status splitedge-host; journalctl -u splitedge-host -f                          # then, as usual
"""


def service_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--unit-dir", type=Path, default=UNIT_DIR,
                        help=f"where to write NAME.service (default {UNIT_DIR})")
    parser.add_argument("--name", default=NAME, help=f"the unit's name (default {NAME})")
    parser.add_argument("--user", default=None,
                        help="run as this existing user (default: a dynamic user systemd makes for the service)")
    parser.add_argument("--dry-run", action="store_true", help="print the unit; write and enable nothing")
    parser.add_argument("--no-enable", action="store_true", help="write the unit; do not enable or start it")


@dataclass(frozen=True)
class ServiceOptions:
    """install-service's own flags, beside serve's (which become :class:`HostSettings`)."""

    unit_dir: Path
    name: str
    user: str | None
    dry_run: bool
    no_enable: bool

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServiceOptions:
        return cls(unit_dir=args.unit_dir, name=args.name, user=args.user, dry_run=args.dry_run,
                   no_enable=args.no_enable)


def _serve_argv(settings: HostSettings, defaults: HostSettings) -> list[str | Credential]:
    """The serve command line of ``settings``: every flag that differs from ``defaults``, paths
    absolute, secrets as credentials."""
    argv: list[str | Credential] = [sys.executable, "-m", "host_runtime.cli", "serve"]
    argv += [str(Path(b).resolve()) for b in settings.bundles]
    for name, flag, value in settings.flags(defaults):
        if value is None:
            argv.append(flag)
        elif name in SECRETS:
            argv += [flag, Credential(SECRETS[name], Path(value).resolve())]
        else:
            argv += [flag, str(Path(value).resolve()) if name in PATHS else value]
    return argv


def host_unit(settings: HostSettings, defaults: HostSettings, options: ServiceOptions) -> ServiceUnit:
    """The unit running serve with ``settings`` (``defaults``: a bare serve's, left out of its command
    line), after checking what serve would refuse at start: bundles, key file."""
    bundles = [Bundle.load(b, roles=(TAIL, FULL)) for b in settings.bundles]
    if settings.key_file:
        load_key(settings.key_file)  # refused now (unreadable, too short, readable by others), not at boot
    for path in (settings.tls_cert, settings.tls_key):
        if path and not Path(path).is_file():
            raise SplitEdgeError(f"{path}: no such file")
    served = ", ".join(b.id for b in bundles)
    return ServiceUnit(
        description=f"splitedge host: tails of {served}",
        argv=tuple(_serve_argv(settings, defaults)),
        user=options.user,
        read_paths=tuple(b.root.resolve() for b in bundles) + tuple(Path(p).resolve() for p in (settings.tls_cert,) if p),
        devices=settings.device != "cpu",  # a GPU's /dev/nvidia*
        bind_below_1024=0 < settings.port < 1024,
        header=f"Written by split-host install-service; write it again with the same command to change it.\n"
               f"Check: systemd-analyze verify {options.name}.service; systemd-analyze security {options.name}",
    )


def install_service(settings: HostSettings, defaults: HostSettings, options: ServiceOptions) -> int:
    try:
        text = host_unit(settings, defaults, options).render()
    except SplitEdgeError as exc:
        print(f"split-host: error: {exc}", file=sys.stderr)
        return 2
    if options.dry_run:
        print(text, end="")
        return 0
    try:
        path = write_unit(text, options.unit_dir, options.name)
    except SplitEdgeError as exc:
        print(f"split-host: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    if options.no_enable:
        return 0
    why = enable_unit(options.name)
    if why is not None:
        print(f"split-host: not enabled: {why}; where systemd runs: sudo systemctl daemon-reload && "
              f"sudo systemctl enable --now {options.name}", file=sys.stderr)
        return 1
    print(f"enabled and started {options.name}.service; systemctl status {options.name}")
    return 0
