"""The board in a box: an arm64 Debian Bookworm root file system run under ``qemu-user-static``.

64-bit Raspberry Pi OS is Debian Bookworm for arm64 with Python 3.11, so a Bookworm arm64 root
file system made by ``debootstrap --arch=arm64`` and entered with ``chroot`` (the kernel hands
its aarch64 binaries to qemu through binfmt_misc) runs the board's software as a board would:
the real aarch64 wheels of onnxruntime, ai-edge-litert, OpenCV and numpy, their real ARM
kernels (onnxruntime's MLAS, XNNPack). It is the board's software, not its timing: **emulated,
its timings mean nothing**.

Needs root, ``debootstrap`` and ``qemu-user-static`` (``apt-get install qemu-user-static
debootstrap``); :func:`unavailable_reason` says whether this machine can do it and why not.
The root file system is built once and kept (:meth:`BoardBox.build`: about 5 min, 330 MB; a
second build with the same recipe returns at once). Inside, pip needs this machine's CA bundle
and resolver (copied in) and a clean environment (``env -i``: nothing of this machine's pip
configuration or virtual environment leaks in). /proc and /dev are bind-mounted for the runs
(not /sys: see :data:`_SYSTEM_MOUNTS`) and always unmounted afterwards (:meth:`BoardBox.mounted`); :func:`remove_stale_mounts`
clears what a killed process left.

Used by ``make board`` and ``tests/testbed/test_board_box.py``; ``python -m testbed.board_box
--help`` is the command line.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from splitedge import SplitEdgeError

__all__ = [
    "BOARD_EXTRAS",
    "NUMPY2_DIR",
    "SSH_PACKAGES",
    "TFLITE_RUNTIME_VENV",
    "VENV",
    "BoardBox",
    "BoardBoxError",
    "BoardBoxUnavailable",
    "build_wheel",
    "main",
    "register_binfmt",
    "remove_stale_mounts",
    "unavailable_reason",
]

EMULATED = "emulated under qemu-user: its timings mean nothing"
#: 64-bit Raspberry Pi OS is Bookworm; its Python is 3.11.
SUITE = "bookworm"
ARCH = "arm64"
VARIANT = "minbase"
BASE_PACKAGES = ("python3", "python3-venv", "python3-pip", "ca-certificates")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
#: What a board installs (README): the runtime, the LiteRT interpreter, the camera. Never torch.
BOARD_EXTRAS = "device,tflite,camera"
#: Where the box keeps the board's virtual environment.
VENV = "/opt/splitedge"
#: A second board: where ai-edge-litert does not install and tflite-runtime does (it needs numpy<2),
#: and numpy 2 in a directory of its own, to put in front of it with PYTHONPATH (what a plain
#: ``pip install tflite-runtime`` gives such a board).
TFLITE_RUNTIME_VENV = "/opt/tflite-runtime-board"
#: Debian packages a board has for deploys over ssh (Raspberry Pi OS ships both).
SSH_PACKAGES = ("openssh-server", "rsync")
TFLITE_RUNTIME_EXTRAS = "camera"
TFLITE_RUNTIME_REQUIREMENTS = ("tflite-runtime", "numpy<2")
NUMPY2_DIR = "/opt/numpy2"
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
_BOX_CA = "/etc/ssl/certs/host-ca-bundle.crt"  # this machine's bundle, beside the box's own
_STAMP = ".splitedge-box.json"
#: /proc (detection reads cpuinfo and meminfo; Python needs /proc/self) and /dev. Not /sys: with
#: x86's /sys beside x86's /proc/cpuinfo, onnxruntime 1.32's cpuinfo library crashes the aarch64
#: process on import (SIGSEGV); with either alone it only warns "cpuinfo_initialize failed" and
#: takes the CPU's features from the auxiliary vector qemu provides.
_SYSTEM_MOUNTS = (("proc", "/proc"), ("dev", "/dev"))
_QEMU = "/usr/libexec/qemu-binfmt/aarch64-binfmt-P"
_BINFMT_DIR = Path("/proc/sys/fs/binfmt_misc")
_BINFMT_CONF = Path("/usr/lib/binfmt.d/qemu-aarch64.conf")
_PATH = "/opt/splitedge/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class BoardBoxError(SplitEdgeError, RuntimeError):
    """Building, entering or running in the box failed; the message has the command and its output."""


class BoardBoxUnavailable(BoardBoxError):
    """This machine cannot run the box: not root, no debootstrap, no qemu-user-static, no binfmt_misc."""


# --------------------------------------------------------------------------- this machine


def unavailable_reason() -> str | None:
    """``None`` when the box can be built and entered here, else why not (one line, with the fix)."""
    if os.geteuid() != 0:
        return "needs root (debootstrap, chroot and mounts)"
    missing = [tool for tool in ("debootstrap", "chroot", "mount", "umount") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not found: apt-get install debootstrap"
    if not _BINFMT_CONF.is_file() or not Path(_QEMU).is_file():
        return "qemu-user-static is not installed: apt-get install qemu-user-static"
    return None


def register_binfmt() -> None:
    """Make the kernel hand aarch64 binaries to qemu, from the package's own binfmt.d file.

    The file's ``F`` flag makes the kernel open the interpreter now, so the root file system needs
    no copy of qemu. Registration is system-wide and kept: nothing here removes it.
    """
    if (_BINFMT_DIR / "qemu-aarch64").exists():
        return
    if not (_BINFMT_DIR / "register").exists():
        _run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(_BINFMT_DIR)])
    try:
        (_BINFMT_DIR / "register").write_text(_BINFMT_CONF.read_text().strip() + "\n")
    except OSError as exc:
        if not (_BINFMT_DIR / "qemu-aarch64").exists():  # a concurrent registration is fine
            raise BoardBoxError(f"cannot register {_BINFMT_CONF} with binfmt_misc: {exc}") from exc


def build_wheel(repo: str | Path, out: str | Path, python: str = sys.executable) -> Path:
    """The project's wheel, built from a clean copy of ``repo``'s working tree (tracked and untracked
    files git does not ignore), so stale ``build/lib`` content never slips into it."""
    repo, out = Path(repo).resolve(), Path(out).resolve()
    listing = _run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"]).stdout
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="splitedge-wheel-") as tmp:
        for name in filter(None, listing.split("\0")):
            source = repo / name
            if source.is_file():  # deleted but still tracked: skip
                (Path(tmp) / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, Path(tmp) / name)
        for old in out.glob("splitedge-*.whl"):
            old.unlink()
        pip = Path(python).with_name("pip")  # the venv's own pip, beside its python
        _run([str(pip), "wheel", "--quiet", "--no-deps", "--disable-pip-version-check", "-w", str(out), tmp], timeout=600)
    (wheel,) = out.glob("splitedge-*.whl")
    return wheel


def _run(argv: Sequence[str], timeout: float | None = None, **kwargs: object) -> subprocess.CompletedProcess[str]:
    try:
        result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, **kwargs)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BoardBoxError(f"{shlex.join(argv)}: {exc}") from exc
    if result.returncode != 0:
        tail = (result.stderr.strip() or result.stdout.strip())[-2000:]
        raise BoardBoxError(f"{shlex.join(argv)}: exit status {result.returncode}\n{tail}")
    return result


def _mount_points() -> list[str]:
    """Mount points of this machine, as /proc/self/mounts lists them (octal escapes decoded)."""
    with open("/proc/self/mounts", encoding="utf-8") as mounts:
        points = [line.split()[1] for line in mounts if line.strip()]
    return [p.encode().decode("unicode_escape") for p in points]


def _under(point: str, root: str | Path) -> bool:
    root = os.path.realpath(root)
    return point == root or point.startswith(root + os.sep)


def remove_stale_mounts(root: str | Path) -> list[str]:
    """Unmount whatever is still mounted under ``root`` (a killed run's binds), deepest first; never
    ``root`` itself, which may be a mount of its own (an SD card, an overlay of the box)."""
    stale = [p for p in _mount_points() if _under(p, root) and p != os.path.realpath(root)]
    for point in sorted(stale, key=len, reverse=True):
        if subprocess.run(["umount", point], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", point], capture_output=True)  # busy: detach now, free later
    return stale


# --------------------------------------------------------------------------- the box


def _recipe(mirror: str) -> dict[str, object]:
    return {"suite": SUITE, "arch": ARCH, "variant": VARIANT, "packages": list(BASE_PACKAGES), "mirror": mirror}


class BoardBox:
    """One arm64 root file system at ``root``: build it, enter it, run the board's commands in it.

    >>> box = BoardBox.build("build/board-rootfs")        # doctest: +SKIP
    >>> with box.mounted({"/srv/bundle": "build/board-bundle"}):   # doctest: +SKIP
    ...     box.run(["uname", "-m"]).stdout                # 'aarch64\\n'
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()
        self._mounted = False

    # ----------------------------------------------------------------- building

    @property
    def built(self) -> dict[str, object] | None:
        """What the build recorded (recipe, seconds taken), or None if there is no finished box."""
        try:
            return json.loads((self.root / _STAMP).read_text())
        except (OSError, ValueError):
            return None

    @classmethod
    def build(
        cls, root: str | Path, mirror: str = DEFAULT_MIRROR, log: Path | None = None, rebuild: bool = False
    ) -> "BoardBox":
        """The box at ``root``, made by debootstrap unless a box of the same recipe is already there.

        debootstrap writes into ``root.partial`` and the result is renamed into place only when it
        is complete, so an interrupted build is started again rather than taken for a box.
        """
        reason = unavailable_reason()
        if reason is not None:
            raise BoardBoxUnavailable(f"the board in a box {reason}")
        register_binfmt()
        box = cls(root)
        recipe = _recipe(mirror)
        with box._lock():
            built = box.built
            if built is not None and built.get("recipe") == recipe and not rebuild:
                return box
            partial = box.root.with_name(box.root.name + ".partial")
            for old in (partial, box.root):
                remove_stale_mounts(old)
                if any(_under(point, old) for point in _mount_points()):  # never delete through a bind of /dev
                    raise BoardBoxError(f"{old}: something is still mounted under it; unmount it first")
                shutil.rmtree(old, ignore_errors=True)
            partial.parent.mkdir(parents=True, exist_ok=True)
            argv = ["debootstrap", f"--arch={ARCH}", f"--variant={VARIANT}", f"--include={','.join(BASE_PACKAGES)}",
                    SUITE, str(partial), mirror]
            start = time.monotonic()
            with open(log or os.devnull, "w", encoding="utf-8") as out:
                result = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT)
            if result.returncode != 0:
                where = f"; see {log}" if log else ""
                raise BoardBoxError(f"{shlex.join(argv)}: exit status {result.returncode}{where}")
            seconds = time.monotonic() - start
            (partial / _STAMP).write_text(json.dumps({"recipe": recipe, "build_s": round(seconds, 1)}) + "\n")
            partial.rename(box.root)
        return box

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        """One builder or user of a box at a time (the mounts are shared state)."""
        self.root.parent.mkdir(parents=True, exist_ok=True)
        with open(self.root.with_name(self.root.name + ".lock"), "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    # ----------------------------------------------------------------- entering

    @contextlib.contextmanager
    def mounted(self, binds: Mapping[str, str | Path] | None = None) -> Iterator["BoardBox"]:
        """/proc and /dev bound in (detection reads the CPU and memory from /proc), this machine's CA
        bundle and resolver copied in, and ``binds`` (path in the box → path here, read-only).
        Everything bound is unmounted on the way out, whatever happened inside."""
        if self.built is None:
            raise BoardBoxError(f"{self.root}: no board in a box here; build it first (python -m testbed.board_box build)")
        register_binfmt()  # a reboot forgets it; the box on disk does not
        with self._lock():
            remove_stale_mounts(self.root)
            for source in ("/etc/resolv.conf", CA_BUNDLE):
                target = self.root / (_BOX_CA if source == CA_BUNDLE else source).lstrip("/")
                target.unlink(missing_ok=True)  # resolv.conf may be a dangling link in the box
                shutil.copyfile(source, target)
            done: list[Path] = []
            try:
                for name, path in _SYSTEM_MOUNTS:
                    target = self.root / name
                    target.mkdir(exist_ok=True)
                    _run(["mount", "--bind", path, str(target)])
                    done.append(target)
                for inside, outside in (binds or {}).items():
                    target = self.root / inside.lstrip("/")
                    target.mkdir(parents=True, exist_ok=True)
                    _run(["mount", "--bind", str(Path(outside).resolve()), str(target)])
                    done.append(target)
                    _run(["mount", "-o", "remount,bind,ro", str(target)])
                self._mounted = True
                yield self
            finally:
                self._mounted = False
                for target in reversed(done):
                    if subprocess.run(["umount", str(target)], capture_output=True).returncode != 0:
                        subprocess.run(["umount", "-l", str(target)], capture_output=True)

    def command(self, argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: str = "/") -> list[str]:
        """The command line that runs ``argv`` in the box: chroot, then ``env -i`` with a board's
        minimal environment (nothing of this machine's pip configuration or venv leaks in)."""
        base = {"PATH": _PATH, "HOME": "/root", "LANG": "C.UTF-8", "PIP_CERT": _BOX_CA,
                "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        pairs = [f"{k}={v}" for k, v in {**base, **(env or {})}.items()]
        shell = f"cd {shlex.quote(cwd)} && exec {shlex.join(argv)}"
        return ["chroot", str(self.root), "/usr/bin/env", "-i", *pairs, "/bin/sh", "-c", shell]

    def run(
        self, argv: Sequence[str], env: Mapping[str, str] | None = None, timeout: float | None = 600,
        check: bool = True, cwd: str = "/",
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in the box (inside :meth:`mounted`) and collect its output."""
        if not self._mounted:
            raise BoardBoxError("run inside 'with box.mounted():' (the box needs /proc and /dev)")
        argv = self.command(argv, env, cwd)
        try:
            result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise BoardBoxError(f"{shlex.join(argv)}: no answer within {timeout} s") from exc
        if check and result.returncode != 0:
            tail = (result.stderr.strip() or result.stdout.strip())[-3000:]
            raise BoardBoxError(f"in the box: {shlex.join(argv[-1:])}: exit status {result.returncode}\n{tail}")
        return result

    # ----------------------------------------------------------------- installing

    def install(
        self, wheel: str | Path, extras: str = BOARD_EXTRAS, venv: str = VENV, requirements: Sequence[str] = (),
    ) -> dict[str, object]:
        """``pip install 'splitedge[extras] @ file://…' [requirements]`` into the box's ``venv``, as a board would.

        The first install makes the venv and fetches every dependency's aarch64 wheel (about a
        minute); later ones replace only splitedge when the wheel changed, and nothing when it did
        not. Returns what was done: ``{"installed": bool, "seconds": float, "fresh_venv": bool}``.
        """
        wheel = Path(wheel).resolve()
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        stamp = self.root / venv.lstrip("/") / ".splitedge-wheel"
        key = " ".join([digest, extras, *requirements])
        if stamp.is_file() and stamp.read_text().strip() == key:
            return {"installed": False, "seconds": 0.0, "fresh_venv": False}
        start = time.monotonic()
        inside = f"/var/cache/splitedge/{wheel.name}"
        (self.root / inside.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(wheel, self.root / inside.lstrip("/"))
        pip = f"{venv}/bin/pip"
        fresh = not (self.root / venv.lstrip("/") / "bin" / "python").exists()
        if fresh:
            self.run(["python3", "-m", "venv", venv])
            self.run([pip, "install", "--quiet", "--upgrade", "pip"], timeout=900)
        else:  # same version number, new content: pip would keep the old one
            self.run([pip, "uninstall", "--quiet", "--yes", "splitedge"], check=False)
        wanted = f"splitedge[{extras}] @ file://{inside}" if extras else f"splitedge @ file://{inside}"
        self.run([pip, "install", "--quiet", wanted, *requirements], timeout=1800)
        stamp.write_text(key + "\n")
        return {"installed": True, "seconds": round(time.monotonic() - start, 1), "fresh_venv": fresh}

    def install_apt(self, packages: Sequence[str] = SSH_PACKAGES) -> dict[str, object]:
        """``apt-get install`` Debian ``packages`` into the box (a board's sshd and rsync for deploys),
        once: a stamp records what was installed. A ``policy-rc.d`` that refuses every start is in
        place first, so no package starts its service from inside the box: an sshd started there
        would listen on this machine's port 22."""
        stamp = self.root / "var/lib/splitedge-apt"
        key = " ".join(sorted(packages))
        if stamp.is_file() and stamp.read_text().strip() == key:
            return {"installed": False, "seconds": 0.0}
        start = time.monotonic()
        policy = self.root / "usr/sbin/policy-rc.d"
        policy.write_text("#!/bin/sh\n# splitedge's board in a box: no service starts inside it\nexit 101\n")
        policy.chmod(0o755)
        env = {"DEBIAN_FRONTEND": "noninteractive"}
        self.run(["apt-get", "update", "-q"], env=env, timeout=1800)
        self.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages], env=env, timeout=1800)
        stamp.write_text(key + "\n")
        return {"installed": True, "seconds": round(time.monotonic() - start, 1)}

    def install_tflite_runtime_board(self, wheel: str | Path) -> dict[str, object]:
        """The second board (:data:`TFLITE_RUNTIME_VENV`) and numpy 2 beside it (:data:`NUMPY2_DIR`)."""
        done = self.install(wheel, TFLITE_RUNTIME_EXTRAS, TFLITE_RUNTIME_VENV, TFLITE_RUNTIME_REQUIREMENTS)
        if not (self.root / NUMPY2_DIR.lstrip("/") / "numpy").is_dir():
            start = time.monotonic()
            self.run([f"{TFLITE_RUNTIME_VENV}/bin/pip", "install", "--quiet", "--target", NUMPY2_DIR, "numpy>=2"],
                     timeout=900)
            done = {**done, "installed": True, "seconds": round(float(done["seconds"]) + time.monotonic() - start, 1)}
        return done

    def packages(self, venv: str = VENV) -> dict[str, str]:
        """A venv's distributions and versions in the box (``pip list``)."""
        out = self.run([f"{venv}/bin/pip", "list", "--format", "json"]).stdout
        return {p["name"].lower(): p["version"] for p in json.loads(out)}


# --------------------------------------------------------------------------- command line


EXAMPLES = f"""\
It is {EMULATED}: it checks the board's software, not its speed.

examples:
  python -m testbed.board_box build                         # build/board-rootfs: debootstrap arm64 Bookworm (~5 min once)
  python -m testbed.board_box install                       # build the project's wheel, pip install it with [{BOARD_EXTRAS}]
  python -m testbed.board_box run -- split-device info      # any command, in the box (venv on PATH)
  python -m testbed.board_box run --bind /srv/bundle=build/board-bundle -- split-device run /srv/bundle --camera synthetic --frames 2 --split local
  python -m testbed.board_box shell                         # an interactive shell in the box
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m testbed.board_box",
        description="The board in a box: arm64 Debian Bookworm (64-bit Raspberry Pi OS's base, Python 3.11) "
        "under qemu-user-static, as root.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--root", default="build/board-rootfs", help="the root file system (default build/board-rootfs)")
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="debootstrap the root file system unless it is there (the cache)")
    build.add_argument("--mirror", default=DEFAULT_MIRROR, help=f"Debian mirror (default {DEFAULT_MIRROR})")
    build.add_argument("--rebuild", action="store_true", help="build again even if a box is there")
    install = sub.add_parser("install", help=f"pip install the project's wheel with [{BOARD_EXTRAS}] into {VENV}")
    install.add_argument("--wheel", help="a built wheel (default: build one from this checkout into build/wheel)")
    install.add_argument("--extras", default=BOARD_EXTRAS, help=f"(default {BOARD_EXTRAS})")
    install.add_argument("--ssh", action="store_true",
                         help=f"also apt-get install {' '.join(SSH_PACKAGES)} (deploys to the box over ssh; started by "
                         "tests, never at install)")
    install.add_argument("--tflite-runtime-board", action="store_true",
                         help=f"also the board with tflite-runtime and numpy<2 in {TFLITE_RUNTIME_VENV} (the tests use it)")
    for name, text in (("run", "run a command in the box"), ("shell", "an interactive shell in the box")):
        command = sub.add_parser(name, help=text)
        command.add_argument("--bind", action="append", default=[], metavar="INSIDE=OUTSIDE",
                             help="bind a directory of this machine into the box, read-only (repeatable)")
        if name == "run":
            command.add_argument("argv", nargs=argparse.REMAINDER, help="the command (after --)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "build":
            start = time.monotonic()
            box = BoardBox.build(args.root, mirror=args.mirror, rebuild=args.rebuild,
                                 log=Path(args.root).with_name(Path(args.root).name + ".log"))
            print(f"board in a box at {box.root} ({SUITE} {ARCH}); ready in {time.monotonic() - start:.1f} s; {EMULATED}")
            return 0
        box = BoardBox(args.root)
        if args.command == "install":
            wheel = Path(args.wheel) if args.wheel else build_wheel(Path.cwd(), Path(args.root).with_name("wheel"))
            with box.mounted():
                done = box.install(wheel, extras=args.extras)
                versions = box.packages()
                what = f"installed in {done['seconds']} s" if done["installed"] else "already installed"
                print(f"{wheel.name} [{args.extras}] {what}; torch {'PRESENT' if 'torch' in versions else 'absent'}; "
                      f"{EMULATED}", flush=True)
                if args.ssh:
                    done = box.install_apt(SSH_PACKAGES)
                    what = f"installed in {done['seconds']} s" if done["installed"] else "already installed"
                    print(f"{' '.join(SSH_PACKAGES)}: {what}")
                if args.tflite_runtime_board:
                    done = box.install_tflite_runtime_board(wheel)
                    what = f"installed in {done['seconds']} s" if done["installed"] else "already installed"
                    print(f"{wheel.name} [{TFLITE_RUNTIME_EXTRAS}] {' '.join(TFLITE_RUNTIME_REQUIREMENTS)} in "
                          f"{TFLITE_RUNTIME_VENV}: {what}")
            return 0
        binds = dict(_bind(spec) for spec in args.bind)
        with box.mounted(binds):
            if args.command == "shell":
                return subprocess.run(box.command(["/bin/bash", "-l"], env={"TERM": os.environ.get("TERM", "dumb")})).returncode
            command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
            if not command:
                raise BoardBoxError("run needs a command after --")
            return subprocess.run(box.command(command)).returncode
    except SplitEdgeError as exc:
        print(f"board_box: error: {exc}", file=sys.stderr)
        return 2


def _bind(spec: str) -> tuple[str, str]:
    inside, sep, outside = spec.partition("=")
    if not sep or not inside.startswith("/") or not outside:
        raise BoardBoxError(f"--bind {spec}: expected INSIDE=OUTSIDE, INSIDE an absolute path in the box")
    return inside, outside


if __name__ == "__main__":
    sys.exit(main())
