"""Boards for deploys: real OpenSSH servers on 127.0.0.1 (:mod:`testbed._ssh_boards`), one per board."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testbed._ssh_boards import SshBoards, install_board_venv, unavailable_reason

ROOT = Path(__file__).resolve().parents[2]

needs_boards = pytest.mark.skipif(unavailable_reason() is not None, reason=unavailable_reason() or "")


@pytest.fixture(scope="session")
def board_install() -> Iterator[Path]:
    """The board install every board links as ~/splitedge, made once per session (~30 s)."""
    from testbed.board_box import build_wheel

    shared = Path(tempfile.mkdtemp(prefix="splitedge-boards-", dir="/tmp"))
    shared.chmod(0o755)
    try:
        yield install_board_venv(build_wheel(ROOT, shared / "wheel"), shared / "venv")
    finally:
        shutil.rmtree(shared, ignore_errors=True)


@pytest.fixture
def make_boards(board_install: Path) -> Iterator[Callable[..., SshBoards]]:
    """``make_boards(board1={}, board2={"disk_mb": 8})`` -> :class:`SshBoards`, torn down after the test."""
    boards = SshBoards(board_install)

    def make(**specs: dict) -> SshBoards:
        for name, spec in specs.items():
            boards.add(name, **spec)
        return boards

    try:
        yield make
    finally:
        boards.close()


def split_export(*argv: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``split-export`` as a user types it, from this checkout, in a process of its own."""
    return subprocess.run([sys.executable, "-m", "exporter.cli", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
