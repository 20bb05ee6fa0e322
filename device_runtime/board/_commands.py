"""``split-device verify``, ``status``, ``config``, ``switch`` and ``rollback``: what a script or a deploy asks a board.

Each handler returns the exit status: verify 0 when every file matches its manifest, 1 when
any does not; status 0 when a whole release is current, 1 otherwise; config 0; switch and
rollback 0 when ``current`` moved, 1 when the release is not whole (``current`` untouched),
3 when a field trial holds the update lock (deferred: try again later).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path

from device_runtime.board._release import DEFAULT_KEEP, Layout, UpdateDeferred, default_root
from device_runtime.board.run_settings import KEEP
from device_runtime.board._settings import (
    apply_settings,
    run_checker,
    config_files,
    describe,
    load_settings,
    run_defaults,
    write_settings,
)
from device_runtime.board._status import board_status, check_root, format_status, status_exit_code, verify_report
from splitedge import as_flag_type
from splitedge.errors import BundleError, ConfigError

__all__ = ["ADMIN_EXAMPLES", "add_commands", "handler", "settings_for"]

ADMIN_EXAMPLES = """\
examples:
  split-device verify bundle/                      # every file against the manifest: exit 0, or 1 and a line a problem
  split-device verify ~/.local/share/splitedge/current --json   # the same, for scripts and deploys
  split-device status                              # the release in use, the service, the last run
  split-device status --root /home/pi/.local/share/splitedge --json
  split-device config                              # each setting in force and where it came from
  SPLITEDGE_HOST=192.168.1.20:7767 split-device config --json
  split-device config --set host=192.168.1.20:7767 --set camera=0   # into ~/.config/splitedge/device.toml
  split-device config --unset camera --file /etc/splitedge/device.toml
  split-device switch mobilenet_v2-25fa3af00dc9    # current -> releases/<id>, verified first; keeps the last 3
  split-device rollback                            # current -> the release before the last switch
"""
DEFERRED = 3  # exit status of a switch a field trial's updates.lock deferred


def add_commands(commands: argparse._SubParsersAction) -> None:
    common = {"epilog": ADMIN_EXAMPLES, "formatter_class": argparse.RawDescriptionHelpFormatter}
    verify = commands.add_parser("verify", help="check every file of a bundle against its manifest", **common)
    verify.add_argument("bundle", help="bundle directory (a release, or current)")
    verify.add_argument("--json", action="store_true", help="print one JSON object instead of text")

    status = commands.add_parser("status", help="the release in use, the service state, the last run", **common)
    _root_argument(status)
    status.add_argument("--json", action="store_true", help="print one JSON object instead of text")

    config = commands.add_parser(
        "config", help="print the settings in force (device.toml files, environment) and where each came from",
        **common,
    )
    config.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    config.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="set_values",
                        help="write KEY (checked as its flag checks it) into --file, keeping the file's other "
                        "keys; a list key takes commas (interface=wlan0,eth0); repeatable")
    config.add_argument("--unset", action="append", default=[], metavar="KEY", help="remove KEY from --file; repeatable")
    config.add_argument("--file", type=Path, default=None,
                        help="the file --set and --unset change (default: the user's, ~/.config/splitedge/device.toml)")

    switch = commands.add_parser(
        "switch", help="point current at an installed release (verified first; atomic), keep the latest few", **common,
    )
    switch.add_argument("release", metavar="BUNDLE_ID", help="a directory under releases/ (a board slice's bundle_id)")
    _root_argument(switch)
    switch.add_argument("--keep", type=as_flag_type(KEEP), default=DEFAULT_KEEP,
                        help=f"releases kept, current and previous included, at most {KEEP.high:g} (default {DEFAULT_KEEP})")
    rollback = commands.add_parser("rollback", help="point current back at the release before the last switch",
                                   **common)
    _root_argument(rollback)


def _root_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--root", type=Path, default=None,
                        help="the board's splitedge directory (default: $SPLITEDGE_ROOT, else "
                        "~/.local/share/splitedge)")


def _layout(args: argparse.Namespace) -> Layout:
    root = args.root if args.root is not None else default_root()
    check_root(root)
    return Layout(root)


def switch(args: argparse.Namespace) -> int:
    layout = _layout(args)
    if args.release == layout.current_id():
        before: str | None = args.release
    else:
        before, status = _move(lambda: layout.switch(args.release))
        if status:
            return status
    removed = layout.prune(args.keep)
    print(f"current: {args.release} (was {before or 'none'})"
          + (f"; removed {', '.join(removed)}" if removed else ""))
    return 0


def rollback(args: argparse.Namespace) -> int:
    layout = _layout(args)
    before = layout.current_id()
    now, status = _move(layout.rollback)
    if not status:
        print(f"current: {now} (was {before})")
    return status


def _move(step: Callable[[], str | None]) -> tuple[str | None, int]:
    """Run a switch of ``current``: its result and 0, or None and the exit status it failed with."""
    try:
        return step(), 0
    except UpdateDeferred as exc:
        print(f"split-device: deferred: {exc}")
        return None, DEFERRED
    except BundleError as exc:
        print(f"split-device: {exc}")
        return None, 1


def verify(args: argparse.Namespace) -> int:
    report = verify_report(args.bundle)
    if args.json:
        print(json.dumps(report, indent=2))
    elif report["ok"]:
        print(f"bundle {report['bundle_id']} at {args.bundle}: {report['files']} files match the manifest")
    else:
        for problem in report["problems"]:
            print(problem)
    return 0 if report["ok"] else 1


def status(args: argparse.Namespace) -> int:
    found = board_status(_layout(args).root)
    print(json.dumps(found, indent=2) if args.json else format_status(found))
    return status_exit_code(found)


def config_command(args: argparse.Namespace, parser_factory: Callable[[], argparse.ArgumentParser]) -> int:
    parser = parser_factory()
    if args.set_values or args.unset:
        return _change_config(args, run_checker())
    settings = load_settings(run_checker())
    rows = describe(settings, run_defaults(parser))
    if args.json:
        print(json.dumps({
            "settings": {name: {"value": value, "source": source} for name, value, source in rows},
            "files_read": [str(p) for p in settings.files_read],
            "files_absent": [str(p) for p in settings.files_absent],
        }, indent=2))
        return 0
    width = max(len(name) for name, _, _ in rows)
    for name, value, source in rows:
        shown = ",".join(map(str, value)) if isinstance(value, list) else value
        print(f"{name:<{width}}  {shown!s:<24}  {source}")
    print(f"files read: {', '.join(map(str, settings.files_read)) or 'none'}; "
          f"absent: {', '.join(map(str, settings.files_absent)) or 'none'}")
    print("flags given to run or calibrate override all of these")
    return 0


def _change_config(args: argparse.Namespace, check: Callable) -> int:
    updates: dict[str, str | None] = {}
    for item in args.set_values:
        name, sep, text = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, for example --set host=192.168.1.20:7767")
        updates[name.strip()] = text.strip()
    updates.update({name: None for name in args.unset})
    path = args.file if args.file is not None else config_files()[-1]
    changes = write_settings(path, updates, check)
    for name, (before, after) in changes.items():
        print(f"{path}: {name} = {after!r} (was {before!r})" if after is not None else f"{path}: {name} removed")
    if not changes:
        print(f"{path}: unchanged")
    return 0


def handler(
    command: str, parser_factory: Callable[[], argparse.ArgumentParser],
) -> Callable[[argparse.Namespace], int] | None:
    """The handler of an admin command, or None for the others."""
    return {
        "verify": verify, "status": status, "switch": switch, "rollback": rollback,
        "config": lambda args: config_command(args, parser_factory),
    }.get(command)


def settings_for(args: argparse.Namespace, argv: Sequence[str],
                 parser_factory: Callable[[], argparse.ArgumentParser]) -> None:
    """Fill ``run``'s and ``calibrate``'s unset flags from device.toml and the environment."""
    if args.command in ("run", "calibrate"):
        apply_settings(args, argv, parser_factory)
