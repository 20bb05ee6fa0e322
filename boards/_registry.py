"""The boards splitedge knows, as data: one :class:`BoardProfile` per board and memory variant.

The memory reservations are estimates to refine with ``free -m`` on a freshly booted board:
``os_mb`` is the firmware's GPU carve-out plus kernel reservations (the gap between the
nominal RAM and MemTotal) plus what an idle Raspberry Pi OS Lite uses (systemd,
NetworkManager, sshd: 60-100 MB); ``runtime_mb`` is the resident size of our own process
before the first artifact is loaded (see :data:`_RUNTIME_MB`).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

from boards._profile import BoardProfile
from splitedge import ONNX, TFLITE

#: Resident MB of a board-side process with the backend imported and no artifact loaded.
#: Measured with Python 3.11 (VmRSS): interpreter + numpy + msgpack + zeroconf 39 MB,
#: OpenCV (the camera) 16 MB, onnxruntime 1.31 20 MB, ai-edge-litert 2.3 13 MB. Measured on
#: x86_64; the aarch64 builds of the same packages are of the same size.
_RUNTIME_MB = {ONNX: 75, TFLITE: 68}

_WHEELS = (
    "PyPI has aarch64 wheels of numpy, onnxruntime, ai-edge-litert and opencv-python-headless "
    "for Python 3.11 and 3.13, and none for 32-bit ARM: a 32-bit OS cannot install the board side",
    "onnxruntime needs 1.20 or later on Python 3.13 (Trixie)",
    "tflite-runtime 2.14, its last release, needs numpy<2 and has no Python 3.13 wheel: use ai-edge-litert",
)
_SMALL_MEMORY_WHEELS = (
    "never let pip build a package from source here: numpy or OpenCV compiled from an sdist runs out of memory",
)

_ZERO2W = "Raspberry Pi Zero 2 W"
_PI3BPLUS = "Raspberry Pi 3 Model B Plus"
_PI4 = "Raspberry Pi 4 Model B"
_PI5 = "Raspberry Pi 5 Model B"


def _pi4(gb: int, os_mb: int) -> BoardProfile:
    return BoardProfile(
        id=f"rpi4-{gb}gb", name=f"{_PI4} ({gb} GB)", soc="BCM2711", cpu="Cortex-A72", cores=4,
        # 1.5 GHz at launch; boards made since 2020 (C0 stepping) ship clocked at 1.8 GHz.
        clock_mhz=1800, memory_mb=gb * 1024,
        # ONNX on the 4 and 5: it is the format every bundle carries (the host runs the same
        # ONNX tails) and onnxruntime's NEON kernels are fast on the A72; with 2 GB or more its
        # heavier import (20 MB against 13 MB for LiteRT) does not matter.
        backend=ONNX,
        # All four cores: with a heatsink the 4 sustains them, and the rest of the process
        # (camera, asyncio loop, socket) mostly waits on I/O.
        threads=4,
        os_mb=os_mb, runtime_mb=_RUNTIME_MB[ONNX], models=(_PI4,), wheel_notes=_WHEELS,
    )


def _pi5(gb: int, os_mb: int) -> BoardProfile:
    return BoardProfile(
        id=f"rpi5-{gb}gb", name=f"{_PI5} ({gb} GB)", soc="BCM2712", cpu="Cortex-A76", cores=4,
        clock_mhz=2400, memory_mb=gb * 1024,
        # ONNX, as on the 4; the A76 adds the dot-product instructions that onnxruntime's
        # int8 kernels use, so quantized heads gain most here.
        backend=ONNX,
        threads=4,  # the active cooler (or the case fan) sustains four cores at 2.4 GHz
        os_mb=os_mb, runtime_mb=_RUNTIME_MB[ONNX], models=(_PI5,), wheel_notes=_WHEELS,
    )


_PROFILES = (
    BoardProfile(
        id="rpi-zero2w", name=_ZERO2W, soc="BCM2710A1", cpu="Cortex-A53", cores=4, clock_mhz=1000,
        memory_mb=512,
        # TFLite on the small boards: ai-edge-litert imports lighter than onnxruntime and
        # XNNPACK is tuned for the in-order A53, and here every MB counts.
        backend=TFLITE,
        # Three of four cores: the Zero has no heatsink and throttles under a sustained
        # four-core load, each XNNPACK thread adds its own scratch buffers to 512 MB, and
        # the camera, preprocessing and the socket need a core of their own or frames jitter.
        threads=3,
        # ~90 MB firmware carve-out and kernel (MemTotal reads ~420 MB) + ~60 MB OS Lite.
        os_mb=150, runtime_mb=_RUNTIME_MB[TFLITE], models=(_ZERO2W,),
        wheel_notes=_WHEELS + _SMALL_MEMORY_WHEELS,
    ),
    BoardProfile(
        id="rpi3b+", name="Raspberry Pi 3 Model B+", soc="BCM2837B0", cpu="Cortex-A53", cores=4,
        clock_mhz=1400, memory_mb=1024,
        backend=TFLITE,  # as on the Zero 2 W: the same A53 cores, 1 GB to share
        # All four cores: the 3B+ has a heat spreader and drops to 1.2 GHz above 60 °C
        # rather than stalling, which still beats three cores at full clock.
        threads=4,
        # ~110 MB firmware carve-out and kernel + ~70 MB OS Lite.
        os_mb=180, runtime_mb=_RUNTIME_MB[TFLITE], models=(_PI3BPLUS,),
        wheel_notes=_WHEELS + _SMALL_MEMORY_WHEELS,
    ),
    # The 4's MemTotal falls short of the nominal RAM by ~200, ~300 and ~380 MB (firmware
    # carve-out, kernel page tables that grow with RAM); ~80 MB OS Lite on top.
    _pi4(2, os_mb=280),
    _pi4(4, os_mb=380),
    _pi4(8, os_mb=460),
    # The 5's GPU takes its memory from CMA, so MemTotal is closer to nominal (~100-140 MB
    # short); its 16 KB-page kernel makes an idle OS Lite ~100 MB.
    _pi5(4, os_mb=200),
    _pi5(8, os_mb=240),
)

#: Every known board by id, read-only: ``BOARDS["rpi4-4gb"]``.
BOARDS: Mapping[str, BoardProfile] = MappingProxyType({p.id: p for p in _PROFILES})
