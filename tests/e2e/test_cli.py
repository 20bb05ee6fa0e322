"""The console scripts as a user runs them: real processes, zeroconf on 127.0.0.1, signals."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from device_runtime import cli as device_cli
from host_runtime import cli as host_cli
from tests.conftest import TEST_SPLITS

LINE = re.compile(
    r"#(?P<index>\d+)\s+(?P<name>\S+)\s+(?P<label>.+?)\s+(?P<prob>[01]\.\d{3})\s+split=(?P<split>\S+)\s+"
    r"pre\s+(?P<pre>[\d.]+) ms\s+head\s+(?P<head>[\d.]+) ms\s+transfer\s+(?P<transfer>[\d.]+) ms\s+"
    r"tail\s+(?P<tail>[\d.]+) ms\s+waits\s+(?P<waits>[\d.]+) ms\s+total\s+(?P<total>[\d.]+) ms"
)


def script(name: str) -> list[str]:
    """Run a console script with this interpreter, as installed (``split-host`` → ``host_runtime.cli``)."""
    module = {"split-host": "host_runtime.cli", "split-device": "device_runtime.cli"}[name]
    return [sys.executable, "-m", module]


def wait_for_line(proc: subprocess.Popen, pattern: str, timeout: float = 30) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if re.search(pattern, line):
            return lines
    proc.kill()
    raise AssertionError(f"no line matching {pattern!r} within {timeout} s; got: {lines}")


def serve(bundle: Path):
    """``split-host serve`` on 127.0.0.1, advertised by zeroconf on loopback only: (process, port)."""
    proc = subprocess.Popen(
        [*script("split-host"), "serve", str(bundle), "--interface", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    lines = wait_for_line(proc, r"advertised as")
    port = int(re.search(r"listening on 127\.0\.0\.1:(\d+)", "".join(lines)).group(1))
    yield proc, port
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


@pytest.fixture
def host_process(mobilenet_bundle: Path):
    yield from serve(mobilenet_bundle)


@pytest.mark.parametrize("main", [device_cli.main, host_cli.main])
def test_help_has_examples(main, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    assert "examples:" in capsys.readouterr().out


def test_device_finds_host_by_zeroconf_and_prints_one_line_per_frame(host_process, mobilenet_bundle, photos_dir) -> None:
    out = subprocess.run(
        [*script("split-device"), "run", str(mobilenet_bundle), "--camera", str(photos_dir),
         "--interface", "127.0.0.1", "--split", TEST_SPLITS[0], "--verbose"],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    rows = [LINE.search(line) for line in out.stdout.splitlines()]
    rows = [r for r in rows if r]
    assert len(rows) == 4
    by_name = {r["name"]: r for r in rows}
    assert by_name["coffee.png"]["label"] == "espresso"
    assert all(r["split"] == TEST_SPLITS[0] for r in rows)
    assert all(float(r["tail"]) > 0 for r in rows)  # the host's tail time came back


def test_a_board_sends_its_cut_in_four_bits_and_traces_the_bytes_that_crossed(coded_bundle, photos_dir,
                                                                               tmp_path) -> None:
    """``--split SPLIT@k4`` (issue 47): every frame's cut crosses in the split's 4-bit coding, an
    eighth of its float32 bytes, and is answered by the host's tail; the trace names the option."""
    from device_runtime.bundle import Bundle

    split = Bundle.load(coded_bundle, roles=()).manifest.split(TEST_SPLITS[1])
    for _, port in serve(coded_bundle):
        out = subprocess.run(
            [*script("split-device"), "run", str(coded_bundle), "--camera", str(photos_dir), "--host",
             f"127.0.0.1:{port}", "--split", f"{split.id}@k4", "--trace", str(tmp_path / "t.jsonl")],
            capture_output=True, text=True, timeout=120,
        )
    assert out.returncode == 0, out.stderr
    rows = [r for r in map(LINE.search, out.stdout.splitlines()) if r]
    assert len(rows) == 4 and all(r["split"] == f"{split.id}@k4" and float(r["tail"]) > 0 for r in rows)
    frames = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    sent = [f["bytes"] for f in frames if f.get("type") == "frame" and f["split"] == f"{split.id}@k4"]
    assert sent == [split.coding("k4").bytes_per_sample] * 4 == [split.tensor.bytes_per_sample // 8] * 4


def test_host_withdraws_and_stops_on_sigterm(host_process) -> None:
    proc, _ = host_process
    proc.send_signal(signal.SIGTERM)
    rest = proc.communicate(timeout=20)[0]
    assert proc.returncode == 143  # 128 + SIGTERM, after one line: the unit counts it a clean stop
    assert "zeroconf record withdrawn" in rest and "host stopped" in rest
    assert "Traceback" not in rest


def test_host_stops_on_sigint(host_process) -> None:
    proc, _ = host_process
    proc.send_signal(signal.SIGINT)
    rest = proc.communicate(timeout=20)[0]
    assert proc.returncode == 130 and "zeroconf record withdrawn" in rest and "Traceback" not in rest


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_device_stops_cleanly_on_signal(host_process, mobilenet_bundle, sig) -> None:
    _, port = host_process
    proc = subprocess.Popen(
        [*script("split-device"), "run", str(mobilenet_bundle), "--camera", "synthetic",
         "--host", f"127.0.0.1:{port}", "--verbose"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    wait_for_line(proc, r"#2 ")
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "Traceback" not in err


def test_errors_are_one_line_and_exit_2(mobilenet_bundle, capsys, tmp_path) -> None:
    assert device_cli.main(["run", str(mobilenet_bundle), "--camera", "synthetic", "--split", "nope"]) == 2
    assert "split-device: error: unknown split 'nope'" in capsys.readouterr().err
    assert device_cli.main(["run", str(mobilenet_bundle), "--camera", "synthetic", "--host", "127.0.0.1:9",
                            "--split", "features_14_conv_2", "--timeout", "2"]) == 2
    assert "cannot connect to host 127.0.0.1:9" in capsys.readouterr().err
    # --split auto (the default) starts locally instead, says why, and keeps looking for the host.
    assert device_cli.main(["run", str(mobilenet_bundle), "--camera", "synthetic", "--host", "127.0.0.1:9",
                            "--timeout", "1", "--frames", "2", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "no host yet (cannot connect to host 127.0.0.1:9" in out and out.count("split=local") == 2
    assert out.count("why: no host for features_14_conv_2") == 2  # the smallest cut, without a calibration
    assert device_cli.main(["run", str(tmp_path), "--camera", "synthetic", "--split", "local"]) == 2
    assert "no manifest" in capsys.readouterr().err
    assert host_cli.main(["serve", str(tmp_path), "--no-zeroconf"]) == 2
    assert "split-host: error:" in capsys.readouterr().err


def test_local_split_needs_no_host(mobilenet_bundle, photos_dir, capsys) -> None:
    assert device_cli.main(["run", str(mobilenet_bundle), "--camera", str(photos_dir / "coffee.png"),
                            "--split", "local", "--verbose"]) == 0
    (row,) = [LINE.search(line) for line in capsys.readouterr().out.splitlines() if LINE.search(line)]
    assert row["label"] == "espresso" and row["split"] == "local"



@pytest.mark.parametrize("command", ["run", "calibrate"])
def test_a_host_without_a_port_is_a_usage_error(mobilenet_bundle, command, capsys) -> None:
    """Refused at once, not retried for ever: the address a newcomer copies from ``ip addr`` has no port."""
    with pytest.raises(SystemExit) as exit_info:
        device_cli.main([command, str(mobilenet_bundle), "--host", "127.0.0.1"])
    assert exit_info.value.code == 2
    assert "argument --host: 127.0.0.1: expected IP:PORT or auto (the host prints its port" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["calibrate", "--batch", "1", "--repeats", "1"], "--no-host"),
        (["run", "--camera", "synthetic", "--frames", "1", "--split", TEST_SPLITS[0]], "--split local"),
    ],
)
def test_no_host_found_suggests_the_flag_of_the_command_in_use(mobilenet_bundle, argv, flag, capsys) -> None:
    command, *options = argv
    assert device_cli.main([command, str(mobilenet_bundle), *options, "--interface", "127.0.0.1", "--timeout", "0.5"]) == 2
    err = capsys.readouterr().err
    assert "found by zeroconf" in err and f"run with {flag}" in err, err
