"""The bundle contract: a directory with ``manifest.json`` and the artifacts it lists.

Every runtime reads bundles through this module and the exporter writes them through it,
so the format is defined once. Loading verifies the schema version, every required field
and the sha256 of every artifact the caller is going to use; a bundle that fails is refused
with a :class:`BundleError` naming the file or field. A device bundle may omit tails and a
host bundle may omit heads: only the roles asked for must be present.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from splitedge.errors import BundleError
from splitedge.words import LOCAL, OFFLOAD

__all__ = [
    "LOCAL",
    "MANIFEST_NAME",
    "OFFLOAD",
    "ROLES",
    "SCHEMA_VERSION",
    "SPLIT_KINDS",
    "Artifact",
    "Bundle",
    "Manifest",
    "ModelInfo",
    "Preprocess",
    "Quantization",
    "Split",
    "TensorSpec",
    "file_sha256",
    "make_artifact",
    "parse_manifest",
    "write_manifest",
]

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"
ROLES = ("head", "tail", "full")
SPLIT_KINDS = ("layer", "bottleneck", "semantic")


def file_sha256(path: Path, chunk_bytes: int = 1 << 20) -> str:
    """Hash in chunks: artifacts reach hundreds of MB (VGG16 tails) and must not be read whole."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class Artifact:
    """One file of the bundle: which part of the network it holds, in which format and precision."""

    role: str  # head | tail | full
    format: str  # onnx | tflite
    precision: str  # float32 | int8
    path: str  # relative to the bundle directory, POSIX separators
    sha256: str
    bytes: int
    accuracy: float | None = None  # heads: top-1 of the split model with this head, where measured


@dataclass(frozen=True)
class TensorSpec:
    """Per-sample description of the tensor that crosses the link (batch dimension excluded)."""

    shape: tuple[int, ...]
    dtype: str
    bytes_per_sample: int


@dataclass(frozen=True)
class Quantization:
    """Affine uint8 transmission: ``real = scale * (q - zero_point)``."""

    scale: float
    zero_point: int
    dtype: str = "uint8"


@dataclass(frozen=True)
class Split:
    """One cut of the network: head on the board, tail on the host."""

    id: str
    position: int  # order of the cut node in the traced graph; larger = deeper
    kind: str
    tensor: TensorSpec
    compression_ratio: float  # DSC: c_l = |h_l| / |x|
    natural: bool  # DSC: c_l < 1
    compressive: bool  # DSC Eq. 3: smaller than every earlier cut
    artifacts: tuple[Artifact, ...]
    cui: float | None = None
    quantization: Quantization | None = None
    accuracy: float | None = None


@dataclass(frozen=True)
class Preprocess:
    """How a camera frame becomes the model input, as torchvision's ImageClassification does it."""

    resize: int  # shorter side, pixels
    crop: int  # centre crop, pixels
    mean: tuple[float, ...]
    std: tuple[float, ...]
    interpolation: str = "bilinear"
    color: str = "RGB"


@dataclass(frozen=True)
class ModelInfo:
    name: str
    input_shape: tuple[int, ...]  # per sample, e.g. (3, 224, 224)
    input_dtype: str
    layout: str
    output_shape: tuple[int, ...]
    preprocess: Preprocess
    labels: tuple[str, ...]
    accuracy: float | None = None  # top-1 of the full model on the test data, where measured


@dataclass(frozen=True)
class Manifest:
    bundle_id: str
    model: ModelInfo
    full: tuple[Artifact, ...]
    splits: tuple[Split, ...]
    created_by: str = "splitedge"
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    def split(self, split_id: str) -> Split:
        for split in self.splits:
            if split.id == split_id:
                return split
        known = ", ".join(s.id for s in self.splits) or "none"
        raise BundleError(f"unknown split {split_id!r} in bundle {self.bundle_id}; splits: {known}")


class _Reader:
    """Typed field access that names the missing or mistyped field by its JSON path."""

    def __init__(self, source: str) -> None:
        self.source = source

    def get(self, obj: Any, key: str, path: str, kinds: type | tuple[type, ...], optional: bool = False) -> Any:
        where = f"{path}.{key}" if path else key
        if not isinstance(obj, dict):
            raise BundleError(f"{self.source}: field {path or 'root'!r} must be an object")
        if key not in obj or (obj[key] is None and not optional):
            if optional:
                return None
            raise BundleError(f"{self.source}: missing field {where!r}")
        value = obj[key]
        if value is None:
            return None
        # bool is an int in Python; a manifest with "bytes": true is still wrong.
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in _as_tuple(kinds)):
            raise BundleError(f"{self.source}: field {where!r} has type {type(value).__name__}, expected {_names(kinds)}")
        return value

    def ints(self, obj: Any, key: str, path: str) -> tuple[int, ...]:
        values = self.get(obj, key, path, list)
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
            raise BundleError(f"{self.source}: field {path}.{key!r} must be a list of non-negative integers")
        return tuple(values)


def _as_tuple(kinds: type | tuple[type, ...]) -> tuple[type, ...]:
    return kinds if isinstance(kinds, tuple) else (kinds,)


def _names(kinds: type | tuple[type, ...]) -> str:
    return " or ".join(k.__name__ for k in _as_tuple(kinds))


def _artifact(r: _Reader, obj: Any, path: str) -> Artifact:
    role = r.get(obj, "role", path, str)
    if role not in ROLES:
        raise BundleError(f"{r.source}: field {path}.role is {role!r}, expected one of {ROLES}")
    return Artifact(
        role=role,
        format=r.get(obj, "format", path, str),
        precision=r.get(obj, "precision", path, str),
        path=r.get(obj, "path", path, str),
        sha256=r.get(obj, "sha256", path, str),
        bytes=r.get(obj, "bytes", path, int),
        accuracy=r.get(obj, "accuracy", path, (int, float), optional=True),
    )


def _split(r: _Reader, obj: Any, path: str) -> Split:
    tensor = r.get(obj, "tensor", path, dict)
    tpath = f"{path}.tensor"
    kind = r.get(obj, "kind", path, str)
    if kind not in SPLIT_KINDS:
        raise BundleError(f"{r.source}: field {path}.kind is {kind!r}, expected one of {SPLIT_KINDS}")
    quant = r.get(obj, "quantization", path, dict, optional=True)
    qpath = f"{path}.quantization"
    return Split(
        id=r.get(obj, "id", path, str),
        position=r.get(obj, "position", path, int),
        kind=kind,
        tensor=TensorSpec(
            shape=r.ints(tensor, "shape", tpath),
            dtype=r.get(tensor, "dtype", tpath, str),
            bytes_per_sample=r.get(tensor, "bytes_per_sample", tpath, int),
        ),
        compression_ratio=float(r.get(obj, "compression_ratio", path, (int, float))),
        natural=r.get(obj, "natural", path, bool),
        compressive=r.get(obj, "compressive", path, bool),
        artifacts=tuple(
            _artifact(r, a, f"{path}.artifacts[{i}]") for i, a in enumerate(r.get(obj, "artifacts", path, list))
        ),
        cui=r.get(obj, "cui", path, (int, float), optional=True),
        quantization=None
        if quant is None
        else Quantization(
            scale=float(r.get(quant, "scale", qpath, (int, float))),
            zero_point=r.get(quant, "zero_point", qpath, int),
            dtype=r.get(quant, "dtype", qpath, str),
        ),
        accuracy=r.get(obj, "accuracy", path, (int, float), optional=True),
    )


def parse_manifest(data: Any, source: str = MANIFEST_NAME) -> Manifest:
    """Turn decoded JSON into a :class:`Manifest`, refusing newer schemas and missing fields by name."""
    r = _Reader(source)
    version = r.get(data, "schema_version", "", int)
    if version > SCHEMA_VERSION:
        raise BundleError(
            f"{source}: schema_version {version} is newer than this splitedge reads ({SCHEMA_VERSION}); "
            "upgrade splitedge on this machine"
        )
    model = r.get(data, "model", "", dict)
    pre = r.get(model, "preprocess", "model", dict)
    splits = r.get(data, "splits", "", list)
    return Manifest(
        schema_version=version,
        bundle_id=r.get(data, "bundle_id", "", str),
        created_by=r.get(data, "created_by", "", str, optional=True) or "unknown",
        model=ModelInfo(
            name=r.get(model, "name", "model", str),
            input_shape=r.ints(model, "input_shape", "model"),
            input_dtype=r.get(model, "input_dtype", "model", str),
            layout=r.get(model, "layout", "model", str),
            output_shape=r.ints(model, "output_shape", "model"),
            preprocess=Preprocess(
                resize=r.get(pre, "resize", "model.preprocess", int),
                crop=r.get(pre, "crop", "model.preprocess", int),
                mean=tuple(r.get(pre, "mean", "model.preprocess", list)),
                std=tuple(r.get(pre, "std", "model.preprocess", list)),
                interpolation=r.get(pre, "interpolation", "model.preprocess", str),
                color=r.get(pre, "color", "model.preprocess", str),
            ),
            labels=tuple(r.get(model, "labels", "model", list)),
            accuracy=r.get(model, "accuracy", "model", (int, float), optional=True),
        ),
        full=tuple(_artifact(r, a, f"full[{i}]") for i, a in enumerate(r.get(data, "full", "", list))),
        splits=tuple(_split(r, s, f"splits[{i}]") for i, s in enumerate(splits)),
    )


@dataclass
class Bundle:
    """A loaded, verified bundle directory."""

    root: Path
    manifest: Manifest
    verified: set[str] = field(default_factory=set)  # relative paths whose sha256 matched

    @property
    def id(self) -> str:
        return self.manifest.bundle_id

    @classmethod
    def load(cls, root: str | Path, roles: Iterable[str] = ROLES) -> "Bundle":
        """Load ``root/manifest.json`` and verify every artifact of the given roles.

        Heads and the full model matter to a device, tails to a host; artifacts of other
        roles are neither required nor read, which keeps a board from hashing files it lacks.
        """
        root = Path(root)
        manifest_path = root / MANIFEST_NAME
        try:
            text = manifest_path.read_text()
        except FileNotFoundError as exc:
            raise BundleError(f"{manifest_path}: no manifest; is {root} a bundle directory?") from exc
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BundleError(f"{manifest_path}: not valid JSON ({exc})") from exc
        bundle = cls(root=root, manifest=parse_manifest(data, str(manifest_path)))
        wanted = set(roles)
        for artifact in bundle.all_artifacts():
            if artifact.role in wanted:
                bundle.verify(artifact)
        return bundle

    def all_artifacts(self) -> list[Artifact]:
        return [*self.manifest.full, *(a for s in self.manifest.splits for a in s.artifacts)]

    def verify(self, artifact: Artifact) -> Path:
        path = self.root / artifact.path
        if artifact.path in self.verified:
            return path
        if not path.is_file():
            raise BundleError(f"{path}: listed in the manifest but missing from the bundle")
        actual = file_sha256(path)
        if actual != artifact.sha256:
            raise BundleError(
                f"{path}: sha256 {actual[:16]}… does not match the manifest's {artifact.sha256[:16]}…; "
                "the file is corrupt or was replaced"
            )
        self.verified.add(artifact.path)
        return path

    def artifact(self, split_id: str, role: str, fmt: str = "onnx", precision: str = "float32") -> Path:
        """Path of a verified artifact; ``split_id`` is ``local`` for the full model."""
        candidates = self.manifest.full if split_id == LOCAL else self.manifest.split(split_id).artifacts
        for artifact in candidates:
            if (artifact.role, artifact.format, artifact.precision) == (role, fmt, precision):
                return self.verify(artifact)
        raise BundleError(
            f"bundle {self.id} has no {precision} {fmt} {role} for split {split_id!r}"
        )

    def has(self, split_id: str, role: str, fmt: str = "onnx", precision: str = "float32") -> bool:
        """Whether the artifact is listed and present on disk (a host bundle may omit heads)."""
        candidates = self.manifest.full if split_id == LOCAL else self.manifest.split(split_id).artifacts
        return any(
            (a.role, a.format, a.precision) == (role, fmt, precision) and (self.root / a.path).is_file()
            for a in candidates
        )


def write_manifest(root: str | Path, manifest: Manifest) -> Path:
    """Write ``manifest.json``; the exporter calls this after every artifact is in place and hashed."""
    path = Path(root) / MANIFEST_NAME
    # Round-trip through the parser so that a writer bug cannot produce a bundle readers refuse.
    parse_manifest(json.loads(manifest.to_json()), str(path))
    path.write_text(manifest.to_json() + "\n")
    return path


def make_artifact(root: str | Path, relpath: str, role: str, fmt: str, precision: str) -> Artifact:
    """Describe a file already written under ``root``: its hash and size."""
    path = Path(root) / relpath
    return Artifact(
        role=role, format=fmt, precision=precision, path=relpath, sha256=file_sha256(path), bytes=path.stat().st_size
    )
