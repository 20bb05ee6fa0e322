"""One board's deploy as named steps, each undone if a later one fails: the board keeps a working release.

The board does the checking itself, with its own ``split-device`` (the same code that will
run the release): ``verify`` checks every sha256 where the files landed, ``switch`` renames
``current`` in one step under the update lock a field trial can hold, ``config --set`` writes
its settings. The workstation only slices, uploads and asks. Steps::

    probe      where split-device, Python, rsync, the releases and the free space are
    upload     releases/.incoming-<id>/ (rsync hard-links what the release in use already has)
    verify     split-device verify on the board; a bad upload is removed, current untouched
    install    rename .incoming-<id> to releases/<id>
    switch     split-device switch <id> --keep N (atomic; deferred while updates.lock is held)
    configure  split-device config --set KEY=VALUE (the old file kept to put back)
    service    (with --service) sudo split-device install-service: the unit written, enabled and
               restarted; systemd returns once ``run`` has answered a frame (``Type=notify``)
    health     (with --service) the service stays active for the health period

A failure after ``switch`` switches back to the release that was current, puts the old
settings file back and restarts the service on that release; a failure before it leaves
``current`` as it was.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from device_runtime import Manifest
from device_runtime.board import SERVICE, Layout
from exporter.deploy._remote import Remote, UploadStats
from splitedge.errors import DeployError

__all__ = ["NO_SUDO", "BoardFacts", "BoardResult", "Release", "ServiceOptions", "board_steps", "deploy_board",
           "elevation", "probe", "rollback_board"]

MIN_PYTHON = (3, 10)
DEFERRED = 3  # split-device switch's exit status while a field trial holds updates.lock
INSTALL_HINT = ("install it there: python3 -m venv --system-site-packages ~/splitedge && "
                "~/splitedge/bin/pip install 'splitedge[device,tflite,camera]'")

# POSIX sh, read-only: what the board has and where. One "name=value" per line.
PROBE = r"""
sd=""
for c in "${SPLITEDGE_DEVICE:-}" "$(command -v split-device 2>/dev/null)" "$HOME/splitedge/bin/split-device" \
         "$HOME/.local/bin/split-device"; do
  if [ -n "$c" ] && [ -x "$c" ]; then sd=$c; break; fi
done
echo "split_device=$sd"
py=""
if [ -n "$sd" ]; then py=$(sed -n '1s/^#![[:space:]]*\([^[:space:]]*\).*/\1/p' "$sd"); fi
if [ -z "$py" ] || [ ! -x "$py" ]; then py=$(command -v python3 2>/dev/null); fi
echo "python=$py"
if [ -n "$py" ]; then echo "python_version=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)"; fi
echo "rsync=$(command -v rsync 2>/dev/null)"
root="${SPLITEDGE_ROOT:-${XDG_DATA_HOME:-$HOME/.local/share}/splitedge}"
echo "root=$root"
cur=$(readlink "$root/current" 2>/dev/null); echo "current=${cur##*/}"
d="$root"; while [ ! -d "$d" ]; do d=$(dirname "$d"); done
echo "free_kb=$(df -Pk "$d" | awk 'NR==2 {print $4}')"
echo "config=${XDG_CONFIG_HOME:-$HOME/.config}/splitedge/device.toml"
echo "user=$(id -un)"
echo "sudo=$(command -v sudo 2>/dev/null)"
"""


@dataclass(frozen=True)
class BoardFacts:
    """What :data:`PROBE` found on a board."""

    split_device: str
    python_version: tuple[int, int] | None
    rsync: bool
    root: str
    current: str | None
    free_bytes: int
    config: str
    user: str = ""
    sudo: bool = False

    @property
    def layout(self) -> Layout:
        """The board's releases as the board names them: a release's directory is named in one place."""
        return Layout(Path(self.root))

    @property
    def releases(self) -> str:
        return str(self.layout.releases)


@dataclass(frozen=True)
class ServiceOptions:
    """``--service``: install and restart the board's unit, then watch it for ``health_s`` seconds."""

    health_s: float = 5.0
    poll_s: float = 0.5
    sleep: Callable[[float], None] = time.sleep


@dataclass(frozen=True)
class Release:
    """The board slice being deployed: where it lies here, its id, its size."""

    path: Path
    manifest: Manifest
    bytes: int

    @property
    def id(self) -> str:
        return self.manifest.bundle_id


@dataclass
class BoardResult:
    """How one board's deploy (or rollback) went: the release now current, the one before, the cost."""

    board: str
    ok: bool = False
    current: str | None = None
    before: str | None = None
    error: str | None = None
    sent_bytes: int = 0
    method: str = ""
    seconds: float = 0.0
    steps: list[str] = field(default_factory=list)
    rolled_back: bool = False

    def line(self) -> str:
        if not self.ok:
            undo = ("; rolled back to " + (self.before or "no release current, as before") if self.rolled_back
                    else "; current left as it was")
            return f"{self.board}: FAILED: {self.error}{undo}"
        cost = f", {self.sent_bytes / 1e6:.1f} MB by {self.method}" if self.method else ""
        return f"{self.board}: current {self.current} (was {self.before or 'none'}){cost} in {self.seconds:.1f} s"


def probe(remote: Remote) -> BoardFacts:
    """Read the board's facts; refuse a board that cannot run a release, naming what to do."""
    found = dict(line.split("=", 1) for line in remote.run(PROBE).stdout.splitlines() if "=" in line)
    version = found.get("python_version") or ""
    parsed = tuple(int(v) for v in version.split(".")) if version.replace(".", "").isdigit() else None
    if parsed is None:
        raise DeployError(remote.destination, "no Python 3 found there: install python3 (3.10 or newer), then "
                          + INSTALL_HINT)
    if parsed < MIN_PYTHON:
        raise DeployError(remote.destination, f"its Python is {version}; splitedge needs 3.10 or newer "
                          "(64-bit Raspberry Pi OS Bookworm has 3.11)")
    if not found.get("split_device"):
        raise DeployError(remote.destination, "split-device is not installed (not on PATH, not in ~/splitedge/bin "
                          "or ~/.local/bin): " + INSTALL_HINT)
    return BoardFacts(
        split_device=found["split_device"], python_version=parsed,  # type: ignore[arg-type]
        rsync=bool(found.get("rsync")), root=found["root"], current=found.get("current") or None,
        free_bytes=int(found.get("free_kb") or 0) * 1024, config=found["config"], user=found.get("user", ""),
        sudo=bool(found.get("sudo")),
    )


Step = tuple[str, Callable[[], None]]

#: Why ``--service`` cannot be installed on a board (:func:`elevation` is None).
NO_SUDO = "--service needs root there and it has no sudo: install sudo, or deploy as root"


def elevation(facts: BoardFacts) -> str | None:
    """The prefix that runs ``install-service`` as root on the board: "" for root, ``sudo -n ``, or
    None where there is no way (:data:`NO_SUDO`)."""
    if facts.user == "root":
        return ""
    return "sudo -n " if facts.sudo else None


def _service_steps(remote: Remote, facts: BoardFacts, service: ServiceOptions, undo: list[Step]) -> list[Step]:
    sd, root = shlex.quote(facts.split_device), shlex.quote(facts.root)
    elevate = elevation(facts)

    def install() -> None:
        if elevate is None:
            raise DeployError(remote.destination, NO_SUDO)
        done = remote.run(f"{elevate}{sd} install-service --root {root} --user {shlex.quote(facts.user)}",
                          check=False, timeout_s=600)
        # Run last of the undo steps (they run in reverse): once current is the old release again.
        undo.insert(0, ("restart the service on the old release",
                        lambda: remote.run(f"{elevate}systemctl restart {SERVICE}", check=False)))
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        if done.returncode != 0:
            if any("password is required" in line for line in said):
                raise DeployError(remote.destination, "--service needs sudo without a password there "
                                  "(Raspberry Pi OS's first user has it; else add a sudoers rule for split-device)")
            raise DeployError(remote.destination, "the service did not start: "
                              + (said[-1].removeprefix("split-device: ") if said else f"exit {done.returncode}"))

    def health() -> None:
        elapsed = 0.0
        while elapsed < service.health_s:
            status = _status(remote, sd, root)
            state = status.get("service")
            if state != "active":
                last = status.get("last_run") or {}
                raise DeployError(remote.destination, f"the service went {state} {elapsed:.1f} s after it started"
                                  + (f": {last['error']}" if last.get("error") else "")
                                  + f"; journalctl -u {SERVICE} there says why")
            service.sleep(service.poll_s)
            elapsed += service.poll_s

    return [("service", install), ("health", health)]


def _status(remote: Remote, sd: str, root: str) -> dict[str, Any]:
    done = remote.run(f"{sd} status --root {root} --json", check=False)
    try:
        found = json.loads(done.stdout)
    except json.JSONDecodeError:
        return {"service": "unknown (split-device status gave no JSON)"}
    return found if isinstance(found, dict) else {}


def board_steps(remote: Remote, facts: BoardFacts, release: Release, settings: Mapping[str, str],
                keep: int, result: BoardResult, service: ServiceOptions | None = None) -> tuple[list[Step], list[Step]]:
    """The deploy's steps and, for each one that changes what runs, its undo (run in reverse on failure)."""
    sd, root = shlex.quote(facts.split_device), shlex.quote(facts.root)
    target, incoming = str(facts.layout.release(release.id)), str(facts.layout.incoming(release.id))
    undo: list[Step] = []
    saved_config: list[str | None] = []
    present = [False]

    def upload() -> None:
        there = remote.run(f"{sd} verify {shlex.quote(target)} --json", check=False)
        if there.returncode == 0:
            present[0] = True  # a release of this id already whole there: nothing to send
            return
        if release.bytes * 1.1 > facts.free_bytes:
            raise DeployError(remote.destination, f"not enough space under {facts.root}: {facts.free_bytes / 1e6:.0f} "
                              f"MB free, the release needs {release.bytes / 1e6:.0f} MB; free space there "
                              "(split-device status lists the releases kept)")
        remote.run(f"rm -rf {shlex.quote(incoming)} && mkdir -p {shlex.quote(facts.releases)}")
        link_dest = f"../{facts.current}" if facts.current else None
        try:
            stats: UploadStats = remote.upload(release.path, incoming, link_dest, facts.rsync)
        except DeployError:
            remote.run(f"rm -rf {shlex.quote(incoming)}", check=False)
            raise
        result.sent_bytes, result.method = stats.sent, stats.method

    def verify() -> None:
        if present[0]:
            return
        done = remote.run(f"{sd} verify {shlex.quote(incoming)} --json", check=False)
        try:
            report = json.loads(done.stdout)
        except json.JSONDecodeError:
            report = {"ok": False, "problems": [(done.stderr.strip() or done.stdout.strip() or "no report")
                                                .splitlines()[-1]]}
        if not report.get("ok"):
            remote.run(f"rm -rf {shlex.quote(incoming)}", check=False)
            problems = report.get("problems") or ["verification failed"]
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise DeployError(remote.destination, f"the upload does not verify on the board: {problems[0]}{more}; "
                              "it was removed; deploy again (a flaky SD card or link?)")

    def install() -> None:
        if not present[0]:
            remote.run(f"mv -T {shlex.quote(incoming)} {shlex.quote(target)}")

    def switch() -> None:
        done = remote.run(f"{sd} switch {shlex.quote(release.id)} --root {root} --keep {keep}", check=False)
        if done.returncode == DEFERRED:
            raise DeployError(remote.destination, "a field trial holds updates.lock there: the switch is deferred "
                              "(the release is installed); deploy again when the trial ends")
        if done.returncode != 0:
            raise DeployError(remote.destination, "split-device switch failed: "
                              + (done.stdout.strip() or done.stderr.strip() or f"exit {done.returncode}"))
        result.current = release.id
        if facts.current is None:  # a first deploy undone: no release current, as before
            undo.append(("unset current", lambda: remote.run(f"rm -f {shlex.quote(facts.root + '/current')}")))
        elif facts.current != release.id:
            undo.append(("switch back", lambda: remote.run(f"{sd} switch {shlex.quote(facts.current or '')} "
                                                           f"--root {root} --keep {keep + 1}")))

    def configure() -> None:
        if not settings:
            return
        path = shlex.quote(facts.config)
        old = remote.run(f"cat {path}", check=False)
        saved_config.append(old.stdout if old.returncode == 0 else None)
        undo.append(("restore settings", restore_config))
        flags = " ".join(f"--set {shlex.quote(f'{k}={v}')}" for k, v in settings.items())
        remote.run(f"{sd} config {flags} --file {path}")

    def restore_config() -> None:
        path = shlex.quote(facts.config)
        if saved_config and saved_config[0] is not None:
            remote.run(f"cat > {path}.restore && mv -f {path}.restore {path}", stdin=saved_config[0])
        else:
            remote.run(f"rm -f {path}")

    steps: list[Step] = [("upload", upload), ("verify", verify), ("install", install), ("switch", switch),
                         ("configure", configure)]
    if service is not None:
        steps += _service_steps(remote, facts, service, undo)
    return steps, undo


def deploy_board(remote: Remote, release: Release, settings: Mapping[str, str], keep: int,
                 service: ServiceOptions | None = None, clock: Callable[[], float] = time.monotonic) -> BoardResult:
    """Deploy ``release`` to one board; a failure is returned (never raised) with what was undone."""
    result = BoardResult(board=remote.destination)
    start = clock()
    undo: list[Step] = []
    try:
        facts = probe(remote)
        result.before = result.current = facts.current
        steps, undo = board_steps(remote, facts, release, settings, keep, result, service)
        for name, step in steps:
            step()
            result.steps.append(name)
        result.ok = True
    except DeployError as exc:
        result.error = exc.reason
        for name, step in reversed(undo):
            try:
                step()
                result.rolled_back = True
                result.current = result.before
            except DeployError as undo_failed:
                result.error += f"; and {name} failed too: {undo_failed.reason}"
    finally:
        result.seconds = clock() - start
    return result


def rollback_board(remote: Remote) -> BoardResult:
    """``split-device rollback`` on one board: current goes back to the release before the last switch."""
    result = BoardResult(board=remote.destination)
    try:
        facts = probe(remote)
        result.before = facts.current
        done = remote.run(f"{shlex.quote(facts.split_device)} rollback --root {shlex.quote(facts.root)}", check=False)
        if done.returncode != 0:
            raise DeployError(remote.destination, (done.stdout.strip() or done.stderr.strip()
                                                   or f"rollback exit {done.returncode}").splitlines()[-1])
        result.current = done.stdout.split("current: ", 1)[-1].split()[0]
        result.ok = True
    except DeployError as exc:
        result.error = exc.reason
    return result
