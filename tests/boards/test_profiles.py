"""The registry holds the boards the design names, each consistent with itself, and
device-tree model strings and MemTotal pick the right one."""

from __future__ import annotations

import dataclasses

import pytest

import boards
from boards import BOARDS, BoardProfile, identify, model_family

GB = 2**30


def test_public_api_is_pinned() -> None:
    assert sorted(boards.__all__) == [
        "ArtifactEstimate", "BACKENDS", "BOARDS", "BoardFitError", "BoardProfile", "FitReport",
        "LOAD_FACTOR", "RASPBERRY_PI_OS_PYTHONS", "SESSION_MB", "check_fits", "identify", "model_family",
    ]


def test_registry_has_every_board_keyed_by_its_id() -> None:
    assert sorted(BOARDS) == ["rpi-zero2w", "rpi3b+", "rpi4-2gb", "rpi4-4gb", "rpi4-8gb", "rpi5-4gb", "rpi5-8gb"]
    assert all(key == profile.id for key, profile in BOARDS.items())
    with pytest.raises(TypeError):
        BOARDS["mine"] = BOARDS["rpi5-8gb"]  # type: ignore[index]


@pytest.mark.parametrize("profile", BOARDS.values(), ids=list(BOARDS))
def test_every_profile_targets_64_bit_raspberry_pi_os(profile: BoardProfile) -> None:
    assert profile.architecture == "aarch64"
    assert [python for _, python in profile.pythons] == ["3.11", "3.13"]
    assert profile.cores == 4 and 1 <= profile.threads <= profile.cores
    assert 0 < profile.reserved_mb < profile.memory_mb
    assert any("32-bit" in note for note in profile.wheel_notes)


def test_small_boards_get_tflite_and_the_zero_spares_a_core() -> None:
    assert {p.id: p.backend for p in BOARDS.values()} == {
        "rpi-zero2w": "tflite", "rpi3b+": "tflite",
        "rpi4-2gb": "onnx", "rpi4-4gb": "onnx", "rpi4-8gb": "onnx", "rpi5-4gb": "onnx", "rpi5-8gb": "onnx",
    }
    assert BOARDS["rpi-zero2w"].threads < BOARDS["rpi-zero2w"].cores
    assert BOARDS["rpi-zero2w"].available_mb < 512 - 150  # the OS and the runtime leave the Zero well under 400 MB


def test_specifications() -> None:
    zero, pi3, pi4, pi5 = (BOARDS[i] for i in ("rpi-zero2w", "rpi3b+", "rpi4-4gb", "rpi5-8gb"))
    assert (zero.soc, zero.cpu, zero.clock_mhz, zero.memory_mb) == ("BCM2710A1", "Cortex-A53", 1000, 512)
    assert (pi3.soc, pi3.cpu, pi3.clock_mhz, pi3.memory_mb) == ("BCM2837B0", "Cortex-A53", 1400, 1024)
    assert (pi4.soc, pi4.cpu, pi4.memory_mb) == ("BCM2711", "Cortex-A72", 4096)
    assert (pi5.soc, pi5.cpu, pi5.clock_mhz, pi5.memory_mb) == ("BCM2712", "Cortex-A76", 2400, 8192)


def test_a_bad_profile_is_refused_when_made() -> None:
    good = BOARDS["rpi5-4gb"]
    with pytest.raises(ValueError, match="backend 'tensorrt'"):
        dataclasses.replace(good, backend="tensorrt")
    with pytest.raises(ValueError, match="8 threads for 4 cores"):
        dataclasses.replace(good, threads=8)
    with pytest.raises(ValueError, match="reserved of 256 MB"):
        dataclasses.replace(good, memory_mb=256)


def test_to_dict_adds_the_memory_budget() -> None:
    data = BOARDS["rpi-zero2w"].to_dict()
    assert data["available_mb"] + data["reserved_mb"] == data["memory_mb"] == 512
    assert data["models"] == ("Raspberry Pi Zero 2 W",)


@pytest.mark.parametrize(
    ("model", "mem_total", "expected"),
    [
        ("Raspberry Pi Zero 2 W Rev 1.0\x00", 427 * 2**20, "rpi-zero2w"),
        ("Raspberry Pi 3 Model B Plus Rev 1.3\x00", 906 * 2**20, "rpi3b+"),
        ("Raspberry Pi 4 Model B Rev 1.4\x00", int(1.85 * GB), "rpi4-2gb"),
        ("Raspberry Pi 4 Model B Rev 1.4\x00", int(3.7 * GB), "rpi4-4gb"),
        ("Raspberry Pi 4 Model B Rev 1.4\x00", int(7.6 * GB), "rpi4-8gb"),
        ("Raspberry Pi 5 Model B Rev 1.0\x00", int(3.95 * GB), "rpi5-4gb"),
        ("Raspberry Pi 5 Model B Rev 1.0\x00", int(7.9 * GB), "rpi5-8gb"),
        ("Raspberry Pi 4 Model B Rev 1.1", None, "rpi4-2gb"),  # no MemTotal: the smallest variant
        ("Raspberry Pi 4 Model B Rev 1.1", int(0.9 * GB), None),  # the 1 GB Pi 4 has no profile
        ("Raspberry Pi 5 Model B Rev 1.1", int(15.8 * GB), None),  # nor the 16 GB Pi 5
        ("Raspberry Pi 3 Model B Rev 1.2", GB, None),  # the 3B is not the 3B+
        ("linux,dummy-virt", None, None),
    ],
)
def test_identify(model: str, mem_total: int | None, expected: str | None) -> None:
    profile = identify(model, mem_total)
    assert (profile.id if profile else None) == expected


def test_model_family_drops_the_revision_and_the_nul() -> None:
    assert model_family("Raspberry Pi 3 Model B Plus Rev 1.3\x00") == "Raspberry Pi 3 Model B Plus"
