"""The tails a host serves: one onnxruntime session per (bundle, split), created at start.

Loading everything up front makes a broken bundle fail at start, not on the first request
from a board in the field. Lookups that fail raise :class:`ProtocolError` with the typed
code the device receives (``unknown_bundle``, ``unknown_split``, ``bad_request``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterable

import numpy as np

from device_runtime.backend import Backend, check_input, load_backend
from device_runtime.bundle import Bundle
from device_runtime.errors import BackendError, BundleError, ProtocolError


class TailRegistry:
    """Every tail of every bundle given, ready to run."""

    def __init__(self, bundles: Iterable[Bundle], threads: int | None = None) -> None:
        self.bundles: dict[str, Bundle] = {}
        self.tails: dict[tuple[str, str], Backend] = {}
        for bundle in bundles:
            if bundle.id in self.bundles:
                raise BundleError(f"{bundle.root}: bundle {bundle.id} is already served from {self.bundles[bundle.id].root}")
            self.bundles[bundle.id] = bundle
            for split in bundle.manifest.splits:
                if bundle.has(split.id, "tail"):
                    self.tails[(bundle.id, split.id)] = load_backend(bundle.artifact(split.id, "tail"), threads=threads)

    @classmethod
    def from_paths(cls, paths: Iterable[str | Path], threads: int | None = None) -> "TailRegistry":
        return cls((Bundle.load(p, roles=("tail",)) for p in paths), threads=threads)

    def served(self) -> dict[str, list[str]]:
        """bundle id → split ids with a tail here (what ``hello`` and zeroconf announce)."""
        served: dict[str, list[str]] = {bundle_id: [] for bundle_id in self.bundles}
        for bundle_id, split_id in self.tails:
            served[bundle_id].append(split_id)
        return served

    def lookup(self, bundle_id: object, split_id: object) -> Backend:
        if bundle_id not in self.bundles:
            raise ProtocolError(
                f"bundle {bundle_id!r} is not served here; served: {', '.join(self.bundles) or 'none'}",
                code="unknown_bundle",
            )
        tail = self.tails.get((bundle_id, split_id))  # type: ignore[arg-type]
        if tail is None:
            known = ", ".join(s for b, s in self.tails if b == bundle_id)
            raise ProtocolError(f"split {split_id!r} of bundle {bundle_id} has no tail here; splits: {known}", code="unknown_split")
        return tail

    def lookup_for(self, bundle_id: object, split_id: object, tensor: np.ndarray) -> Backend:
        """The tail for a request, after checking the tensor fits it (``bad_request`` if not)."""
        tail = self.lookup(bundle_id, split_id)
        try:
            check_input(tensor, tail.input_shape, tail.input_dtype, f"tail of split {split_id}")
        except BackendError as exc:
            raise ProtocolError(str(exc), code="bad_request") from exc
        return tail


def timed_run(tail: Backend, tensor: np.ndarray) -> tuple[np.ndarray, float]:
    """Run a tail in a worker thread; the compute time (ms) goes back to the device in the reply."""
    start = time.perf_counter()
    output = tail.run(tensor)
    return output, (time.perf_counter() - start) * 1000.0
