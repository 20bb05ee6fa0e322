"""A deploy into a board's SD card, mounted here: the same release layout, no network.

``--card /media/USER/rootfs --user pi`` writes what a deploy over ssh would leave on the board
into the card's root file system: the board slice under the user's
``~/.local/share/splitedge/releases/<id>/`` with ``current`` switched by the same atomic rename
(:class:`device_runtime.board.Layout`; its links are relative, so they hold on the board), the
settings in the user's ``~/.config/splitedge/device.toml``, every file owned by that user (their
uid on the card, from the card's ``/etc/passwd``), and with ``--service`` the board's unit in the
card's ``/etc/systemd/system``, enabled by ``systemctl --root`` so the board starts it at first
boot. The files are verified here, by the same code the board runs; the card's Python is the
board's and cannot run here.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from device_runtime.board import SERVICE, Layout, write_settings
from device_runtime import slice_bundle
from device_runtime.bundle import BOARD_PART
from device_runtime.board import CAMERA_GROUP, START_TIMEOUT_S, device_unit, run_checker
from exporter.deploy._remote_board import BoardResult
from splitedge import SplitEdgeError
from splitedge.errors import DeployError
from splitedge.units import enable_offline, write_unit

__all__ = ["CardUser", "card_user", "deploy_card"]

VENV = "splitedge"  # ~/splitedge: where the README installs splitedge on a board


@dataclass(frozen=True)
class CardUser:
    name: str
    uid: int
    gid: int
    home: str  # as the board sees it: /home/pi

    def on(self, card: Path) -> Path:
        return card / self.home.lstrip("/")


def _entries(path: Path) -> list[list[str]]:
    return [line.split(":") for line in path.read_text().splitlines() if line and not line.startswith("#")]


def card_user(card: Path, name: str) -> CardUser:
    """``name`` as the card's /etc/passwd has it; refuse a path that is not a root file system."""
    missing = [p for p in ("etc/os-release", "etc/passwd", "usr") if not (card / p).exists()]
    if missing:
        raise DeployError(str(card), f"not a root file system (no {', '.join(missing)}): give the card's rootfs "
                          "partition, such as /media/$USER/rootfs, not bootfs")
    for entry in _entries(card / "etc" / "passwd"):
        if len(entry) >= 6 and entry[0] == name:
            return CardUser(name, int(entry[2]), int(entry[3]), entry[5])
    raise DeployError(str(card), f"no user {name!r} on the card: Raspberry Pi OS makes the first user at first "
                      "boot from the Imager's settings; boot it once, or give --user an existing one")


def _group_on(card: Path, name: str) -> bool:
    return any(entry[0] == name for entry in _entries(card / "etc" / "group")) \
        if (card / "etc" / "group").is_file() else False


def _exists_on(card: Path, path: str, hops: int = 40) -> bool:
    """Whether ``path`` exists as the board will see it: symlinks followed inside the card (an absolute
    link such as ``~/splitedge -> /opt/splitedge`` means the card's /opt, not this machine's)."""
    parts = [p for p in path.split("/") if p]
    here = card
    while parts:
        name = parts.pop(0)
        nxt = here / name
        if nxt.is_symlink():
            hops -= 1
            if hops < 0:
                return False
            target = os.readlink(nxt)
            parts = [p for p in target.split("/") if p] + parts
            here = card if target.startswith("/") else here
            continue
        if not nxt.exists():
            return False
        here = nxt
    return True


def _chown_tree(path: Path, user: CardUser) -> None:
    for item in [path, *path.rglob("*")]:
        os.chown(item, user.uid, user.gid, follow_symlinks=False)


def _own_dirs(top: Path, leaf: Path, user: CardUser) -> None:
    """Create ``leaf`` (under ``top``, the user's home) with every directory between owned by the user."""
    leaf.mkdir(parents=True, exist_ok=True)
    for directory in [leaf, *leaf.parents]:
        if directory == top or top not in directory.parents:
            break
        os.chown(directory, user.uid, user.gid)


def deploy_card(
    bundle: Path, card: Path, user_name: str, *, formats: Sequence[str] | None = None, precision: str | None = None,
    settings: Mapping[str, str] | None = None, keep: int = 3, service: bool = False,
) -> BoardResult:
    """Deploy ``bundle`` into the root file system mounted at ``card``; a failure leaves ``current`` as it was."""
    result = BoardResult(board=str(card))
    try:
        user = card_user(card, user_name)
        if os.geteuid() not in (0, user.uid):
            raise DeployError(str(card), f"its files must belong to {user.name} (uid {user.uid} on the card): "
                              "run with sudo")
        home = user.on(card)
        if not home.is_dir():
            raise DeployError(str(card), f"{user.name}'s home {user.home} is not on the card: boot the board once "
                              "so that it is made, or give --user an existing one")
        root = home / ".local" / "share" / "splitedge"
        python = f"{user.home}/{VENV}/bin/python"
        if service and not _exists_on(card, python):
            raise DeployError(str(card), f"--service runs {python}, which is not on the card: install splitedge "
                              f"there first (README: On a board), or leave out --service")
        layout = Layout(root)
        _own_dirs(home, layout.releases, user)
        result.before = result.current = layout.current_id()
        staging = Path(tempfile.mkdtemp(prefix=".incoming-", dir=layout.releases))
        try:
            sliced = slice_bundle(bundle, staging / "slice", BOARD_PART, formats=formats, precision=precision)
            release = sliced.manifest.bundle_id
            result.sent_bytes, result.method = sliced.bytes, "copy to the card"
            if not (layout.release(release) / "manifest.json").is_file():
                _chown_tree(sliced.out, user)
                sliced.out.rename(layout.release(release))
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        layout.switch(release)
        layout.prune(keep)
        for link in (layout.current, layout.previous):
            if link.is_symlink():
                os.chown(link, user.uid, user.gid, follow_symlinks=False)
        result.current = release
        try:
            if settings:
                config = home / ".config" / "splitedge" / "device.toml"
                _own_dirs(home, config.parent, user)
                write_settings(config, dict(settings), run_checker())
                os.chown(config, user.uid, user.gid)
            if service:
                groups = (CAMERA_GROUP,) if _group_on(card, CAMERA_GROUP) else ()
                unit = device_unit(python, Path(user.home) / ".local" / "share" / "splitedge", user.name, groups,
                                   START_TIMEOUT_S)
                write_unit(unit.render(), card / "etc" / "systemd" / "system", SERVICE)
                why = enable_offline(card, SERVICE)
                if why is not None:
                    raise DeployError(str(card), why)
        except SplitEdgeError as exc:
            if result.before is not None:
                layout.switch(result.before)
                result.rolled_back = True
            else:
                layout.current.unlink()  # as before: nothing deployed
            result.current = result.before
            raise DeployError(str(card), exc.reason if isinstance(exc, DeployError) else str(exc)) from exc
        result.ok = True
    except DeployError as exc:
        result.error = exc.reason
    except SplitEdgeError as exc:
        result.error = str(exc)
    return result
