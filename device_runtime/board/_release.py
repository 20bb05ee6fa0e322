"""The board's directory layout, defined once: releases, the ``current`` link, the update lock.

::

    <root>/                       SPLITEDGE_ROOT, else $XDG_DATA_HOME/splitedge (~/.local/share/splitedge)
      releases/<bundle_id>/       a board slice of a bundle (its own bundle_id), calibration.json, last-run.json
      current -> releases/<id>    what split-device runs; switched by an atomic rename, never ln -sf
      previous -> releases/<id>   what current pointed at before the last switch: a rollback goes back to it
      updates.lock                held (flock, shared) by a field trial that must not see a switch

A switch makes a temporary symlink beside ``current`` and renames it over ``current``
(``rename(2)`` replaces the name in one step: a board that loses power has the old link or the
new one, never none). It takes the update lock exclusively without waiting: while a field
trial holds it (``flock -s updates.lock COMMAND``, or :meth:`Layout.hold_updates`), the switch
is deferred with :class:`UpdateDeferred`. Mender and Capistrano-style deploys keep releases the
same way; balena's ``updates.lock`` is the lock.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from device_runtime.bundle import MANIFEST_NAME, Manifest, artifact_path, artifacts_of, check_name, verify_files
from splitedge import SplitEdgeError
from splitedge.errors import BundleError
from splitedge.lifecycle import signals_held

__all__ = ["DEFAULT_KEEP", "Layout", "UpdateDeferred", "default_root"]

RELEASES, CURRENT, PREVIOUS, LOCK = "releases", "current", "previous", "updates.lock"
DEFAULT_KEEP = 3  # current, the one before it (rollback), and one more
_TEMP_PREFIX = ".current."


class UpdateDeferred(SplitEdgeError):
    """A field trial holds the update lock: the switch did not happen and may be tried again later."""


def default_root(environ: dict[str, str] | None = None) -> Path:
    """Where the board keeps its releases: ``SPLITEDGE_ROOT``, else the XDG data directory."""
    env = os.environ if environ is None else environ
    if env.get("SPLITEDGE_ROOT"):
        return Path(env["SPLITEDGE_ROOT"])
    data = env.get("XDG_DATA_HOME") or str(Path(env.get("HOME") or Path.home()) / ".local" / "share")
    return Path(data) / "splitedge"


def _link_target(link: Path) -> str | None:
    try:
        return Path(os.readlink(link)).name
    except OSError:  # absent, or not a link
        return None


def _replace_link(link: Path, target: Path, temp: Path) -> None:
    """Point ``link`` at ``target`` in one step: a new link under ``temp``, renamed over ``link``."""
    if temp.is_symlink():
        temp.unlink()
    os.symlink(target, temp)
    os.replace(temp, link)


def _fsync_dir(path: Path) -> None:
    """Make a rename or a new name in ``path`` durable (a power cut after it keeps it)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*"), reverse=True):  # files before the directories that name them
        if path.is_file() and not path.is_symlink():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
        elif path.is_dir():
            _fsync_dir(path)
    _fsync_dir(root)


def _not_plain(directory: str, names: list[str]) -> set[str]:
    """What a release never copies: links (followed, one could read a file outside the bundle) and
    FIFOs, devices and sockets (opened, one could wait for ever)."""
    return {name for name in names if not (stat.S_ISREG(mode := os.lstat(os.path.join(directory, name)).st_mode)
                                           or stat.S_ISDIR(mode))}


def _copy_plain(bundle: Path, manifest: Manifest, staging: Path) -> None:
    """Copy a verified bundle's plain files and directories to ``staging``; an artifact that is a link
    inside the bundle (:func:`artifact_path` allows those) arrives as the file it names."""
    shutil.copytree(bundle, staging, ignore=_not_plain, dirs_exist_ok=True)
    for artifact in [*manifest.full, *(a for s in manifest.splits for a in artifacts_of(s))]:
        if (bundle / artifact.path).is_symlink():
            shutil.copyfile(artifact_path(bundle, artifact).resolve(), staging / artifact.path)


@dataclass(frozen=True)
class Layout:
    root: Path

    @property
    def releases(self) -> Path:
        return self.root / RELEASES

    @property
    def current(self) -> Path:
        return self.root / CURRENT

    @property
    def previous(self) -> Path:
        return self.root / PREVIOUS

    @property
    def lock_path(self) -> Path:
        return self.root / LOCK

    def release(self, bundle_id: str) -> Path:
        """``releases/<bundle_id>``: the one place a release's directory is named, on the board and by a
        deploy for it; an id that is not a safe name (:func:`check_name`) could name one outside ``releases/``."""
        return self.releases / check_name(bundle_id, "bundle id", "give an id that split-device status lists")

    def incoming(self, bundle_id: str) -> Path:
        """``releases/.incoming-<bundle_id>``: where a deploy uploads a release before the board verifies
        it and renames it to :meth:`release` (hidden: :meth:`installed` never lists it)."""
        return self.releases / f".incoming-{self.release(bundle_id).name}"

    def current_id(self) -> str | None:
        """The release ``current`` points at, or None where there is no link (nothing deployed)."""
        return _link_target(self.current)

    def installed(self) -> list[str]:
        """Release ids, most recently switched to or installed first."""
        if not self.releases.is_dir():
            return []
        found = [p for p in self.releases.iterdir() if p.is_dir() and not p.name.startswith(".")]
        return [p.name for p in sorted(found, key=lambda p: p.stat().st_mtime_ns, reverse=True)]

    def previous_id(self) -> str | None:
        """The release a rollback goes back to: what ``current`` pointed at before the last switch."""
        previous = _link_target(self.previous)
        return previous if previous != self.current_id() and (self.releases / str(previous)).is_dir() else None

    def install(self, bundle: str | Path) -> str:
        """Copy the bundle at ``bundle`` to ``releases/<its bundle_id>/`` (a staging directory renamed
        into place, verified first) and return the id; an id already there is kept as it is."""
        manifest, problems = verify_files(bundle)
        if problems or manifest is None:
            raise BundleError("; ".join(problems))
        target = self.release(manifest.bundle_id)
        if (target / MANIFEST_NAME).is_file():
            return manifest.bundle_id
        self.releases.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{manifest.bundle_id}.", dir=self.releases))
        try:
            _copy_plain(Path(bundle), manifest, staging)
            _, problems = verify_files(staging)
            if problems:
                raise BundleError("; ".join(problems))
            staging.chmod(0o755)
            staging.rename(target)
            _fsync_dir(self.releases)
        except BaseException:
            with signals_held():  # a second Ctrl-C must not leave half of it
                shutil.rmtree(staging, ignore_errors=True)
            raise
        return manifest.bundle_id

    @contextmanager
    def hold_updates(self) -> Iterator[None]:
        """Hold the update lock (shared: several trials may) for the duration: switches are deferred."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_SH)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    @contextmanager
    def _update_lock(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "a") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise UpdateDeferred(
                    f"{self.lock_path} is held (a field trial is running): the switch is deferred; "
                    "try again when it ends"
                ) from None
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def switch_steps(self, bundle_id: str) -> list[tuple[str, Callable[[], None]]]:
        """The switch as named steps, each safe to be the last one run (see tests: killed after each)."""
        target = self.release(bundle_id)
        temp = self.root / f"{_TEMP_PREFIX}{os.getpid()}"

        def check() -> None:
            _, problems = verify_files(target)
            if problems:
                raise BundleError(f"release {bundle_id} is not whole, current left as it is: " + "; ".join(problems))
            # On disk before current names it: after a power cut, a file the page cache held is empty.
            _fsync_tree(target)
            self._remove_stale_temps()

        def remember() -> None:
            before = self.current_id()
            if before is not None and before != bundle_id:
                _replace_link(self.previous, Path(RELEASES) / before, temp)

        def link() -> None:
            if temp.is_symlink():
                temp.unlink()
            os.symlink(Path(RELEASES) / bundle_id, temp)  # relative: the tree may be mounted elsewhere (a card)

        def rename() -> None:
            os.replace(temp, self.current)

        def sync() -> None:
            _fsync_dir(self.root)
            os.utime(target)  # the latest switched to: previous_id and prune order by this

        return [("check", check), ("remember", remember), ("link", link), ("rename", rename), ("sync", sync)]

    def switch(self, bundle_id: str) -> str | None:
        """Point ``current`` at ``releases/<bundle_id>`` (verified first); returns the id it pointed at."""
        before = self.current_id()
        with self._update_lock():
            for _, step in self.switch_steps(bundle_id):
                step()
        return before

    def rollback(self) -> str:
        """Switch back to :meth:`previous_id`; returns the id now current."""
        previous = self.previous_id()
        if previous is None:
            raise BundleError(f"{self.releases}: no release to roll back to besides the current one")
        self.switch(previous)
        return previous

    def prune(self, keep: int = DEFAULT_KEEP) -> list[str]:
        """Remove all but the ``keep`` latest releases (never the current one); returns the ids removed."""
        pinned = {r for r in (self.current_id(), self.previous_id()) if r is not None}
        others = [r for r in self.installed() if r not in pinned]
        kept = others[: max(keep - len(pinned), 0)]
        removed = [r for r in others if r not in kept]
        for release in removed:
            shutil.rmtree(self.release(release))
        return removed

    def _remove_stale_temps(self) -> None:
        """Temporary links left by a switch that was killed before its rename."""
        for stale in self.root.glob(f"{_TEMP_PREFIX}*"):
            if stale.is_symlink():
                stale.unlink()
