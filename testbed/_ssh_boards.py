"""Boards reached over ssh, on one machine: a real OpenSSH server per board, each with its own user and home.

What ``split-export deploy`` needs to be rehearsed and measured without a fleet: each board is
Debian's ``sshd`` started on a port of 127.0.0.1 with its own host key, letting one user in
(made with ``useradd``, removed at the end) by key only. Every board runs the same board install
of splitedge: a virtual environment of Debian's ``/usr/bin/python3`` with
``pip install splitedge-*.whl[device,tflite,camera]`` (:func:`install_board_venv`), in a
world-readable directory, linked as ``~/splitedge`` in each home (where a deploy looks for it;
a board user cannot read a checkout under /root). The workstation's ssh reaches them through an
ssh config file (``ssh -F``) naming them ``board1``, ``board2``… with their ports, users, the
workstation's key and their pinned host keys, as a user's ``~/.ssh/config`` would.

Needs root (users, sshd, mounts), ``/usr/sbin/sshd`` and ``rsync``; :func:`unavailable_reason`
says what is missing. Used by ``tests/deploy`` and ``bench/deploy_cost.py``.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from device_runtime import HEAD, Bundle, make_artifact, write_manifest
from testbed._ports import free_port

__all__ = ["BOARD_PYTHON", "SSHD", "SshBoard", "SshBoards", "install_board_venv", "one_head_changed",
           "unavailable_reason"]

SSHD = Path("/usr/sbin/sshd")
BOARD_PYTHON = Path("/usr/bin/python3")  # Debian's, which every user may run (a pyenv's may sit under /root)
_TIMEOUT_S = 600


def unavailable_reason() -> str | None:
    """Why boards over ssh cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root (users, sshd): make test runs it as root"
    for tool, path in (("openssh-server", SSHD), ("rsync", shutil.which("rsync")), ("useradd", shutil.which("useradd")),
                       ("python3 at /usr/bin", BOARD_PYTHON)):
        if path is None or not Path(path).exists():
            return f"needs {tool} (make test installs it: apt-get install openssh-server rsync)"
    return None


def _run(argv: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S, **kwargs)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()[-2000:]}")
    return done


def install_board_venv(wheel: Path, venv: Path) -> Path:
    """splitedge[device,tflite,camera] from ``wheel`` into a new venv of Debian's Python, readable by all."""
    _run([str(BOARD_PYTHON), "-m", "venv", str(venv)])
    _run([str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
          f"{wheel}[device,tflite,camera]"], env={k: v for k, v in os.environ.items()
                                                  if not k.startswith(("VIRTUAL_ENV", "PYTHON"))})
    for path in [venv, *venv.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | (0o055 if path.is_dir() else 0o044))
    return venv


def one_head_changed(bundle: Path, out: Path) -> Path:
    """A copy of ``bundle`` at ``out`` as if its last split's head had been re-exported: a valid ONNX
    field (``doc_string``) appended, so that head's bytes, its sha256 and the bundle's id differ
    while every other file is the same. A redeploy of it should send that head alone."""
    shutil.copytree(bundle, out)
    manifest = Bundle.load(out, roles=()).manifest
    split = manifest.splits[-1]
    head = next(a for a in split.artifacts if a.role == HEAD)
    with open(out / head.path, "ab") as fh:
        fh.write(b"\x32\x0bre-exported")  # ModelProto field 6 (doc_string): the last one read wins
    changed = make_artifact(out, head.path, head.role, head.format, head.precision)
    split = dataclasses.replace(split, artifacts=tuple(changed if a is head else a for a in split.artifacts))
    write_manifest(out, dataclasses.replace(manifest, splits=(*manifest.splits[:-1], split), bundle_id="",
                                            manifest_sha256=""))
    return out


@dataclass
class SshBoard:
    name: str  # as the ssh config names it
    user: str
    home: Path
    port: int
    process: subprocess.Popen

    @property
    def root(self) -> Path:
        """The board's splitedge directory (its default: ~/.local/share/splitedge)."""
        return self.home / ".local" / "share" / "splitedge"

    def current(self) -> str | None:
        try:
            return Path(os.readlink(self.root / "current")).name
        except OSError:
            return None

    def releases(self) -> list[str]:
        folder = self.root / "releases"
        return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []

    def as_user(self, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on the board as its user, in a clean environment (nothing of the caller's leaks in)."""
        return subprocess.run(["runuser", "-u", self.user, "--", "env", "-i", f"HOME={self.home}",
                               "PATH=/usr/bin:/bin", *argv], capture_output=True, text=True, timeout=timeout, cwd="/")


class SshBoards:
    """Boards made with :meth:`add`; users, homes, mounts and sshd processes all removed by :meth:`close`."""

    def __init__(self, install: Path, base: Path | None = None) -> None:
        self.install = install
        self.base = base or Path(tempfile.mkdtemp(prefix="splitedge-fleet-", dir="/tmp"))
        self.base.chmod(0o755)  # the board users reach their homes and shared files below it
        self.boards: dict[str, SshBoard] = {}
        self._mounts: list[Path] = []
        self.key = self.base / "workstation_key"
        self.ssh_config = self.base / "ssh_config"
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key)])
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory

    def __getitem__(self, name: str) -> SshBoard:
        return self.boards[name]

    def __enter__(self) -> "SshBoards":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add(self, name: str, *, installed: bool = True, disk_mb: int | None = None,
            files: dict[str, str] | None = None) -> SshBoard:
        """A board: ``installed`` links the board install as ~/splitedge; ``disk_mb`` puts
        ~/.local/share (the releases) on a tmpfs that small, a real full disk; ``files`` are
        executables of its own under its home (``$HOME`` in their text is its home)."""
        user = f"se{os.getpid() % 100000}{name}"[:32]
        home = self.base / f"home-{name}"
        _run(["useradd", "--home-dir", str(home), "--create-home", "--shell", "/bin/sh", "--user-group", user])
        board = SshBoard(name, user, home, 0, None)  # type: ignore[arg-type]
        self.boards[name] = board  # removed by close() from here on, whatever fails below
        _run(["usermod", "-p", "*", user])  # no password, not locked: sshd without PAM lets keys in
        ssh_dir = home / ".ssh"
        ssh_dir.mkdir(mode=0o700)
        shutil.copy(f"{self.key}.pub", ssh_dir / "authorized_keys")
        if installed:
            (home / "splitedge").symlink_to(self.install)
        for relative, text in (files or {}).items():
            path = home / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text.replace("$HOME", str(home)))
            path.chmod(0o755)
        if disk_mb is not None:
            share = home / ".local" / "share"
            share.mkdir(parents=True)
            _run(["mount", "-t", "tmpfs", "-o", f"size={disk_mb}m,mode=0755", "tmpfs", str(share)])
            self._mounts.append(share)
        _run(["chown", "-R", f"{user}:{user}", str(home)])
        home.chmod(0o700)
        board.port, board.process = self._sshd(name, user)
        self._write_config()
        return board

    def _sshd(self, name: str, user: str) -> tuple[int, subprocess.Popen]:
        host_key = self.base / f"host_key_{name}"
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)])
        port = free_port()
        config = self.base / f"sshd_config_{name}"
        config.write_text(
            f"Port {port}\nListenAddress 127.0.0.1\nHostKey {host_key}\nPidFile {self.base}/sshd_{name}.pid\n"
            "AuthorizedKeysFile .ssh/authorized_keys\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            f"UsePAM no\nAllowUsers {user}\nStrictModes yes\nMaxStartups 30\nSubsystem sftp internal-sftp\n"
        )
        log = self.base / f"sshd_{name}.log"
        with open(log, "w") as fh:
            process = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(config)], stdout=subprocess.DEVNULL,
                                       stderr=fh)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if process.poll() is not None:
                break
            time.sleep(0.05)
        else:
            process.kill()
            raise RuntimeError(f"sshd for {name} did not listen on 127.0.0.1:{port}: {log.read_text()}")
        if process.poll() is not None:
            raise RuntimeError(f"sshd for {name} exited: {log.read_text()}")
        with open(self.base / "known_hosts", "a") as fh:
            fh.write(f"[127.0.0.1]:{port} {Path(f'{host_key}.pub').read_text()}")
        return port, process

    def _write_config(self) -> None:
        self.ssh_config.write_text("".join(
            f"Host {b.name}\n  HostName 127.0.0.1\n  Port {b.port}\n  User {b.user}\n  IdentityFile {self.key}\n"
            f"  IdentitiesOnly yes\n  UserKnownHostsFile {self.base}/known_hosts\n  StrictHostKeyChecking yes\n"
            for b in self.boards.values()
        ))

    def ssh(self, name: str, command: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """``command`` on board ``name`` through ssh, as the workstation's user would run it."""
        return subprocess.run(["ssh", "-F", str(self.ssh_config), "-o", "BatchMode=yes", name, command],
                              capture_output=True, text=True, timeout=timeout)

    def close(self) -> None:
        for board in self.boards.values():
            if board.process is not None:
                board.process.terminate()
                try:
                    board.process.wait(5)
                except subprocess.TimeoutExpired:
                    board.process.kill()
                    board.process.wait()
            subprocess.run(["pkill", "-KILL", "-u", board.user], capture_output=True)
        for mount in self._mounts:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)
        for board in self.boards.values():
            subprocess.run(["userdel", "-r", board.user], capture_output=True)
        shutil.rmtree(self.base, ignore_errors=True)
