"""Boards for deploys: real OpenSSH servers on 127.0.0.1, one per board, each with its own user and home.

Each board is Debian's ``sshd`` run by the test on a port of 127.0.0.1 with its own host key,
letting one user in (made with ``useradd``, removed afterwards) by key only. Every board runs
the same board install of splitedge: a virtual environment made by Debian's ``/usr/bin/python3``
under a world-readable temporary directory with ``pip install splitedge-*.whl[device,tflite,camera]``,
as a board installs it (a board user cannot read this checkout's environments under /root), and
linked as ``~/splitedge`` in each home, where ``split-export deploy`` looks for it. The test
process is the workstation: its ssh reaches the boards through an ssh config file (``-F``)
naming them board1, board2… with their ports, users, key and pinned host keys.

Needs root (users, sshd, mounts), ``/usr/sbin/sshd`` and ``rsync``: ``make test`` installs them.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SSHD = Path("/usr/sbin/sshd")
BOARD_PYTHON = Path("/usr/bin/python3")  # Debian's, readable by every user (this one's may be under /root)


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root (users, sshd): make test runs it as root"
    for tool, path in (("openssh-server", SSHD), ("rsync", shutil.which("rsync")), ("useradd", shutil.which("useradd")),
                       ("python3 at /usr/bin", BOARD_PYTHON)):
        if path is None or not Path(path).exists():
            return f"needs {tool} (make test installs it: apt-get install openssh-server rsync)"
    return None


needs_boards = pytest.mark.skipif(_unavailable() is not None, reason=_unavailable() or "")


def _run(argv: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, **kwargs)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()[-2000:]}")
    return done


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def shared_dir() -> Iterator[Path]:
    """A world-readable directory for what every board user must read (the board install, photos)."""
    path = Path(tempfile.mkdtemp(prefix="splitedge-boards-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def board_install(shared_dir: Path) -> Path:
    """splitedge[device,tflite,camera] installed from its wheel into a venv of Debian's Python: what a board has."""
    from testbed.board_box import build_wheel

    wheel = build_wheel(ROOT, shared_dir / "wheel")
    venv = shared_dir / "venv"
    _run([str(BOARD_PYTHON), "-m", "venv", str(venv)])
    _run([str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
          f"{wheel}[device,tflite,camera]"], env={k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))})
    for path in [shared_dir, *shared_dir.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | 0o055 if path.is_dir() else path.stat().st_mode | 0o044)
    return venv


@dataclass
class Board:
    name: str  # as the workstation's ssh config names it
    user: str
    home: Path
    port: int
    process: subprocess.Popen

    @property
    def root(self) -> Path:
        return self.home / ".local" / "share" / "splitedge"

    def current(self) -> str | None:
        try:
            return Path(os.readlink(self.root / "current")).name
        except OSError:
            return None

    def as_user(self, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on the board as its user, in a clean environment (nothing of the test's leaks in)."""
        return subprocess.run(["runuser", "-u", self.user, "--", "env", "-i", f"HOME={self.home}",
                               "PATH=/usr/bin:/bin", *argv], capture_output=True, text=True, timeout=timeout, cwd="/")

    def releases(self) -> list[str]:
        folder = self.root / "releases"
        return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


@dataclass
class Boards:
    ssh_config: Path
    key: Path
    boards: dict[str, Board]
    install: Path
    base: Path  # world-readable: photos and the like for the boards go here

    def __getitem__(self, name: str) -> Board:
        return self.boards[name]

    def ssh(self, name: str, command: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """``command`` on board ``name`` through ssh, as the workstation's user would run it."""
        return subprocess.run(["ssh", "-F", str(self.ssh_config), "-o", "BatchMode=yes", name, command],
                              capture_output=True, text=True, timeout=timeout)


class _Maker:
    """Users, homes and sshd processes, all removed at the end."""

    def __init__(self, base: Path, install: Path) -> None:
        self.base, self.install = base, install
        self.boards: dict[str, Board] = {}
        self.mounts: list[Path] = []
        self.key = base / "workstation_key"
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key)])
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory

    def board(self, name: str, *, installed: bool = True, disk_mb: int | None = None,
              files: dict[str, str] | None = None) -> Board:
        user = f"se{os.getpid() % 100000}{name}"[:32]
        home = self.base / f"home-{name}"
        _run(["useradd", "--home-dir", str(home), "--create-home", "--shell", "/bin/sh", "--user-group", user])
        _run(["usermod", "-p", "*", user])  # no password, not locked: sshd without PAM lets keys in
        ssh_dir = home / ".ssh"
        ssh_dir.mkdir(mode=0o700)
        shutil.copy(f"{self.key}.pub", ssh_dir / "authorized_keys")
        if installed:
            (home / "splitedge").symlink_to(self.install)
        for relative, text in (files or {}).items():  # executables of the board's own, under its home
            path = home / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text.replace("$HOME", str(home)))
            path.chmod(0o755)
        if disk_mb is not None:  # a board with a small, real disk: tmpfs where the releases go
            share = home / ".local" / "share"
            share.mkdir(parents=True)
            _run(["mount", "-t", "tmpfs", "-o", f"size={disk_mb}m,mode=0755", "tmpfs", str(share)])
            self.mounts.append(share)
        _run(["chown", "-R", f"{user}:{user}", str(home)])
        home.chmod(0o700)
        host_key = self.base / f"host_key_{name}"
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)])
        port = _free_port()
        config = self.base / f"sshd_config_{name}"
        config.write_text(
            f"Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\nPidFile {self.base}/sshd_{name}.pid\n"
            f"AuthorizedKeysFile .ssh/authorized_keys\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            f"UsePAM no\nAllowUsers {user}\nStrictModes yes\nMaxStartups 30\n"
        )
        process = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(config)], stdout=subprocess.DEVNULL,
                                   stderr=open(self.base / f"sshd_{name}.log", "w"))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        else:
            raise RuntimeError(f"sshd for {name} did not listen: {(self.base / f'sshd_{name}.log').read_text()}")
        self.boards[name] = Board(name, user, home, port, process)
        with open(self.base / "known_hosts", "a") as fh:
            fh.write(f"[127.0.0.1]:{port} {Path(f'{host_key}.pub').read_text()}")
        return self.board_config_written(name)

    def board_config_written(self, name: str) -> Board:
        lines = []
        for board in self.boards.values():
            lines.append(f"Host {board.name}\n  HostName 127.0.0.1\n  Port {board.port}\n  User {board.user}\n"
                         f"  IdentityFile {self.key}\n  IdentitiesOnly yes\n"
                         f"  UserKnownHostsFile {self.base}/known_hosts\n  StrictHostKeyChecking yes\n")
        (self.base / "ssh_config").write_text("".join(lines))
        return self.boards[name]

    def close(self) -> None:
        for board in self.boards.values():
            board.process.terminate()
            try:
                board.process.wait(5)
            except subprocess.TimeoutExpired:
                board.process.kill()
            subprocess.run(["pkill", "-KILL", "-u", board.user], capture_output=True)
        for mount in self.mounts:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)
        for board in self.boards.values():
            subprocess.run(["userdel", "-r", board.user], capture_output=True)


@pytest.fixture
def make_boards(board_install: Path) -> Iterator[callable]:
    """``make_boards(board1={}, board2={"disk_mb": 8})`` -> :class:`Boards`, torn down after the test.

    Under a directory of its own in /tmp, not pytest's tmp_path: board users must reach their homes."""
    base = Path(tempfile.mkdtemp(prefix="splitedge-fleet-", dir="/tmp"))
    base.chmod(0o755)
    maker = _Maker(base, board_install)

    def make(**specs: dict) -> Boards:
        for name, spec in specs.items():
            maker.board(name, **spec)
        return Boards(base / "ssh_config", maker.key, maker.boards, board_install, base)

    try:
        yield make
    finally:
        maker.close()
        shutil.rmtree(base, ignore_errors=True)


def split_export(*argv: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``split-export`` as a user types it, from this checkout, in a process of its own."""
    return subprocess.run([sys.executable, "-m", "exporter.cli", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
