"""``split-host install-service``: the host as a hardened systemd service, started at boot.

The unit runs ``split-host serve`` with the flags given to ``install-service`` (the same flags,
checked the same way), from this Python, on absolute paths; the key file and the TLS private
key reach the service as systemd credentials (``LoadCredential=``), so they can stay readable
by root alone. The unit is rendered by :class:`splitedge.units.ServiceUnit`, which the board's
unit shares, and enabled with ``systemctl enable --now`` where systemd runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from device_runtime import FULL, TAIL, Bundle
from device_runtime.wire import load_key
from splitedge import UNIT_DIR, Credential, ServiceUnit, SplitEdgeError, enable_unit, write_unit

__all__ = ["SERVICE_EXAMPLES", "install_service", "host_unit", "service_arguments"]

NAME = "splitedge-host"
#: install-service's own flags: not passed on to serve.
OWN = {"unit_dir", "name", "user", "dry_run", "no_enable", "command", "bundles"}
#: Secrets handed over as credentials: (dest, credential name).
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


def _serve_argv(
    args: argparse.Namespace, parser_factory: Callable[[], argparse.ArgumentParser],
) -> list[str | Credential]:
    """The serve command line of ``args``: every flag that differs from its default, paths absolute,
    secrets as credentials."""
    (subs,) = [a for a in parser_factory()._actions if isinstance(a, argparse._SubParsersAction)]
    argv: list[str | Credential] = [sys.executable, "-m", "host_runtime.cli", "serve"]
    argv += [str(Path(b).resolve()) for b in args.bundles]
    for action in subs.choices["serve"]._actions:
        if not action.option_strings or action.dest in OWN or action.dest == "help":
            continue
        value = getattr(args, action.dest)
        if value == action.default:
            continue
        flag = action.option_strings[-1]
        if isinstance(action, argparse._StoreTrueAction):
            argv.append(flag)
        elif action.dest in SECRETS:
            argv += [flag, Credential(SECRETS[action.dest], Path(value).resolve())]
        else:
            argv += [flag, str(Path(value).resolve()) if action.dest in PATHS else str(value)]
    return argv


def host_unit(args: argparse.Namespace, parser_factory: Callable[[], argparse.ArgumentParser]) -> ServiceUnit:
    """The unit of ``args``, after checking what serve would refuse at start: bundles, key file."""
    bundles = [Bundle.load(b, roles=(TAIL, FULL)) for b in args.bundles]
    if args.key_file:
        load_key(args.key_file)  # refused now (unreadable, too short, readable by others), not at boot
    for path in (args.tls_cert, args.tls_key):
        if path and not Path(path).is_file():
            raise SplitEdgeError(f"{path}: no such file")
    served = ", ".join(b.id for b in bundles)
    return ServiceUnit(
        description=f"splitedge host: tails of {served}",
        argv=tuple(_serve_argv(args, parser_factory)),
        user=args.user,
        read_paths=tuple(b.root.resolve() for b in bundles) + tuple(Path(p).resolve() for p in (args.tls_cert,) if p),
        devices=args.device != "cpu",  # a GPU's /dev/nvidia*
        bind_below_1024=0 < args.port < 1024,
        header=f"Written by split-host install-service; write it again with the same command to change it.\n"
               f"Check: systemd-analyze verify {args.name}.service; systemd-analyze security {args.name}",
    )


def install_service(args: argparse.Namespace, parser_factory: Callable[[], argparse.ArgumentParser]) -> int:
    try:
        text = host_unit(args, parser_factory).render()
    except SplitEdgeError as exc:
        print(f"split-host: error: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(text, end="")
        return 0
    try:
        path = write_unit(text, args.unit_dir, args.name)
    except SplitEdgeError as exc:
        print(f"split-host: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    if args.no_enable:
        return 0
    why = enable_unit(args.name)
    if why is not None:
        print(f"split-host: not enabled: {why}; where systemd runs: sudo systemctl daemon-reload && "
              f"sudo systemctl enable --now {args.name}", file=sys.stderr)
        return 1
    print(f"enabled and started {args.name}.service; systemctl status {args.name}")
    return 0
