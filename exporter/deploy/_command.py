"""``split-export deploy``: the command line over :class:`exporter.deploy.Fleet` (no torch)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from device_runtime.bundle import PRECISIONS
from exporter.deploy._remote_board import ServiceOptions
from exporter.deploy._card import deploy_card
from exporter.deploy._fleet import Fleet, FleetResult, parse_max_fail
from splitedge import Bounds, SplitEdgeError, as_flag_type

__all__ = ["DEPLOY_EXAMPLES", "add_deploy_command"]

DEPLOY_EXAMPLES = """\
examples:
  split-export deploy bundle/ --to pi@192.168.1.31                       # slice, upload, verify there, switch
  split-export deploy bundle/ --to pi@192.168.1.31 --to pi@192.168.1.32 --host 192.168.1.20:7767 --camera picam
  split-export deploy bundle/ --to pi1 --to pi2 --to pi3 --serial 1 --max-fail 34%   # Host aliases of ~/.ssh/config
  split-export deploy bundle/ --to pi@192.168.1.31 --formats tflite --precision int8 --keep 2
  split-export deploy bundle/ --to pi@192.168.1.31 --dry-run               # probe the boards, print the steps
  split-export deploy bundle/ --to pi@192.168.1.31 --service --camera picam  # and run it at boot (systemd)
  split-export deploy --rollback --to pi@192.168.1.31                    # current -> the release before
  sudo split-export deploy bundle/ --card /media/$USER/rootfs --user pi --service --host 192.168.1.20:7767
  split-export deploy bundle/ --to pi1 --to pi2 --json | jq '.boards[] | select(.ok | not)'   # for scripts

Each board: a board slice (heads, full model; no tails) goes to releases/.incoming-<id>/ under
its splitedge directory (rsync hard-links the files the release in use already has; tar over
ssh where the board has no rsync), is verified there by its own `split-device verify`, renamed
to releases/<id>/ and switched to by `split-device switch` (atomic; the last --keep releases
kept); --host/--camera/--set go into its ~/.config/splitedge/device.toml; --service then has
`sudo -n split-device install-service` write, enable and restart its systemd unit, which returns
once `run` has answered a frame, and watches it stay up. Anything failing puts the board back on
the release it had (its service restarted there) and says which board and why. ssh runs with your own
~/.ssh/config, keys, agent and known_hosts, in batch mode (it never asks for a password).
--card does the same into a mounted SD card's root file system (files owned by --user, the unit
enabled with systemctl --root), so the board starts the service on its first boot.
Exit status 0 when every board is on the new release, 1 otherwise; with --dry-run, 0 when every board
could take it, 1 when any would fail (each named with why). --json prints the outcome as
one JSON object on stdout at the end (each board's result, those not reached, why the rollout
stopped); the lines above go to stderr.
"""


# The bounds of deploy's numbers (splitedge._numbers), each maximum with why (issue 45).

#: Releases kept on each board: the board's own bound, as each board runs `split-device switch
#: --keep` with it (tests/test_numeric_flags.py holds them equal).
KEEP = Bounds(int, 1, 100, example="3")
#: Seconds the service must stay up on each board, a batch at a time: an hour.
HEALTH_SECONDS = Bounds(float, 0, 3600, "seconds", "5")
#: Boards deployed at once: each is ssh and rsync processes here, with their descriptors; past
#: 1024 (the default limit of open files) they fail for this machine's sake, not the boards'.
SERIAL = Bounds(int, 0, 1024, "a number of boards", "4", zero="all at once")
#: ssh's ConnectTimeout: an hour is past any link a board is reached over.
CONNECT_TIMEOUT = Bounds(int, 1, 3600, "seconds", "10")
#: --max-fail as a share of the boards (parse_max_fail also takes a percentage, 0% to 100%).
MAX_FAIL = Bounds(float, 0, 1, "a share of the boards", "0.25")


def add_deploy_command(commands: argparse._SubParsersAction) -> None:
    deploy = commands.add_parser(
        "deploy", help="deploy a bundle to boards over ssh: verified on the board, switched atomically (no torch)",
        epilog=DEPLOY_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    deploy.add_argument("bundle", nargs="?", type=Path, help="bundle directory (not needed with --rollback)")
    deploy.add_argument("--to", action="append", default=[], metavar="USER@BOARD",
                        help="a board as ssh names it: user@address, ssh://user@address:port or a Host of your "
                        "~/.ssh/config; repeatable")
    deploy.add_argument("--card", type=Path, default=None, metavar="ROOTFS",
                        help="instead of --to: the root file system of a board's SD card, mounted here "
                        "(e.g. /media/$USER/rootfs); run with sudo")
    deploy.add_argument("--user", default="pi", help="with --card: the board user whose releases these are "
                        "(default pi)")
    deploy.add_argument("--formats", default=None, metavar="onnx|tflite",
                        help="keep only these formats of heads and full model (default: every one)")
    deploy.add_argument("--precision", choices=PRECISIONS, default=None,
                        help="keep only this precision, float32 where an artifact has no other")
    deploy.add_argument("--host", default=None, metavar="auto|IP:PORT", help="the board's host setting (device.toml)")
    deploy.add_argument("--camera", default=None, help="the board's camera setting (device.toml), e.g. picam or 0")
    deploy.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="set_values",
                        help="any other device.toml setting (split-device config lists them); repeatable")
    deploy.add_argument("--service", action="store_true",
                        help="install the board's systemd unit (split-device install-service, through sudo -n), "
                        "restart it on the new release and wait until it answers a frame")
    deploy.add_argument("--health-seconds", type=as_flag_type(HEALTH_SECONDS), default=5.0, metavar="S",
                        help="with --service: how long the service must stay active afterwards (default 5)")
    deploy.add_argument("--keep", type=as_flag_type(KEEP), default=3, help="releases kept on each board (default 3)")
    deploy.add_argument("--serial", type=as_flag_type(SERIAL), default=None, metavar="N",
                        help="boards deployed at a time (default: all at once)")
    deploy.add_argument("--max-fail", type=_max_fail, default="0%", metavar="PERCENT",
                        help="stop before the next batch once more than this share of the boards failed "
                        "(default 0%%: the first failure stops the rollout)")
    deploy.add_argument("--ssh-config", type=Path, default=None, metavar="FILE",
                        help="an ssh config file instead of ~/.ssh/config (ssh -F)")
    deploy.add_argument("-o", "--ssh-option", action="append", default=[], dest="ssh_options", metavar="NAME=VALUE",
                        help="an ssh option (ssh -o), e.g. -o Port=2222; repeatable")
    deploy.add_argument("--connect-timeout", type=as_flag_type(CONNECT_TIMEOUT), default=10, metavar="S",
                        help="seconds to reach each board (default 10)")
    deploy.add_argument("--dry-run", action="store_true", help="probe the boards (read-only), print the steps")
    deploy.add_argument("--rollback", action="store_true", help="switch each board back to its previous release")
    deploy.add_argument("--json", action="store_true",
                        help="print the outcome as one JSON object on stdout at the end (the lines go to stderr)")
    deploy.set_defaults(run=run_deploy)


def _to_card(args: argparse.Namespace) -> int:
    if args.rollback or args.bundle is None:
        raise SplitEdgeError("--card takes a bundle to deploy (a rollback on a card: split-device rollback --root "
                             "ROOTFS/home/USER/.local/share/splitedge)")
    formats = tuple(f.strip() for f in args.formats.split(",")) if args.formats else None
    result = deploy_card(args.bundle, args.card, args.user, formats=formats, precision=args.precision,
                         settings=_settings(args), keep=args.keep, service=args.service)
    _say(args)(result.line())
    if args.json:
        print(json.dumps(_summary(FleetResult([result]), 1)))
    return 0 if result.ok else 1


def _say(args: argparse.Namespace) -> Callable[[str], None]:
    """Where the human lines go: stdout, or stderr where stdout holds ``--json``'s object."""
    return (lambda line: print(line, file=sys.stderr)) if args.json else print


def _summary(result: FleetResult, boards: int) -> dict[str, Any]:
    """The outcome ``--json`` prints: what the last line says, and each board's :class:`~exporter.deploy.BoardResult`."""
    done = sum(b.ok for b in result.boards)
    return {"ok": result.ok, "boards_given": boards, "done": done, "failed": len(result.boards) - done,
            "not_reached": list(result.skipped), "stopped": result.stopped,
            "boards": [asdict(b) for b in result.boards]}


def _max_fail(text: str) -> float:
    try:
        return parse_max_fail(text)
    except SplitEdgeError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_max_fail.bounds = MAX_FAIL  # type: ignore[attr-defined]


def _settings(args: argparse.Namespace) -> dict[str, str]:
    settings: dict[str, str] = {}
    for item in args.set_values:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise SplitEdgeError(f"--set {item!r}: expected KEY=VALUE, for example --set threads=2")
        settings[name.strip()] = value.strip()
    if args.host is not None:
        settings["host"] = args.host
    if args.camera is not None:
        settings["camera"] = args.camera
    return settings


def run_deploy(args: argparse.Namespace) -> int:
    if bool(args.to) == (args.card is not None):
        raise SplitEdgeError("give the boards with --to USER@BOARD (repeatable) or one SD card with --card ROOTFS")
    if args.card is not None:
        return _to_card(args)
    if args.rollback and args.bundle is not None:
        raise SplitEdgeError("--rollback takes no bundle (each board goes back one release)")
    if not args.rollback and args.bundle is None:
        raise SplitEdgeError("give the bundle to deploy (or --rollback)")
    formats = tuple(f.strip() for f in args.formats.split(",")) if args.formats else None
    service = ServiceOptions(health_s=args.health_seconds) if args.service else None
    say = _say(args)
    with Fleet(args.to, args.ssh_config, args.ssh_options, args.connect_timeout, say=say) as fleet:
        if args.rollback:
            result = fleet.rollback(args.serial, args.max_fail)
        elif args.dry_run:
            plan = fleet.plan(args.bundle, formats=formats, precision=args.precision, settings=_settings(args),
                              keep=args.keep, serial=args.serial, max_fail=args.max_fail, service=service)
            for line in plan.steps:
                say(line)
            if not plan.ok:  # each board's reason is its own line above
                say(f"{len(plan.would_fail)} of {len(args.to)} board(s) would fail: {', '.join(plan.would_fail)}")
            if args.json:
                print(json.dumps({"dry_run": True, "ok": plan.ok, "steps": plan.steps, "would_fail": plan.would_fail}))
            return 0 if plan.ok else 1  # a board the deploy would fail on fails the dry run too
        else:
            result = fleet.deploy(args.bundle, formats=formats, precision=args.precision, settings=_settings(args),
                                  keep=args.keep, serial=args.serial, max_fail=args.max_fail, service=service)
    failed = [b for b in result.boards if not b.ok]
    say(f"{len(result.boards) - len(failed)} of {len(args.to)} board(s) done"
        + (f", {len(failed)} failed" if failed else "") + (f", {len(result.skipped)} not reached"
                                                           if result.skipped else ""))
    if args.json:
        print(json.dumps(_summary(result, len(args.to))))
    return 0 if result.ok else 1
