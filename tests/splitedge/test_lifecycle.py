"""sd_notify: split-device run tells systemd it is ready once a frame is answered, and that it stops."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from splitedge.lifecycle import notify

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def notify_socket(tmp_path: Path):
    """A datagram socket where systemd would listen for a Type=notify unit's messages."""
    path = tmp_path / "notify"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(0)
        yield path, sock


def received(sock: socket.socket) -> list[str]:
    messages = []
    while True:
        try:
            messages.append(sock.recv(4096).decode())
        except BlockingIOError:
            return messages


def test_notify_sends_one_datagram_and_is_a_no_op_without_systemd(notify_socket, monkeypatch) -> None:
    path, sock = notify_socket
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert notify("READY=1") is False
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    assert notify("READY=1\nSTATUS=up") is True
    assert received(sock) == ["READY=1\nSTATUS=up"]


def test_an_unreachable_socket_is_a_warning_not_a_failure(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens"))
    assert notify("READY=1") is False
    assert "warning: could not tell systemd 'READY=1'" in capsys.readouterr().err


def test_run_is_ready_after_its_first_answer_and_says_when_it_stops(notify_socket, mobilenet_bundle: Path,
                                                                    photos_dir: Path) -> None:
    path, sock = notify_socket
    out = subprocess.run([sys.executable, "-m", "device_runtime.cli", "run", str(mobilenet_bundle), "--camera",
                          str(photos_dir), "--split", "local"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "NOTIFY_SOCKET": str(path)})
    assert out.returncode == 0, out.stderr
    messages = received(sock)
    assert len(messages) == 2, messages
    assert messages[0].startswith("READY=1\nSTATUS=running ") and str(mobilenet_bundle) in messages[0]
    assert messages[1] == "STOPPING=1"


def test_a_run_that_never_answers_is_never_ready(notify_socket, tmp_path: Path) -> None:
    path, sock = notify_socket
    out = subprocess.run([sys.executable, "-m", "device_runtime.cli", "run", str(tmp_path / "no-bundle"),
                          "--camera", "synthetic", "--split", "local"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "NOTIFY_SOCKET": str(path)})
    assert out.returncode == 2
    assert not any(m.startswith("READY=1") for m in received(sock))
