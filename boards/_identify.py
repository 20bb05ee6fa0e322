"""Tell which profile a board is from what Linux says about it: its model string and MemTotal."""

from __future__ import annotations

from boards._profile import BoardProfile
from boards._registry import BOARDS

_MB = 2**20


def model_family(model: str) -> str:
    """``"Raspberry Pi 4 Model B Rev 1.4\\x00"`` → ``"Raspberry Pi 4 Model B"``.

    The device tree's string ends in a NUL; the revision tracks PCB changes, not capabilities.
    """
    return model.strip("\x00 \t\n").split(" Rev ")[0]


def identify(model: str, mem_total_bytes: int | None = None) -> BoardProfile | None:
    """The profile of the board whose device-tree model is ``model``, or None if none fits.

    Memory variants (the 4's 2, 4 and 8 GB) share a model string, so MemTotal picks one.
    MemTotal is below the nominal RAM by the firmware carve-out and kernel reservations,
    and variants are a factor of two apart, so a variant of N MB matches MemTotal in
    (N/2, N]; a variant without a profile (a 1 GB Pi 4, a 16 GB Pi 5) matches none. With
    no MemTotal the smallest variant is assumed: a memory check against it never promises
    memory the board may not have.
    """
    family = model_family(model)
    variants = sorted((p for p in BOARDS.values() if family in p.models), key=lambda p: p.memory_mb)
    if mem_total_bytes is None:
        return variants[0] if variants else None
    for profile in variants:
        if profile.memory_mb * _MB // 2 < mem_total_bytes <= profile.memory_mb * _MB:
            return profile
    return None
