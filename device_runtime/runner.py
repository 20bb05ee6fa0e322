"""What the board runs: its sessions (heads, the full model), the link payload, and finding a host.

Sessions are created once per artifact and kept for the run. The stream that drives them
(capture, batching, overlap, fallback) is :mod:`device_runtime.pipeline`. With
``split == "local"`` the full model runs on the board and no host is needed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from device_runtime.backend import Backend, load_backend
from calibration import OFFLOAD
from device_runtime.bundle import LOCAL_SPLIT, Bundle
from device_runtime.client import Credentials, HostClient
from device_runtime.discovery import discover
from device_runtime.errors import BundleError, HostUnavailableError
from device_runtime.preprocess import preprocess
from device_runtime.quantization import quantize

PRECISIONS = ("auto", "float32", "int8")


@dataclass(frozen=True)
class FrameResult:
    """One frame's outcome: its answer and where the time went (one trace record)."""

    index: int
    name: str
    label: str | None  # None for a dropped frame
    probability: float | None
    split: str  # the split that ran ("local": the full model here; "offload": the full model on the host)
    preprocess_ms: float = 0.0
    head_ms: float = 0.0
    transfer_ms: float = 0.0
    tail_ms: float = 0.0
    total_ms: float = 0.0  # capture done → result known
    captured: float = 0.0  # time.monotonic() at capture
    batch: int = 1
    bytes: int = 0  # this frame's share of what crossed the link
    rate_bps: float | None = None  # the link estimate when the split was chosen
    where: str = "local"  # local | remote
    host: str | None = None
    dropped: bool = False  # dropped from the queue by policy: never classified
    error: str | None = None  # why a remote batch fell back to local

    def line(self) -> str:
        if self.dropped:
            return f"#{self.index:<4d} {self.name[:24]:24s} dropped (the pipeline was full; newest frames win)"
        rate = f"  rate {self.rate_bps / 1e6:7.2f} Mbit/s" if self.rate_bps else ""
        fallback = "  (fell back to local)" if self.error else ""
        return (
            f"#{self.index:<4d} {self.name[:24]:24s} {str(self.label)[:24]:24s} {self.probability:6.3f}  "
            f"split={self.split:<20s} pre {self.preprocess_ms:6.2f} ms  head {self.head_ms:7.2f} ms  transfer {self.transfer_ms:7.2f} ms  "
            f"tail {self.tail_ms:7.2f} ms  total {self.total_ms:7.2f} ms{rate}{fallback}"
        )


def top1(logits: np.ndarray, labels: Sequence[str]) -> tuple[str, float]:
    """Label and softmax probability of the best class of one (classes,) logit vector."""
    shifted = np.exp(logits - logits.max())
    best = int(shifted.argmax())
    label = labels[best] if best < len(labels) else f"class_{best}"
    return label, float(shifted[best] / shifted.sum())


def default_split(bundle: Bundle) -> str:
    """The split whose cut tensor is smallest: the cheapest to send when nothing else is known."""
    splits = bundle.manifest.splits
    if not splits:
        return LOCAL_SPLIT
    return min(splits, key=lambda s: (s.tensor.bytes_per_sample, s.position)).id


async def connect_host(
    bundle: Bundle, host: str, interfaces: Sequence[str] | None = None, timeout: float = 5.0,
    credentials: Credentials = Credentials(),
) -> HostClient:
    """``host`` is ``IP:PORT`` or ``auto`` (zeroconf: the least loaded host serving the bundle).

    By zeroconf, only hosts whose record matches the device's key are tried: a device with a key
    talks only to hosts that authenticate frames (``auth`` in the TXT record), one without a key
    only to hosts that do not require one.
    """
    failures = []
    if host == "auto":
        adverts = await discover(bundle.id, interfaces, timeout=timeout)
        if not adverts:
            raise HostUnavailableError(
                f"no splitedge host serving bundle {bundle.id} found by zeroconf within {timeout:g} s; "
                "start one with 'split-host serve', pass --host IP:PORT, or run with --split local"
            )
        keyed = credentials.key is not None
        for advert in adverts:
            if advert.auth != keyed:
                failures.append(
                    f"host {advert.address}:{advert.port} does not authenticate frames and this device has a key"
                    if keyed else f"host {advert.address}:{advert.port} requires a key (split-device --key-file)"
                )
        candidates = [(a.address, a.port) for a in adverts if a.auth == keyed]
    else:
        address, sep, port_text = host.rpartition(":")
        if not sep or not port_text.isdigit():
            raise HostUnavailableError(f"--host {host!r}: expected IP:PORT or auto")
        candidates = [(address, int(port_text))]
    for address, port in candidates:  # least loaded first; a stale record must not stop us
        try:
            client = await HostClient.connect(address, port, timeout=timeout, credentials=credentials)
        except HostUnavailableError as exc:
            failures.append(str(exc))
            continue
        if bundle.id in client.server_info.get("bundles", {}):
            return client
        await client.close()
        failures.append(f"host {client.address} does not serve bundle {bundle.id}")
    raise HostUnavailableError("; ".join(failures))


class DeviceRunner:
    """Runs frames of one bundle, on the board alone or split with a host."""

    def __init__(
        self, bundle: Bundle, threads: int | None = None, backend: str = "onnx", transmit: str = "auto",
        precision: str = "auto",
    ) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
        self.bundle = bundle
        self.threads = threads
        self.backend = backend  # artifact format the board runs: onnx or tflite
        self.transmit = transmit  # auto: uint8 where the split has quantization parameters, else float32
        self.precision = precision  # auto: int8 where the bundle has it (its accuracy is in the manifest)
        self._sessions: dict[tuple[str, str], Backend] = {}
        self.labels = bundle.manifest.model.labels

    def artifact_precision(self, split_id: str, role: str) -> str:
        """The precision of the artifact this runner runs for ``split_id``'s ``role``."""
        if self.precision != "auto":
            return self.precision
        return "int8" if self.bundle.has(split_id, role, fmt=self.backend, precision="int8") else "float32"

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
        role = "full" if split_id == LOCAL_SPLIT else "head"
        shape = (1, *self.bundle.manifest.model.input_shape)
        self.session(split_id, role).run(np.zeros(shape, dtype=np.float32))

    def preprocess(self, image: np.ndarray) -> np.ndarray:
        """A camera frame as the model's input, (1, *input_shape) float32."""
        return preprocess(image, self.bundle.manifest.model.preprocess)

    def run_full(self, x: np.ndarray) -> tuple[np.ndarray, float]:
        """The full model here: logits and ms."""
        start = time.perf_counter()
        logits = self.session(LOCAL_SPLIT, "full").run(x)
        return logits, (time.perf_counter() - start) * 1000.0

    def run_head(self, split_id: str, x: np.ndarray) -> tuple[np.ndarray, float]:
        """The head of ``split_id``: the cut tensor and ms."""
        start = time.perf_counter()
        cut = self.session(split_id, "head").run(x)
        return cut, (time.perf_counter() - start) * 1000.0

    def payload(self, split_id: str, cut: np.ndarray) -> tuple[np.ndarray, dict[str, float]]:
        """What goes on the link for ``cut``: uint8 with its scale and zero point where the
        split has quantization parameters (unless ``transmit`` is float32), else the float tensor."""
        quantization = None if split_id == OFFLOAD else self.bundle.manifest.split(split_id).quantization
        if quantization is None:
            if self.transmit == "uint8" and split_id != OFFLOAD:
                raise BundleError(f"split {split_id} has no uint8 quantization; rebuild the bundle with --quantize int8")
            return cut, {}
        if self.transmit == "float32":
            return cut, {}
        q = quantize(cut, quantization.scale, quantization.zero_point)
        return q, {"scale": quantization.scale, "zero_point": quantization.zero_point}
