"""The shape of a board profile: one frozen record per board, checked when it is made."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from splitedge import FORMATS

#: Artifact formats a profile may recommend; the names match the bundle's artifact formats.
BACKENDS = FORMATS

#: Python of each current Raspberry Pi OS release (64-bit), oldest first. A board-side wheel
#: must exist for these, so they are the versions the profiles promise.
RASPBERRY_PI_OS_PYTHONS: tuple[tuple[str, str], ...] = (("Bookworm", "3.11"), ("Trixie", "3.13"))


@dataclass(frozen=True)
class BoardProfile:
    """What splitedge needs to know about one board (one memory variant of a model).

    Memory is in MB of 2**20 bytes, as ``free -m`` and the product names ("4 GB") count it.
    """

    id: str  # registry key and the value of ``--board``, e.g. "rpi4-4gb"
    name: str  # for people, e.g. "Raspberry Pi 4 Model B (4 GB)"
    soc: str
    cpu: str  # core type, e.g. "Cortex-A72"
    cores: int
    clock_mhz: int
    memory_mb: int  # installed RAM, nominal
    backend: str  # recommended artifact format, one of BACKENDS
    threads: int  # recommended inference threads
    os_mb: int  # firmware carve-out, kernel and an idle Raspberry Pi OS Lite: never ours
    runtime_mb: int  # Python with numpy, msgpack, zeroconf, OpenCV and the backend imported
    #: How the board names itself in /proc/device-tree/model, without the " Rev x.y" suffix
    #: (the revision tracks PCB changes, not anything a profile depends on).
    models: tuple[str, ...]
    # 64-bit Raspberry Pi OS only: onnxruntime, numpy and OpenCV publish no 32-bit ARM wheels.
    architecture: str = "aarch64"
    pythons: tuple[tuple[str, str], ...] = RASPBERRY_PI_OS_PYTHONS
    wheel_notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Profiles are data that people extend; a bad one should fail at import, not on a board.
        if self.backend not in BACKENDS:
            raise ValueError(f"{self.id}: backend {self.backend!r} is not one of {BACKENDS}")
        if not 1 <= self.threads <= self.cores:
            raise ValueError(f"{self.id}: {self.threads} threads for {self.cores} cores")
        if self.available_mb <= 0:
            raise ValueError(f"{self.id}: {self.reserved_mb} MB reserved of {self.memory_mb} MB")

    @property
    def reserved_mb(self) -> int:
        """Memory the models cannot have: the OS and the runtime before any artifact is loaded."""
        return self.os_mb + self.runtime_mb

    @property
    def available_mb(self) -> int:
        """Memory left for loaded artifacts (weights, packed copies, activations)."""
        return self.memory_mb - self.reserved_mb

    def to_dict(self) -> dict[str, object]:
        """Every field plus the derived memory figures, ready for JSON."""
        return {**asdict(self), "reserved_mb": self.reserved_mb, "available_mb": self.available_mb}
