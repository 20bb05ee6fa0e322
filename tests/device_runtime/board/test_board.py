"""Board detection from fake /proc trees, backend discovery, and ``split-device info``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import device_runtime.board._detect as board_module
import device_runtime.cli as cli
from boards import BOARDS
from device_runtime.board._detect import DetectedBoard, detect_board, installed_backends

GB_KB = 2**20  # /proc/meminfo counts in kB


def fake_proc(
    root: Path, *, model: str | None = None, cpuinfo_model: str | None = None,
    mem_total_kb: int | None = None, processors: int = 4,
) -> Path:
    """A /proc as a Raspberry Pi's kernel writes it: the device-tree model ends in a NUL."""
    proc = root / "proc"
    proc.mkdir(parents=True)
    if model is not None:
        (proc / "device-tree").mkdir()
        (proc / "device-tree" / "model").write_bytes(model.encode() + b"\x00")
    lines = [f"processor\t: {i}\nBogoMIPS\t: 108.00\n" for i in range(processors)]
    if cpuinfo_model is not None:
        lines.append(f"Revision\t: c03114\nModel\t\t: {cpuinfo_model}\n")
    (proc / "cpuinfo").write_text("\n".join(lines))
    if mem_total_kb is not None:
        (proc / "meminfo").write_text(f"MemTotal:       {mem_total_kb} kB\nMemFree:         123456 kB\n")
    return root


@pytest.mark.parametrize(
    ("model", "mem_total_kb", "expected"),
    [
        ("Raspberry Pi Zero 2 W Rev 1.0", 437_000, "rpi-zero2w"),
        ("Raspberry Pi 3 Model B Plus Rev 1.3", 927_000, "rpi3b+"),
        ("Raspberry Pi 4 Model B Rev 1.2", 1_894_788, "rpi4-2gb"),
        ("Raspberry Pi 4 Model B Rev 1.4", 3_884_376, "rpi4-4gb"),
        ("Raspberry Pi 4 Model B Rev 1.4", 7_998_464, "rpi4-8gb"),
        ("Raspberry Pi 5 Model B Rev 1.0", 4_139_584, "rpi5-4gb"),
        ("Raspberry Pi 5 Model B Rev 1.0", 8_245_424, "rpi5-8gb"),
    ],
)
def test_each_board_is_detected_from_its_device_tree(
    tmp_path: Path, model: str, mem_total_kb: int, expected: str
) -> None:
    board = detect_board(fake_proc(tmp_path, model=model, mem_total_kb=mem_total_kb))
    assert board.profile is BOARDS[expected]
    assert board.model == model  # the NUL is gone
    assert (board.cores, board.memory_bytes) == (4, mem_total_kb * 1024)
    assert board.describe() == f"{BOARDS[expected].name} [{expected}]"


def test_cpuinfo_model_line_is_the_fallback(tmp_path: Path) -> None:
    root = fake_proc(tmp_path, cpuinfo_model="Raspberry Pi 4 Model B Rev 1.5", mem_total_kb=4 * GB_KB - 200_000)
    assert detect_board(root).profile is BOARDS["rpi4-4gb"]


def test_the_device_tree_wins_over_cpuinfo(tmp_path: Path) -> None:
    root = fake_proc(tmp_path, model="Raspberry Pi 5 Model B Rev 1.0", cpuinfo_model="Raspberry Pi 4 Model B Rev 1.4")
    assert detect_board(root).profile is BOARDS["rpi5-4gb"]  # no meminfo: the smallest variant


def test_a_machine_without_a_model_is_an_unknown_board(tmp_path: Path) -> None:
    board = detect_board(fake_proc(tmp_path, mem_total_kb=8 * GB_KB, processors=2))
    assert board.profile is None and board.model is None
    assert board.describe() == "unknown board"
    assert board.machine().startswith(f"{board.architecture}, 2 cores, 8.0 GB, Python ")


def test_a_raspberry_pi_without_a_profile_says_so(tmp_path: Path) -> None:
    board = detect_board(fake_proc(tmp_path, model="Raspberry Pi 4 Model B Rev 1.1", mem_total_kb=944_000))
    assert board.describe() == "unknown board: Raspberry Pi 4 Model B Rev 1.1 with 0.9 GB has no profile"


def test_an_empty_root_still_describes_the_machine(tmp_path: Path) -> None:
    board = detect_board(tmp_path)
    assert board.profile is None and board.memory_bytes is None and board.cores >= 1


def test_this_machine_is_an_unknown_board() -> None:
    board = detect_board()
    assert board.profile is None
    assert board.architecture == "x86_64" and board.cores >= 1 and board.memory_bytes


def test_32_bit_python_on_a_64_bit_kernel_is_a_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(board_module.platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(board_module.struct, "calcsize", lambda fmt: 4)
    assert board_module._architecture() == "armv7l"
    board = DetectedBoard(BOARDS["rpi4-4gb"], "Raspberry Pi 4 Model B Rev 1.4", "armv7l", 4, None, "3.11.2")
    (problem,) = board.problems()
    assert "install 64-bit Raspberry Pi OS" in problem


def test_installed_backends_lists_onnxruntime_without_importing_it() -> None:
    was_imported = "onnxruntime" in sys.modules
    backends = {b.module: b for b in installed_backends()}
    assert backends["onnxruntime"].format == "onnx" and backends["onnxruntime"].version
    assert ("onnxruntime" in sys.modules) == was_imported


def test_info_on_this_machine_prints_unknown_board_and_the_backends(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "board     unknown board\n" in out
    assert "x86_64" in out and "onnxruntime" in out
    assert "profile   none" in out
    assert "link      rate timed by the kernel's: TCP_INFO, ACK stamps, reply stamps\n" in out


def test_info_says_when_the_device_times_the_link_itself(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from device_runtime.link import KernelTimingSupport

    monkeypatch.setattr(cli, "kernel_timing_support", lambda: KernelTimingSupport(False, False, False, "no TCP_INFO"))
    assert cli.main(["info"]) == 0
    assert "link      rate timed by the device's own timing (no TCP_INFO)\n" in capsys.readouterr().out
    assert cli.main(["info", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["link_timing"]["tcp_info"] is False


def test_info_json_parses(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["info", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["board"]["id"] is None and report["profile"] is None
    assert report["board"]["cores"] >= 1
    assert "onnxruntime" in [b["module"] for b in report["backends"]]


def test_info_on_a_pi_shows_the_profile_in_force(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    root = fake_proc(tmp_path, model="Raspberry Pi Zero 2 W Rev 1.0", mem_total_kb=437_000)
    monkeypatch.setattr(cli, "detect_board", lambda: detect_board(root))
    monkeypatch.setattr(cli, "installed_backends", lambda: ())
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "board     Raspberry Pi Zero 2 W [rpi-zero2w]" in out
    assert "backends  none: pip install 'splitedge[device]'" in out
    assert "profile   tflite backend (not installed here), 3 threads; 294 MB for artifacts" in out
    assert cli.main(["info", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["profile"]["threads"] == 3
