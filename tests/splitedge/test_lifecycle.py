"""sd_notify: split-device run tells systemd it is ready once a frame is answered, and that it stops."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from splitedge import lifecycle
from splitedge.errors import BackendError
from splitedge.lifecycle import SIGNAL_EXIT, exit_on_signals, notify

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


# --- a command stopped by a signal: one line, exit 130 or 143 (issue 27, point 9) ---


@pytest.fixture
def handlers_kept():
    """exit_on_signals leaves SIGINT and SIGTERM to their default action once a signal has stopped a
    command (the process is about to exit): put pytest's own back."""
    kept = {sig: signal.getsignal(sig) for sig in SIGNAL_EXIT}
    yield
    for sig, handler in kept.items():
        signal.signal(sig, handler)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_a_library_turned_into_an_error_still_ends_as_the_signal(signum, handlers_kept, capsys) -> None:
    """pybind11 turns a KeyboardInterrupt raised while onnxruntime initialises into an ImportError, and
    the backend into "onnxruntime is not installed" (exit 2): 3 of 16 Ctrl-C's of calibrate did."""

    def command() -> int:
        try:
            os.kill(os.getpid(), signum)
            time.sleep(5)
        except KeyboardInterrupt as exc:
            raise BackendError("onnxruntime is not installed: pip install 'splitedge[device]'") from exc
        return 0

    assert exit_on_signals("split-device", command) == SIGNAL_EXIT[signum]
    err = capsys.readouterr().err
    said = "Ctrl-C (SIGINT)" if signum == signal.SIGINT else "SIGTERM"
    assert err.splitlines() == [f"split-device: stopped by {said} before it finished; nothing it was writing was "
                                "kept: run it again"]


def test_a_stop_a_library_swallowed_is_delivered_again(handlers_kept, monkeypatch, capsys) -> None:
    """An optional import tried under ``except ImportError`` swallows it whole: the command would go on."""
    monkeypatch.setattr(lifecycle, "REDELIVER_S", 0.2)
    swallowed = []

    def command() -> int:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except KeyboardInterrupt:
            swallowed.append(True)
        time.sleep(30)  # going on as if nothing happened, until the signal comes again
        return 0

    started = time.monotonic()
    assert exit_on_signals("split-export", command) == 143
    assert swallowed and time.monotonic() - started < 10
    assert len(capsys.readouterr().err.splitlines()) == 1


def test_errors_and_exits_are_as_before_without_a_signal(capsys) -> None:
    assert exit_on_signals("split-export", lambda: 3) == 3
    assert exit_on_signals("split-export", lambda: (_ for _ in ()).throw(BackendError("no such file"))) == 2
    assert capsys.readouterr().err == "split-export: error: no such file\n"
    with pytest.raises(ZeroDivisionError):
        exit_on_signals("split-export", lambda: 1 // 0)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_calibrate_stopped_ends_in_one_line(signum, mobilenet_bundle: Path, tmp_path: Path) -> None:
    """A real signal to ``split-device calibrate`` as it starts timing the heads: before, Ctrl-C printed a
    47-line traceback. Sent as soon as its first line is read, where the onnxruntime import races it."""
    bundle = Path(shutil.copytree(mobilenet_bundle, tmp_path / "bundle"))
    calibrate = subprocess.Popen([sys.executable, "-m", "device_runtime.cli", "calibrate", str(bundle), "--no-host",
                                  "--repeats", "500"], cwd=ROOT, text=True, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE)
    try:
        first = calibrate.stdout.readline()  # bounded by the test's timeout; the command prints it within seconds
        assert "backend" in first, first
        calibrate.send_signal(signum)
        _, err = calibrate.communicate(timeout=120)
    finally:
        calibrate.kill()
    assert calibrate.returncode == SIGNAL_EXIT[signum], err
    assert len(err.splitlines()) == 1 and err.startswith("split-device: stopped by "), err
    assert not (bundle / "calibration.json").exists()
