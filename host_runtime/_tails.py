"""The tails a host serves: one onnxruntime session per (bundle, split), created at start.

Loading everything up front makes a broken bundle fail at start, not on the first request
from a board in the field. Lookups that fail raise :class:`ProtocolError` with the typed
code the device receives (``unknown_bundle``, ``unknown_split``, ``bad_request``).

A chain's stages and a semantic split's fragments are served as tails named ``<split>#<k>``
(:func:`~device_runtime.bundle.stage_id`).
A bundle with its full model is also served as the split ``offload`` (DSC Eq. 5: the
input crosses the link and the whole network runs here), the other corner of the table a
board calibrates. The host times its own tails for that table
(:mod:`host_runtime._profiling`): a board cannot measure the host's compute.

Tails run on onnxruntime's CUDA provider when the host has one (``--device auto``, the
default) and on the CPU otherwise; the device actually used is read back from the sessions,
since onnxruntime quietly falls back to the CPU when CUDA's libraries cannot be loaded.

On CUDA the provider is told to give the CPU's answers (:func:`cuda_options`): onnxruntime's
CUDA provider computes in TF32 by default on Ampere and later GPUs, which moved MobileNetV2's
logits by 0.013 on an H100 (issue 19); with ``use_tf32=0`` they stay within 1e-5 of the CPU's.
``--tf32`` gives that accuracy back for speed. Inputs and outputs go through onnxruntime's I/O
binding there (:class:`TailSession`).

Batches may be padded to a few fixed sizes (buckets, Triton's "preferred batch sizes",
:func:`bucket_sizes`): a GPU then sees a handful of shapes, each warmed once at start
(:func:`warm_up`: cuDNN chooses its algorithms before the first request, not during it), and
the padded rows' outputs are dropped (:func:`run_batch`).

One shape per session (issue 32): on CUDA, each bucket size has an onnxruntime session of its own
inside the tail (:class:`TailSession`), so that no session ever sees its input shape change. Every
change of shape within one session cost 30–130 ms on an H200, warmed or not (cuDNN's frontend
rebuilds its plan; onnxruntime issues 709 and 19838), and a host whose batches varied in size
collapsed to 154 requests/s at 32 boards, against 7,506 with a session per size.
"""

from __future__ import annotations

import ctypes
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Sequence, Union

import numpy as np

from device_runtime import FULL, LOCAL, OFFLOAD, TAIL, Bundle, stage_id
from device_runtime.engine import Backend, OnnxBackend, check_input, session_options
from device_runtime.wire import ErrorCode
from device_runtime.wire.coding import CutCoding, packed_bytes
from splitedge.errors import BackendError, BundleError, ProtocolError

DEVICES = ("auto", "cpu", "cuda")
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
#: A provider as onnxruntime takes it: a name, or a name and its options.
Provider = Union[str, tuple[str, dict[str, str]]]
#: ``--buckets`` words (or a list of sizes): auto pads on CUDA, where a fixed shape pays, and not on
#: the CPU, where every padded row costs as much compute as a real one.
BUCKETS_AUTO, BUCKETS_OFF = "auto", "off"
#: What ``--tf32`` costs: the largest difference from the CPU's answer over MobileNetV2's logits,
#: measured on H200s over 64 samples per tail of the test bundle (issue 32, bench/gpu_sessions.py):
#: up to 1.54e-2 on the cut tails and stages, 1.84e-2 and 2.20e-2 on the full model (offload) on two
#: machines (the same on every session one machine makes, not from one machine to the next);
#: 1.3e-2 on an H100's cut tails (issue 19). The tf32 test and the bench allow the largest, rounded up, and no more.
TF32_ERROR = 2.3e-2
TF32_ERROR_H100 = 1.3e-2


def cuda_options(tf32: bool = False, fixed_shapes: bool = False) -> dict[str, str]:
    """The CUDA provider's options: the CPU's answers unless ``tf32``.

    ``use_tf32=0``: onnxruntime's CUDA provider uses TF32 by default, 0.013 off on logits (issue
    19). ``cudnn_conv_algo_search``: cuDNN's exhaustive search runs once per new input shape; with
    ``fixed_shapes`` (buckets, each warmed at start) it runs at start and finds the best algorithm
    for each; without, any batch size may come and a search in the middle of serving would stall
    every request behind it, so cuDNN's heuristic picks at once.
    """
    return {"use_tf32": "1" if tf32 else "0", "cudnn_conv_algo_search": "EXHAUSTIVE" if fixed_shapes else "HEURISTIC"}


def providers_for(device: str, tf32: bool = False, fixed_shapes: bool = False) -> list[Provider]:
    """onnxruntime providers for ``--device``: ``auto`` takes CUDA when this onnxruntime has it,
    with :func:`cuda_options`.

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
    return [(CUDA, cuda_options(tf32, fixed_shapes)), CPU]


def on_cuda(device: str) -> bool:
    """Whether ``--device`` will put the tails on CUDA (auto: where this onnxruntime has it)."""
    import onnxruntime as ort

    return device == "cuda" or (device == "auto" and CUDA in ort.get_available_providers())


def bucket_sizes(buckets: str, max_batch: int, cuda: bool) -> tuple[int, ...]:
    """``--buckets`` as the batch sizes batches are padded to; () for none.

    ``auto``: powers of two up to ``max_batch`` on CUDA, none on the CPU; ``off``: none; a list
    (``1,2,4,8``): those sizes. ``max_batch`` is always the largest, so that no batch runs at a
    size of its own (a single request larger than it still does, unpadded).
    """
    if buckets == BUCKETS_OFF or (buckets == BUCKETS_AUTO and not cuda) or max_batch == 1:
        return ()
    if buckets == BUCKETS_AUTO:
        # Powers of two, measured against other sets on an H200 (issue 32, docs/benchmarks.md; the
        # features_14_conv_2 tail, --max-batch 32, a session per size): a batch of 1 costs 0.26 ms,
        # of 32 0.60 ms, so padding n up to its power of two costs 1.13x the unpadded compute on
        # average (1.43x at worst) with 6 sessions of ~180 MiB each; 1,4,16,32 saves 2 sessions for
        # 1.17x, 32 alone 5 for 1.53x (2.3x for a lone request). A host of 4 processes served
        # 23-34k requests/s at 128-512 boards with these, 18-26k with 32 alone.
        sizes = {1 << k for k in range(max_batch.bit_length()) if 1 << k <= max_batch}
    else:
        try:
            sizes = {int(size) for size in buckets.split(",")}
        except ValueError:
            raise BackendError(f"--buckets {buckets!r}: give auto, off or batch sizes such as 1,2,4,8") from None
        if min(sizes) < 1 or max(sizes) > max_batch:
            raise BackendError(f"--buckets {buckets}: sizes must be from 1 to --max-batch ({max_batch})")
    return tuple(sorted(sizes | {max_batch}))


def bucket_for(samples: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds ``samples`` (``samples`` itself past the largest, or with none)."""
    for size in buckets:
        if size >= samples:
            return size
    return samples


class TailSession(OnnxBackend):
    """A tail's onnxruntime session, and with ``buckets`` one more session per bucket size; with
    ``io_binding``, each run binds its input and output (``session.io_binding()``) instead of
    ``session.run``'s feed dict.

    One shape per session (issue 32): a batch of a bucket's size runs on that bucket's session,
    whose batch dimension is fixed to the size (onnxruntime's free-dimension override), so it never
    sees another shape and cuDNN never rebuilds its plan mid-stream; ``bucket_providers`` are its
    providers (CUDA with the exhaustive algorithm search: it runs once, at the warm-up). Any other
    size (a request larger than ``--max-batch``, a profile's batch) runs on the general session
    (``session``, with ``providers``). ``per_bucket``: make the bucket sessions (None: where the
    general session runs on CUDA; off it one session serves every size, as a CPU's cost does not
    depend on the shapes seen; True forces them, for tests on the CPU).

    On CUDA a bound run copies the input to the GPU once and fetches the output once, on
    onnxruntime's own stream, without the per-call argument conversion of ``run``. A binding
    is not shared between threads: each worker thread keeps its own, one per session.
    """

    def __init__(self, path: str | Path, threads: int | None, providers: Sequence[Provider], io_binding: bool,
                 buckets: Sequence[int] = (), bucket_providers: Sequence[Provider] | None = None,
                 per_bucket: bool | None = None) -> None:
        # A host's workers run a tail back to back: its pools may spin between batches, as onnxruntime's do
        # by default; sized and kept to the host's own CPUs like the board's (issue 43: a host's default
        # pool put a worker on the board's CPU).
        super().__init__(path, threads, providers, spinning=True)  # type: ignore[arg-type]
        self.io_binding = io_binding
        cuda = CUDA in self.session.get_providers()
        self._output_device = "cuda" if cuda else "cpu"
        self._bindings = threading.local()
        #: Bucket size → the session that runs batches of that size only; empty: ``session`` runs all.
        self.sessions: dict[int, Any] = {}
        if buckets and can_pad(self) and (cuda if per_bucket is None else per_bucket):
            for size in buckets:
                self.sessions[size] = self._session_of_size(path, threads, bucket_providers or providers, size)

    def _session_of_size(self, path: str | Path, threads: int | None, providers: Sequence[Provider], size: int) -> Any:
        import onnxruntime as ort

        options = session_options(ort, threads, spinning=True)  # as the general session's
        options.log_severity_level = 3  # as OnnxBackend's
        options.add_free_dimension_override_by_name(str(self.input_shape[0]), size)
        try:
            return ort.InferenceSession(str(path), sess_options=options, providers=list(providers))
        except Exception as exc:
            raise BackendError(f"{path}: onnxruntime cannot load it for batches of {size}: {exc}") from exc

    def session_for(self, samples: int) -> Any:
        """The session that runs a batch of ``samples``: its bucket's, or the general one."""
        return self.sessions.get(samples, self.session)

    def run(self, x: np.ndarray) -> np.ndarray:
        check_input(x, self.input_shape, self.input_dtype, self.name)
        size = int(x.shape[0])
        session = self.sessions.get(size)
        if session is None:
            session, size = self.session, 0  # 0: the general session's binding
        try:
            if not self.io_binding:
                (y,) = session.run([self.output_name], {self.input_name: x})
                return y
            return self._run_bound(session, size, x)
        except Exception as exc:
            raise BackendError(f"{self.name}: onnxruntime failed: {exc}") from exc

    def _run_bound(self, session: Any, key: int, x: np.ndarray) -> np.ndarray:
        bindings = getattr(self._bindings, "by_session", None)
        if bindings is None:
            bindings = self._bindings.by_session = {}
        binding = bindings.get(key)
        if binding is None:
            binding = bindings[key] = session.io_binding()
        try:
            binding.bind_cpu_input(self.input_name, np.ascontiguousarray(x))
            binding.bind_output(self.output_name, self._output_device)
            session.run_with_iobinding(binding)
            (y,) = binding.copy_outputs_to_cpu()
        finally:
            binding.clear_binding_inputs()
            binding.clear_binding_outputs()
        return y


def cuda_memory() -> tuple[int, int] | None:
    """(free, total) bytes of the current GPU, from the CUDA runtime onnxruntime's CUDA provider loads
    (``cudaMemGetInfo``; device-wide: every process's use counts); None where that runtime cannot be
    loaded or answers an error. The first call creates the CUDA context, as onnxruntime's would."""
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            runtime = ctypes.CDLL(name)
        except OSError:
            continue
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        if runtime.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)) != 0:
            return None
        return free.value, total.value
    return None


class TailRegistry:
    """Every tail of every bundle given, ready to run.

    ``tf32`` and ``fixed_shapes`` go to the CUDA provider (:func:`cuda_options`); ``io_binding``
    (None: on CUDA only) to every :class:`TailSession`; ``buckets`` and ``per_bucket`` too: on CUDA
    each tail then has a session per bucket size (its exhaustive search run at the warm-up), beside
    its general session (``fixed_shapes`` for that one: False, a heuristic search, as it may see any size).
    """

    def __init__(self, bundles: Iterable[Bundle], threads: int | None = None, device: str = "auto",
                 tf32: bool = False, fixed_shapes: bool = False, io_binding: bool | None = None,
                 buckets: Sequence[int] = (), per_bucket: bool | None = None) -> None:
        self.bundles: dict[str, Bundle] = {}
        self.tails: dict[tuple[str, str], TailSession] = {}
        self._codings: dict[tuple[str, str, str], CutCoding] = {}  # (bundle, split, coding name)
        # (bundle, ``<split>@k4``): what a board's calibration times of a coded option (decode + tail);
        # never an infer's tail: an infer names the split, and its tensor the coding
        self.coded: dict[tuple[str, str], CodedTail] = {}
        self.buckets = tuple(buckets)
        providers = providers_for(device, tf32, fixed_shapes)
        bucket_providers = providers_for(device, tf32, fixed_shapes=True)
        cuda_asked = CUDA in (p if isinstance(p, str) else p[0] for p in providers)
        bind = cuda_asked if io_binding is None else io_binding
        # Before any session: what the GPU had free, so that what the sessions take can be told at start.
        before = cuda_memory() if cuda_asked else None
        self._cuda_free_before = None if before is None else before[0]

        def session(path: Path) -> TailSession:
            return TailSession(path, threads, providers, bind, self.buckets, bucket_providers, per_bucket)
        for bundle in bundles:
            if bundle.id in self.bundles:
                raise BundleError(f"{bundle.root}: bundle {bundle.id} is already served from {self.bundles[bundle.id].root}")
            self.bundles[bundle.id] = bundle
            for split in bundle.manifest.splits:
                if bundle.has(split.id, TAIL):
                    self.tails[(bundle.id, split.id)] = session(bundle.artifact(split.id, TAIL))
                for part in split.parts:  # a chain's stages, a semantic split's fragments: each a tail of its own
                    if part.artifacts:
                        self.tails[(bundle.id, stage_id(split.id, part.index))] = session(
                            bundle.stage_artifact(split.id, part.index))
                for coding in split.codings:  # issue 47: a cut's k-bit codings, decoded before its tail
                    cut = self._codings[(bundle.id, split.id, coding.name)] = CutCoding.of(coding)
                    if (bundle.id, split.id) in self.tails:
                        self.coded[(bundle.id, split.option(coding))] = CodedTail(self.tails[(bundle.id, split.id)], cut)
            if bundle.has(LOCAL, FULL):
                self.tails[(bundle.id, OFFLOAD)] = session(bundle.artifact(LOCAL, FULL))
        on_cuda = [CUDA in tail.session.get_providers() for tail in self.tails.values()]
        if device == "cuda" and not all(on_cuda):
            raise BackendError(f"--device cuda: onnxruntime fell back to the CPU for {on_cuda.count(False)} tails "
                               "(CUDA libraries missing?); see onnxruntime's log")
        #: Where the tails run, as hello and the start-up line report it.
        self.device = "cuda" if on_cuda and all(on_cuda) else "cpu"

    def sessions(self) -> str:
        """How many onnxruntime sessions the tails hold, per bucket size where they have those,
        and (on CUDA) the GPU memory they hold: for the start-up line, after the warm-up."""
        tails = len(self.tails)
        per_size = sum(len(getattr(tail, "sessions", {})) for tail in self.tails.values())
        sized = sum(1 for tail in self.tails.values() if getattr(tail, "sessions", {}))
        text = f"{tails + per_size} onnxruntime sessions"
        if per_size:
            sizes = ",".join(str(s) for s in self.buckets)
            text += f": {sized} tails with one per batch size ({sizes}), and each tail one for other sizes"
        if self.device == "cuda":
            memory = cuda_memory()
            if memory is None:
                text += "; GPU memory not measured (the CUDA runtime could not be asked)"
            elif self._cuda_free_before is None:
                text += f"; {(memory[1] - memory[0]) / 2**20:,.0f} MiB of the GPU's {memory[1] / 2**30:.0f} GiB in use"
            else:
                text += (f"; {(self._cuda_free_before - memory[0]) / 2**20:,.0f} MiB of GPU memory taken since they "
                         f"loaded ({memory[0] / 2**30:.1f} of {memory[1] / 2**30:.0f} GiB free)")
        return text

    @classmethod
    def from_paths(cls, paths: Iterable[str | Path], threads: int | None = None, device: str = "auto",
                   **options: Any) -> "TailRegistry":
        return cls((Bundle.load(p, roles=(TAIL, FULL)) for p in paths), threads=threads, device=device, **options)

    def served(self) -> dict[str, list[str]]:
        """bundle id → split ids with a tail here, and chain stages and semantic fragments as
        ``<split>#<k>`` (what ``hello`` and zeroconf announce)."""
        served: dict[str, list[str]] = {bundle_id: [] for bundle_id in self.bundles}
        for bundle_id, split_id in (*self.tails, *self.coded):
            served[bundle_id].append(split_id)
        return served

    def profiled(self, bundle_id: object, split_id: object) -> Backend:
        """What a ``profile`` times for ``split_id``: its tail, or a coded option's decode and tail."""
        coded = self.coded.get((bundle_id, split_id)) if isinstance(split_id, str) else None  # type: ignore[arg-type]
        return coded if coded is not None else self.lookup(bundle_id, split_id)

    def lookup(self, bundle_id: object, split_id: object) -> Backend:
        if not isinstance(bundle_id, str) or bundle_id not in self.bundles:
            raise ProtocolError(
                f"bundle {bundle_id!r} is not served here; served: {', '.join(self.bundles) or 'none'}",
                code=ErrorCode.UNKNOWN_BUNDLE,
            )
        tail = self.tails.get((bundle_id, split_id)) if isinstance(split_id, str) else None
        if tail is None:
            known = ", ".join(s for b, s in self.tails if b == bundle_id)
            raise ProtocolError(f"split {split_id!r} of bundle {bundle_id} has no tail here; splits: {known}", code=ErrorCode.UNKNOWN_SPLIT)
        return tail

    def lookup_for(self, bundle_id: object, split_id: object, tensor: np.ndarray) -> Backend:
        """The tail for a request, after checking the tensor fits it (``bad_request`` if not):
        ``tensor`` as the tail will take it (``Arrival.seen``)."""
        tail = self.lookup(bundle_id, split_id)
        try:
            check_input(tensor, tail.input_shape, tail.input_dtype, f"tail of split {split_id}")
        except BackendError as exc:
            raise ProtocolError(str(exc), code=ErrorCode.BAD_REQUEST) from exc
        return tail


    def coding(self, bundle_id: object, split_id: object, name: str) -> CutCoding:
        """The coding ``name`` of a split's cut (the split's, whichever of its stages or fragments
        a request names); ``bad_request`` naming the codings it has where it has not that one (issue 47)."""
        coding = self._codings.get((bundle_id, split_id, name))  # type: ignore[arg-type]
        if coding is not None:
            return coding
        if not isinstance(split_id, str) or bundle_id not in self.bundles:
            self.lookup(bundle_id, split_id)  # raises: not served here
        try:
            self.bundles[bundle_id].manifest.split(split_id).coding(name)  # type: ignore[index]  # raises, naming them
        except BundleError as exc:
            raise ProtocolError(str(exc), code=ErrorCode.BAD_REQUEST) from exc
        raise AssertionError(f"coding {name} of split {split_id} is in the manifest but not kept")


class CodedTail:
    """A tail behind its split's k-bit coding, as a ``profile`` times it for a board's calibration
    (issue 47): a batch's packed bits unpacked and dequantized, then the tail. The bits are zeros
    (unpacking and a convolution take as long whatever the values)."""

    def __init__(self, tail: Backend, coding: CutCoding) -> None:
        self.tail, self.coding = tail, coding
        self.name, self.input_shape, self.input_dtype = f"{tail.name}@{coding.name}", tail.input_shape, tail.input_dtype

    def run(self, x: np.ndarray) -> np.ndarray:
        bits = np.zeros(packed_bytes(x.size, self.coding.bits), np.uint8)
        return self.tail.run(self.coding.decode(bits, x.shape))


def can_pad(tail: Backend) -> bool:
    """Whether batches of ``tail`` can be padded: its batch axis is free and nothing else is."""
    shape = tail.input_shape
    return bool(shape) and not isinstance(shape[0], int) and all(isinstance(d, int) for d in shape[1:])


def warm_up(tail: Backend, buckets: Sequence[int]) -> int:
    """Run ``tail`` once at every bucket size, on zeros, before any request: cuDNN's algorithm
    search and onnxruntime's per-shape allocations happen here. Returns the runs made (none for a
    tail that cannot be padded)."""
    if not buckets or not can_pad(tail):
        return 0
    sample = tuple(int(d) for d in tail.input_shape[1:])
    for size in buckets:
        tail.run(np.zeros((size, *sample), dtype=tail.input_dtype))
    return len(buckets)


def run_batch(tail: Backend, tensors: Sequence[np.ndarray], bucket: int = 0) -> tuple[np.ndarray, float, float]:
    """Run requests as one batch in a worker thread: concatenated along the batch axis (a lone
    request is not copied), padded with zeros up to ``bucket`` samples when that is more. Returns
    the output of the requests' own rows (sum of B, ...; the padded rows' are dropped), the
    perf_counter time the tail started (each request's queue time ends there) and the ms of compute."""
    samples = sum(int(t.shape[0]) for t in tensors)
    if bucket > samples:
        x = np.zeros((bucket, *tensors[0].shape[1:]), dtype=tensors[0].dtype)
        np.concatenate(tensors, out=x[:samples])
    else:
        x = tensors[0] if len(tensors) == 1 else np.concatenate(tensors)
    start = time.perf_counter()
    output = tail.run(x)
    compute_ms = (time.perf_counter() - start) * 1000.0
    if output.shape[:1] != x.shape[:1]:
        raise BackendError(f"{tail.name} returned {output.shape[:1]} samples for a batch of {x.shape[0]}")
    return output[:samples], start, compute_ms
