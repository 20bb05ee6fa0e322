"""``split-device install-service``: ``split-device run`` on the release in use, as a hardened systemd service.

The unit runs ``run <root>/current`` from this Python as the board's user (who owns the
releases and whose ``~/.config/splitedge/device.toml`` holds the host, the camera and the rest:
systemd sets ``HOME`` for ``User=``), in the camera's group, with /dev visible (the camera) and
the releases directory writable (``calibration.json``, ``last-run.json``); the rest is the
hardening every splitedge unit has (:class:`splitedge.units.ServiceUnit`). It is ``Type=notify``:
``run`` says ``READY=1`` once it has answered a frame, so ``systemctl restart`` returns when the
new release really works and fails when it never does — what a deploy waits on.
"""

from __future__ import annotations

import argparse
import grp
import os
import pwd
import sys
from pathlib import Path

from device_runtime.board._release import CURRENT
from device_runtime.board.run_settings import START_TIMEOUT
from device_runtime.board._settings import load_settings, run_checker
from device_runtime.board._status import SERVICE
from splitedge import SplitEdgeError, as_flag_type
from splitedge.units import ServiceUnit, UNIT_DIR, enable_unit, write_unit

__all__ = ["SERVICE_EXAMPLES", "add_service_command", "device_unit", "install_service"]

CAMERA_GROUP = "video"  # /dev/video*, /dev/media*: the Pi camera through libcamera, USB cameras
START_TIMEOUT_S = 180  # loading a model and a first frame on a Pi Zero 2 W

SERVICE_EXAMPLES = """\
examples:
  split-device install-service --dry-run                 # print the unit for this user's releases
  sudo split-device install-service --user pi            # write, enable, (re)start; returns once it answers
  sudo split-device install-service --user pi --root /home/pi/.local/share/splitedge --no-enable
  systemctl status splitedge-device; journalctl -u splitedge-device -f   # then, as usual
"""


def add_service_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "install-service", help="run split-device run on the release in use at boot, as a hardened systemd unit",
        epilog=SERVICE_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--user", default=None,
                        help="the user the service runs as, who owns the releases (default: who ran sudo, else you)")
    parser.add_argument("--root", type=Path, default=None,
                        help="the releases directory (default: the user's ~/.local/share/splitedge)")
    parser.add_argument("--unit-dir", type=Path, default=UNIT_DIR, help=f"where to write NAME.service (default {UNIT_DIR})")
    parser.add_argument("--name", default=SERVICE, help=f"the unit's name (default {SERVICE})")
    parser.add_argument("--start-timeout", type=as_flag_type(START_TIMEOUT), default=START_TIMEOUT_S, metavar="S",
                        help=f"seconds the first answer may take before systemd gives up, at most "
                        f"{START_TIMEOUT.high:g} (default {START_TIMEOUT_S})")
    parser.add_argument("--dry-run", action="store_true", help="print the unit; write and enable nothing")
    parser.add_argument("--no-enable", action="store_true", help="write the unit; do not enable or start it")


def _user(name: str | None) -> pwd.struct_passwd:
    name = name or os.environ.get("SUDO_USER") or pwd.getpwuid(os.getuid()).pw_name
    try:
        return pwd.getpwnam(name)
    except KeyError:
        raise SplitEdgeError(f"no user {name!r} on this board: give --user an existing one (the one that "
                             "owns the releases)") from None


def device_unit(python: str, root: Path, user: str, groups: tuple[str, ...], start_timeout_s: int) -> ServiceUnit:
    return ServiceUnit(
        description=f"splitedge board: split-device run on {root / CURRENT}",
        argv=(python, "-m", "device_runtime.cli", "run", str(root / CURRENT)),
        user=user,
        groups=groups,
        read_paths=(Path(python),),
        write_paths=(root,),
        devices=True,
        notify=True,
        start_timeout_s=start_timeout_s,
        header=f"Written by split-device install-service (split-export deploy --service runs it); write it again "
               f"with the same command to change it.\nCheck: systemd-analyze verify {SERVICE}.service",
    )


def install_service(args: argparse.Namespace) -> int:
    user = _user(args.user)
    root = (args.root or Path(user.pw_dir) / ".local" / "share" / "splitedge").absolute()
    groups = tuple(g for g in (CAMERA_GROUP,) if _group_exists(g))
    # The unit runs `split-device run` with the settings files the user's run reads: a file that
    # would stop it is refused now, in one line naming it, not at the board's next boot.
    dirs = {k: os.environ[k] for k in ("SPLITEDGE_CONFIG_DIRS",) if k in os.environ}
    load_settings(run_checker(), {"HOME": user.pw_dir, **dirs})
    unit = device_unit(sys.executable, root, user.pw_name, groups, args.start_timeout).render()
    if args.dry_run:
        print(unit, end="")
        return 0
    print(f"wrote {write_unit(unit, args.unit_dir, args.name)}")
    if args.no_enable:
        return 0
    why = enable_unit(args.name, restart=True)
    if why is not None:
        print(f"split-device: not running: {why}", file=sys.stderr)
        return 1
    print(f"enabled and started {args.name}.service: it answered a frame; systemctl status {args.name}")
    return 0


def _group_exists(name: str) -> bool:
    try:
        grp.getgrnam(name)
        return True
    except KeyError:
        return False
