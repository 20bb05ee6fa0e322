"""Will a bundle's artifacts fit a board's memory? Checked before a bundle is built for it.

A board that runs out of memory does not fail politely: the kernel's OOM killer ends the
process mid-stream, or the Zero swaps to its SD card for minutes. Refusing at build time,
with the numbers, is the kinder failure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from boards._profile import BoardProfile
from splitedge.errors import BoardFitError

_MB = 2**20

#: Peak resident bytes per byte of artifact file while the runtime loads it. onnxruntime
#: holds the parsed model and its own copy of the weights at once while it builds the
#: session (the parsed model is freed afterwards): a 200 MB Gemm peaked at +418 MB. LiteRT
#: maps the file and packs weights once, so for it this errs on the safe side.
LOAD_FACTOR = 2.2

#: Per loaded artifact: kernels, the arena and the activations of one batch-1 frame at
#: 224x224. MobileNetV2 (13.3 MB) peaked at +50 MB, its head at features_14 (2.6 MB) at
#: +25 MB, both after one inference, with onnxruntime 1.31.
SESSION_MB = 20


@dataclass(frozen=True)
class ArtifactEstimate:
    """One artifact file and the memory it takes once loaded."""

    name: str
    file_bytes: int

    @property
    def loaded_bytes(self) -> int:
        """Peak resident bytes, rounded up to whole MB so that the figures in a message add up."""
        return math.ceil(self.file_bytes * LOAD_FACTOR / _MB + SESSION_MB) * _MB


@dataclass(frozen=True)
class FitReport:
    """Artifacts held at once on one board, against what that board has left for them."""

    board: BoardProfile
    artifacts: tuple[ArtifactEstimate, ...]  # largest loaded size first

    @property
    def needed_bytes(self) -> int:
        return sum(a.loaded_bytes for a in self.artifacts)

    @property
    def available_bytes(self) -> int:
        return self.board.available_mb * _MB

    @property
    def spare_bytes(self) -> int:
        """Memory left over once everything is loaded; negative when it does not fit."""
        return self.available_bytes - self.needed_bytes


def check_fits(board: BoardProfile, artifacts: Mapping[str, int]) -> FitReport:
    """Estimate the memory of loading every artifact at once; raise if it exceeds the board's.

    ``artifacts`` maps a name (the path in the bundle, which the message repeats) to a file
    size in bytes. Pass everything the board holds together: the device runtime keeps a
    split's head and the full model (its fallback when no host answers) loaded side by side.

    Raises :class:`BoardFitError` naming the board, the largest artifact, the estimate and
    the memory available; ``ValueError`` for no artifacts or a negative size.
    """
    if not artifacts:
        raise ValueError("no artifacts to check")
    if bad := [name for name, size in artifacts.items() if size < 0]:
        raise ValueError(f"negative file size for {', '.join(bad)}")
    estimates = sorted(
        (ArtifactEstimate(name, size) for name, size in artifacts.items()), key=lambda a: -a.loaded_bytes
    )
    report = FitReport(board, tuple(estimates))
    if report.spare_bytes < 0:
        raise BoardFitError(_refusal(report), report)
    return report


def _describe(artifact: ArtifactEstimate) -> str:
    return f"{artifact.name} ({artifact.file_bytes / _MB:.1f} MB → ~{artifact.loaded_bytes / _MB:.0f} MB loaded)"


def _refusal(report: FitReport) -> str:
    """E.g. "head/x.onnx (14.2 MB → ~51 MB loaded) with full/model.onnx (...) does not fit a ..."."""
    largest, *others = report.artifacts
    held = _describe(largest) + "".join(f" with {_describe(a)}" for a in others)
    board = report.board
    return (
        f"{held} does not fit a {board.name}: needs ~{report.needed_bytes / _MB:.0f} MB, "
        f"{board.available_mb} MB available ({board.memory_mb} MB less ~{board.reserved_mb} MB "
        f"for the OS and the runtime)"
    )
