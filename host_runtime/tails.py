"""The tails a host serves: one onnxruntime session per (bundle, split), created at start.

Loading everything up front makes a broken bundle fail at start, not on the first request
from a board in the field. Lookups that fail raise :class:`ProtocolError` with the typed
code the device receives (``unknown_bundle``, ``unknown_split``, ``bad_request``).

A chain's stages and a semantic split's fragments are served as tails named ``<split>#<k>``
(:func:`~device_runtime.bundle.stage_id`).
A bundle with its full model is also served as the split ``offload`` (DSC Eq. 5: the
input crosses the link and the whole network runs here), the other corner of the table a
board calibrates. The host times its own tails for that table
(:mod:`host_runtime.profiling`): a board cannot measure the host's compute.

Tails run on onnxruntime's CUDA provider when the host has one (``--device auto``, the
default) and on the CPU otherwise; the device actually used is read back from the sessions,
since onnxruntime quietly falls back to the CPU when CUDA's libraries cannot be loaded.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from device_runtime.bundle import FULL, LOCAL, OFFLOAD, TAIL, Bundle, stage_id
from device_runtime.engine.backend import Backend, OnnxBackend, check_input
from splitedge.errors import BackendError, BundleError, ProtocolError

DEVICES = ("auto", "cpu", "cuda")
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"


def providers_for(device: str) -> list[str]:
    """onnxruntime providers for ``--device``: ``auto`` takes CUDA when this onnxruntime has it.

    CUDA keeps the CPU provider behind it for the few operators CUDA lacks.
    """
    import onnxruntime as ort

    if device not in DEVICES:
        raise BackendError(f"device {device!r} is not one of {', '.join(DEVICES)}")
    available = ort.get_available_providers()
    if device == "cpu" or (device == "auto" and CUDA not in available):
        return [CPU]
    if CUDA not in available:
        raise BackendError(
            f"--device cuda: this onnxruntime has no {CUDA} (it has {', '.join(available)}); "
            "install onnxruntime-gpu or use --device cpu"
        )
    return [CUDA, CPU]


class TailRegistry:
    """Every tail of every bundle given, ready to run."""

    def __init__(self, bundles: Iterable[Bundle], threads: int | None = None, device: str = "auto") -> None:
        self.bundles: dict[str, Bundle] = {}
        self.tails: dict[tuple[str, str], OnnxBackend] = {}
        providers = providers_for(device)
        for bundle in bundles:
            if bundle.id in self.bundles:
                raise BundleError(f"{bundle.root}: bundle {bundle.id} is already served from {self.bundles[bundle.id].root}")
            self.bundles[bundle.id] = bundle
            for split in bundle.manifest.splits:
                if bundle.has(split.id, TAIL):
                    self.tails[(bundle.id, split.id)] = OnnxBackend(bundle.artifact(split.id, TAIL), threads, providers)
                for part in split.parts:  # a chain's stages, a semantic split's fragments: each a tail of its own
                    if part.artifacts:
                        self.tails[(bundle.id, stage_id(split.id, part.index))] = OnnxBackend(
                            bundle.stage_artifact(split.id, part.index), threads, providers)
            if bundle.has(LOCAL, FULL):
                self.tails[(bundle.id, OFFLOAD)] = OnnxBackend(bundle.artifact(LOCAL, FULL), threads, providers)
        on_cuda = [CUDA in tail.session.get_providers() for tail in self.tails.values()]
        if device == "cuda" and not all(on_cuda):
            raise BackendError(f"--device cuda: onnxruntime fell back to the CPU for {on_cuda.count(False)} tails "
                               "(CUDA libraries missing?); see onnxruntime's log")
        #: Where the tails run, as hello and the start-up line report it.
        self.device = "cuda" if on_cuda and all(on_cuda) else "cpu"

    @classmethod
    def from_paths(cls, paths: Iterable[str | Path], threads: int | None = None, device: str = "auto") -> "TailRegistry":
        return cls((Bundle.load(p, roles=(TAIL, FULL)) for p in paths), threads=threads, device=device)

    def served(self) -> dict[str, list[str]]:
        """bundle id → split ids with a tail here, and chain stages and semantic fragments as
        ``<split>#<k>`` (what ``hello`` and zeroconf announce)."""
        served: dict[str, list[str]] = {bundle_id: [] for bundle_id in self.bundles}
        for bundle_id, split_id in self.tails:
            served[bundle_id].append(split_id)
        return served

    def lookup(self, bundle_id: object, split_id: object) -> Backend:
        if not isinstance(bundle_id, str) or bundle_id not in self.bundles:
            raise ProtocolError(
                f"bundle {bundle_id!r} is not served here; served: {', '.join(self.bundles) or 'none'}",
                code="unknown_bundle",
            )
        tail = self.tails.get((bundle_id, split_id)) if isinstance(split_id, str) else None
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


def run_batch(tail: Backend, tensors: Sequence[np.ndarray]) -> tuple[np.ndarray, float, float]:
    """Run requests as one batch in a worker thread: concatenated along the batch axis (a lone
    request is not copied). Returns the output (sum of B, ...), the perf_counter time the tail
    started (each request's queue time ends there) and the ms of compute."""
    x = tensors[0] if len(tensors) == 1 else np.concatenate(tensors)
    start = time.perf_counter()
    output = tail.run(x)
    compute_ms = (time.perf_counter() - start) * 1000.0
    if output.shape[:1] != x.shape[:1]:
        raise BackendError(f"{tail.name} returned {output.shape[:1]} samples for a batch of {x.shape[0]}")
    return output, start, compute_ms
