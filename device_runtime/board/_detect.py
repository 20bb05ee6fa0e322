"""Which board is this, and which inference backends does it have? Read from /proc, not guessed.

Detection only reads files under ``root`` (``/`` on a board, a fake tree in tests) and asks
the interpreter for its architecture; nothing here imports a backend, so ``split-device
info`` stays instant on a Zero.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import struct
from dataclasses import dataclass, fields
from pathlib import Path

from boards import BoardProfile, identify
from device_runtime.bundle import FULL, HEAD, LOCAL, ONNX, TFLITE, Bundle

_GB = 2**30


@dataclass(frozen=True)
class DetectedBoard:
    """This machine as detection saw it, and the profile that applies (None: unknown board)."""

    profile: BoardProfile | None
    model: str | None  # as the machine names itself; None where /proc names none (most PCs, VMs)
    architecture: str  # of this interpreter, which is what wheels must match
    cores: int
    memory_bytes: int | None  # MemTotal
    python: str

    def problems(self) -> list[str]:
        """What stops the board side from installing or running well here."""
        if self.profile is not None and self.architecture != self.profile.architecture:
            return [
                f"this Python is {self.architecture}, the {self.profile.name} needs {self.profile.architecture}: "
                "onnxruntime, numpy and OpenCV have no 32-bit ARM wheels; install 64-bit Raspberry Pi OS"
            ]
        return []

    def describe(self) -> str:
        """One line: the profile, or "unknown board" with the machine's model when it has one."""
        if self.profile is not None:
            return f"{self.profile.name} [{self.profile.id}]"
        if self.model is None:
            return "unknown board"
        return f"unknown board: {self.model}{self._memory(' with ')} has no profile"

    def machine(self) -> str:
        """One line: architecture, cores, memory and Python, e.g. "x86_64, 2 cores, 7.8 GB, Python 3.11.7"."""
        return f"{self.architecture}, {self.cores} cores{self._memory(', ')}, Python {self.python}"

    def to_dict(self) -> dict[str, object]:
        """The machine as detected, for JSON; the profile itself is :meth:`BoardProfile.to_dict`."""
        data = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "profile"}
        return {"id": self.profile.id if self.profile else None, **data, "problems": self.problems()}

    def _memory(self, prefix: str) -> str:
        return "" if self.memory_bytes is None else f"{prefix}{self.memory_bytes / _GB:.1f} GB"


@dataclass(frozen=True)
class InstalledBackend:
    """An inference runtime this interpreter can import, found without importing it."""

    module: str
    format: str  # the artifact format it runs (a BoardProfile.backend value)
    version: str | None  # None when the module is there but its distribution metadata is not

    def describe(self) -> str:
        """E.g. "onnxruntime 1.31.1 (onnx)"."""
        return f"{self.module} {self.version or '(version unknown)'} ({self.format})"


#: (module, artifact format, distributions that install it). Version lookups go by
#: distribution name because scanning every installed distribution for the module's owner
#: (importlib.metadata.packages_distributions) takes most of a second in a large environment.
_BACKEND_MODULES = (
    ("onnxruntime", ONNX, ("onnxruntime", "onnxruntime-gpu")),
    ("ai_edge_litert", TFLITE, ("ai-edge-litert", "ai-edge-litert-nightly")),
    ("tflite_runtime", TFLITE, ("tflite-runtime",)),
)


def installed_backends() -> tuple[InstalledBackend, ...]:
    """The inference runtimes installed here, with versions; none is imported (onnxruntime alone costs 20 MB)."""
    found = []
    for module, fmt, distributions in _BACKEND_MODULES:
        if importlib.util.find_spec(module) is not None:
            found.append(InstalledBackend(module, fmt, _version(distributions)))
    return tuple(found)


def detect_board(root: Path = Path("/")) -> DetectedBoard:
    """Detect the board from ``root``'s /proc: the device-tree model first, cpuinfo's Model line
    second (kernels without a device tree in /proc), MemTotal to tell memory variants apart."""
    cpuinfo = _read(root / "proc/cpuinfo") or ""
    model = _read(root / "proc/device-tree/model") or _cpuinfo_field(cpuinfo, "Model")
    model = model.strip("\x00 \t\n") if model else None
    memory = _mem_total(_read(root / "proc/meminfo") or "")
    processors = sum(1 for line in cpuinfo.splitlines() if line.split(":")[0].strip() == "processor")
    return DetectedBoard(
        profile=identify(model, memory) if model else None,
        model=model or None,
        architecture=_architecture(),
        cores=processors or os.cpu_count() or 1,
        memory_bytes=memory,
        python=platform.python_version(),
    )


def _read(path: Path) -> str | None:
    # A probe, not an input: a file that is absent (not Linux, no device tree) or unreadable
    # simply tells us nothing.
    try:
        return path.read_bytes().decode("utf-8", "replace")
    except OSError:
        return None


def _cpuinfo_field(cpuinfo: str, name: str) -> str | None:
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == name:
            return value.strip()
    return None


def _mem_total(meminfo: str) -> int | None:
    """Bytes from the ``MemTotal:  3884376 kB`` line, None if it is missing or malformed."""
    for line in meminfo.splitlines():
        fields = line.split()
        if fields[:1] == ["MemTotal:"] and len(fields) == 3 and fields[1].isdigit() and fields[2] == "kB":
            return int(fields[1]) * 1024
    return None


def _architecture() -> str:
    """The interpreter's architecture. Raspberry Pi OS 32-bit boots a 64-bit kernel on the 3,
    4 and 5, where ``platform.machine()`` says aarch64 of a 32-bit Python; the pointer size
    tells the truth, and it is what decides which wheels install."""
    machine = platform.machine()
    if machine in ("aarch64", "arm64") and struct.calcsize("P") == 4:
        return "armv7l"
    return machine


def _version(distributions: tuple[str, ...]) -> str | None:
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None



def resolve_backend(requested: str, bundle: Bundle, split_id: str, board: DetectedBoard) -> str:
    """The artifact format to run: as asked, or with ``auto`` the board profile's preference
    when the bundle has that artifact for this split and its runtime is installed, else ONNX."""
    if requested != "auto":
        return requested
    preferred = board.profile.backend if board.profile is not None else ONNX
    role = FULL if split_id == LOCAL else HEAD
    installed = {b.format for b in installed_backends()}
    if preferred in installed and bundle.has(split_id, role, fmt=preferred):
        return preferred
    return ONNX
