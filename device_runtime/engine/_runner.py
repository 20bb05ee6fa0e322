"""What the board runs: its sessions (heads, the full model) and the link payload.

Sessions are created once per artifact and kept for the run. The stream that drives them
(capture, batching, overlap, fallback) is :mod:`device_runtime.stream._pipeline`. With
``split == "local"`` the full model runs on the board and no host is needed.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from device_runtime.bundle import (
    CUT, FLOAT32, FULL, HEAD, INT8, LOCAL, OFFLOAD, ONNX, Bundle, PRECISIONS as ARTIFACT_PRECISIONS,
)
from device_runtime.engine._backend import Backend, load_backend
from device_runtime.engine._preprocess_path import preprocess_path, preprocessor
from device_runtime.wire import quantize
from device_runtime.wire.coding import CodedCut, CutCoding
from splitedge.errors import BundleError

AUTO = "auto"
#: How much top-1 (as a fraction) ``auto`` gives up for an int8 artifact: one point.
INT8_MARGIN = 0.01
#: What a runner may be asked to run: an artifact precision, or the best the bundle has per artifact.
PRECISIONS = (AUTO, *ARTIFACT_PRECISIONS)


def prefers_int8(bundle: Bundle, split_id: str, role: str, fmt: str, margin: float = INT8_MARGIN) -> bool:
    """``--precision auto``'s choice for one artifact: int8 only where the bundle measured its top-1
    within ``margin`` of the float32 twin's (the exporter measures every int8 build), or where
    int8 is all there is (a slice cut ``--precision int8``). Unmeasured int8 is not preferred:
    a faster head that answers wrongly is no gain."""
    int8 = bundle.find(split_id, role, fmt, INT8)
    if int8 is None:
        return False
    float32 = bundle.find(split_id, role, fmt, FLOAT32)
    if float32 is None:
        return True
    if int8.accuracy is None or float32.accuracy is None:
        return False
    return int8.accuracy >= float32.accuracy - margin


def default_split(bundle: Bundle) -> str:
    """The split whose cut tensor is smallest: the cheapest to send when nothing else is known."""
    splits = bundle.manifest.splits
    if not splits:
        return LOCAL
    return min(splits, key=lambda s: (s.tensor.bytes_per_sample, s.position)).id


class DeviceRunner:
    """Runs frames of one bundle, on the board alone or split with a host."""

    def __init__(
        self, bundle: Bundle, threads: int | None = None, backend: str = ONNX, transmit: str = AUTO,
        precision: str = AUTO, preprocess: str = AUTO,
    ) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
        self.bundle = bundle
        self.threads = threads
        self.backend = backend  # the artifact format the board runs, one of the bundle's FORMATS
        self.transmit = transmit  # auto: uint8 where the split has quantization parameters, else float32
        self.precision = precision  # auto: int8 where its measured accuracy is within INT8_MARGIN (prefers_int8)
        self._sessions: dict[tuple[str, str], Backend] = {}
        self._options: dict[str, tuple[str, CutCoding | None]] = {}  # option -> its split, its coding
        self.labels = bundle.manifest.model.labels
        self.spec = bundle.manifest.model.preprocess
        # auto: OpenCV's where the bundle measured it answering as the exact path does (preprocess_path)
        self.preprocess_path = preprocess_path(self.spec, preprocess)
        self._preprocess = preprocessor(self.preprocess_path)

    def artifact_precision(self, split_id: str, role: str) -> str:
        """The precision of the artifact this runner runs for ``split_id``'s ``role``."""
        if self.precision != AUTO:
            return self.precision
        return INT8 if prefers_int8(self.bundle, split_id, role, self.backend) else FLOAT32

    def session(self, split_id: str, role: str) -> Backend:
        """Created on first use and kept: one session per artifact for the whole run."""
        key = (split_id, role)
        if key not in self._sessions:
            precision = self.artifact_precision(split_id, role)
            path = self.bundle.artifact(split_id, role, fmt=self.backend, precision=precision)
            self._sessions[key] = load_backend(path, fmt=self.backend, threads=self.threads)
        return self._sessions[key]

    def warm_up(self, split_id: str) -> None:
        """Run one input through the board's part first: the first real frame would otherwise pay for
        onnxruntime's lazy allocations (about 10x a normal frame on this machine)."""
        if split_id == OFFLOAD:
            return
        role = FULL if split_id == LOCAL else HEAD
        shape = (1, *self.bundle.manifest.model.input_shape)
        self.session(self.option(split_id)[0], role).run(np.zeros(shape, dtype=np.float32))

    def preprocess(self, image: np.ndarray) -> np.ndarray:
        """A camera frame as the model's input, (1, *input_shape) float32, by :attr:`preprocess_path`."""
        return self._preprocess(image, self.spec)

    def run_full(self, x: np.ndarray) -> tuple[np.ndarray, float]:
        """The full model here: logits and ms."""
        start = time.perf_counter()
        logits = self.session(LOCAL, FULL).run(x)
        return logits, (time.perf_counter() - start) * 1000.0

    def option(self, option: str) -> tuple[str, CutCoding | None]:
        """The split an option runs (a split's id, or ``<split>@k4``) and the coding it sends its
        cut in (None: none); :class:`BundleError` for one the bundle has not."""
        known = self._options.get(option)
        if known is None:
            if option in (LOCAL, OFFLOAD):
                known = (option, None)
            else:
                split, coding = self.bundle.manifest.option(option)
                known = (split.id, None if coding is None else CutCoding.of(coding))
            self._options[option] = known
        return known

    def run_head(self, option: str, x: np.ndarray) -> tuple[np.ndarray, float]:
        """The head of an option's split: the cut tensor and ms."""
        start = time.perf_counter()
        cut = self.session(self.option(option)[0], HEAD).run(x)
        return cut, (time.perf_counter() - start) * 1000.0

    def run_head_exit(self, option: str, x: np.ndarray) -> tuple[tuple[np.ndarray, np.ndarray], float]:
        """The head of an option's split with its early exit (issue 48): ``(cut, exit_logits)`` from one
        run of the head, and ms. The exit is the head's second output, so what it costs beyond
        :meth:`run_head` is the exit's own layers. :class:`BundleError` for a split without an exit."""
        split_id = self.option(option)[0]
        found = self.bundle.manifest.split(split_id).exit if split_id not in (LOCAL, OFFLOAD) else None
        if found is None:
            raise BundleError(f"split {split_id} has no early exit; rebuild the bundle with split-export build --exits")
        start = time.perf_counter()
        cut, logits = self.session(split_id, HEAD).run_outputs(x, (CUT, found.output))
        return (cut, logits), (time.perf_counter() - start) * 1000.0

    def board_part(self, option: str, x: np.ndarray) -> tuple[tuple[np.ndarray, dict[str, Any]], float]:
        """An option's head and what goes on the link of its cut (:meth:`payload`: a coded
        option's encoding is part of the board's time), and the ms of both."""
        start = time.perf_counter()
        sent = self.payload(option, self.session(self.option(option)[0], HEAD).run(x))
        return sent, (time.perf_counter() - start) * 1000.0

    def payload(self, split_id: str, cut: np.ndarray) -> tuple[np.ndarray, dict[str, Any]]:
        """What goes on the link for ``cut``: its packed bits for a coded option (``<split>@k4``,
        issue 47); uint8 with its scale and zero point where the split has quantization parameters
        (unless ``transmit`` is float32), else the float tensor.
        Full offload of a bundle with the normalisation folded in sends the crop's pixels as they
        are, uint8 (scale 1, zero point 0: the host's dequantize gives the full model its input
        back exactly), a quarter of the float32 bytes."""
        if split_id == OFFLOAD and self.spec.folded and self.transmit != "float32":
            return cut.astype(np.uint8), {"scale": 1.0, "zero_point": 0}
        split_id, coding = self.option(split_id)
        if coding is not None:
            bits = np.frombuffer(coding.encode(cut), np.uint8)
            return bits, CodedCut(coding.name, cut.shape).fields()
        quantization = None if split_id == OFFLOAD else self.bundle.manifest.split(split_id).quantization
        if quantization is None:
            if self.transmit == "uint8" and split_id != OFFLOAD:
                raise BundleError(f"split {split_id} has no uint8 quantization; rebuild the bundle with --quantize int8")
            return cut, {}
        if self.transmit == "float32":
            return cut, {}
        q = quantize(cut, quantization.scale, quantization.zero_point)
        return q, {"scale": quantization.scale, "zero_point": quantization.zero_point}
