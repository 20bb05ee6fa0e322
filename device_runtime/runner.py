"""The board's main loop: capture → preprocess → head → host's tail → top-1, one frame at a time.

Sessions, labels and the connection are created once; blocking work (the camera, the
head) runs in a worker thread so the event loop keeps reading replies and signals. With
``split == "local"`` the full model runs on the board and no host is needed.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import AsyncIterator, Sequence

import numpy as np

from device_runtime.backend import Backend, load_backend
from device_runtime.bundle import LOCAL_SPLIT, Bundle
from device_runtime.camera import Frame, FrameSource
from device_runtime.client import HostClient
from device_runtime.discovery import discover
from device_runtime.errors import BundleError, HostUnavailableError
from device_runtime.preprocess import preprocess
from device_runtime.quantization import quantize

PRECISIONS = ("auto", "float32", "int8")


@dataclass(frozen=True)
class FrameResult:
    index: int
    name: str
    label: str
    probability: float
    split: str
    preprocess_ms: float
    head_ms: float
    transfer_ms: float
    tail_ms: float
    total_ms: float  # capture done → result known

    def line(self) -> str:
        return (
            f"#{self.index:<4d} {self.name[:24]:24s} {self.label[:24]:24s} {self.probability:6.3f}  "
            f"split={self.split:<20s} pre {self.preprocess_ms:6.2f} ms  head {self.head_ms:7.2f} ms  transfer {self.transfer_ms:7.2f} ms  "
            f"tail {self.tail_ms:7.2f} ms  total {self.total_ms:7.2f} ms"
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
    bundle: Bundle, host: str, interfaces: Sequence[str] | None = None, timeout: float = 5.0
) -> HostClient:
    """``host`` is ``IP:PORT`` or ``auto`` (zeroconf: the least loaded host serving the bundle)."""
    if host == "auto":
        adverts = await discover(bundle.id, interfaces, timeout=timeout)
        if not adverts:
            raise HostUnavailableError(
                f"no splitedge host serving bundle {bundle.id} found by zeroconf within {timeout:g} s; "
                "start one with 'split-host serve', pass --host IP:PORT, or run with --split local"
            )
        candidates = [(a.address, a.port) for a in adverts]
    else:
        address, sep, port_text = host.rpartition(":")
        if not sep or not port_text.isdigit():
            raise HostUnavailableError(f"--host {host!r}: expected IP:PORT or auto")
        candidates = [(address, int(port_text))]
    failures = []
    for address, port in candidates:  # least loaded first; a stale record must not stop us
        try:
            client = await HostClient.connect(address, port, timeout=timeout)
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
        role = "full" if split_id == LOCAL_SPLIT else "head"
        shape = (1, *self.bundle.manifest.model.input_shape)
        self.session(split_id, role).run(np.zeros(shape, dtype=np.float32))

    async def infer(self, frame: Frame, split_id: str, client: HostClient | None) -> FrameResult:
        loop = asyncio.get_running_loop()
        start = time.perf_counter()
        x = preprocess(frame.image, self.bundle.manifest.model.preprocess)
        preprocess_ms = (time.perf_counter() - start) * 1000.0
        if split_id == LOCAL_SPLIT:
            start = time.perf_counter()
            logits = await loop.run_in_executor(None, self.session(LOCAL_SPLIT, "full").run, x)
            head_ms, transfer_ms, tail_ms = (time.perf_counter() - start) * 1000.0, 0.0, 0.0
        else:
            if client is None:
                raise HostUnavailableError(f"split {split_id} needs a host; none is connected")
            start = time.perf_counter()
            cut = await loop.run_in_executor(None, self.session(split_id, "head").run, x)
            head_ms = (time.perf_counter() - start) * 1000.0
            quantization = self.bundle.manifest.split(split_id).quantization
            if quantization is None and self.transmit == "uint8":
                raise BundleError(f"split {split_id} has no uint8 quantization; rebuild the bundle with --quantize int8")
            if quantization is not None and self.transmit != "float32":
                q = quantize(cut, quantization.scale, quantization.zero_point)
                result = await client.infer(
                    self.bundle.id, split_id, q, scale=quantization.scale, zero_point=quantization.zero_point
                )
            else:
                result = await client.infer(self.bundle.id, split_id, cut)
            logits, transfer_ms, tail_ms = result.output, result.transfer_ms, result.compute_ms
        label, probability = top1(logits[0], self.labels)
        return FrameResult(
            index=frame.index,
            name=frame.name,
            label=label,
            probability=probability,
            split=split_id,
            preprocess_ms=preprocess_ms,
            head_ms=head_ms,
            transfer_ms=transfer_ms,
            tail_ms=tail_ms,
            total_ms=(time.monotonic() - frame.captured) * 1000.0,
        )

    async def stream(
        self,
        source: FrameSource,
        split_id: str,
        client: HostClient | None,
        frames: int | None = None,
        stop: asyncio.Event | None = None,
    ) -> AsyncIterator[FrameResult]:
        """Results for up to ``frames`` frames (all, for a finite source), until ``stop`` is set."""
        if split_id != LOCAL_SPLIT:
            self.bundle.manifest.split(split_id)  # an unknown split fails before the camera starts
        loop = asyncio.get_running_loop()
        frames_iter = iter(source)
        count = 0
        while frames is None or count < frames:
            if stop is not None and stop.is_set():
                return
            frame = await loop.run_in_executor(None, next, frames_iter, None)
            if frame is None:
                return
            yield await self.infer(frame, split_id, client)
            count += 1
