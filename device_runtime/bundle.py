"""The bundle contract: a directory with ``manifest.json`` and the artifacts it lists.

Every runtime reads bundles through this module and the exporter writes them through it,
so the format is defined once, and so are its words: roles, formats, precisions, split kinds
and the artifacts' tensor names are constants here (formats and precisions, like LOCAL and
OFFLOAD, live in :mod:`splitedge._words` because calibration needs them; this module
re-exports them). Loading verifies the schema version, every required field, the manifest's
identity (a manifest edited after export is refused) and the sha256 of every artifact the
caller is going to use; a bundle that fails is refused with a :class:`BundleError` naming
the file or field. A device bundle may omit tails and a host bundle may omit heads: only the
roles asked for must be present.

A bundle is confined to its directory. Its identity is a hash anyone can recompute, so it
proves nothing about where a forged manifest points: every path is checked when parsed
(relative, normalised, no ``..``: :func:`check_relpath`) and again on disk by the one resolver
every reader uses (:func:`artifact_path`: a regular file inside the bundle, of the size the
manifest gives, before a byte is hashed), and model names and bundle ids, which name a board's
release directories, keep to a safe set of characters (:func:`check_name`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from splitedge import FLOAT32, FORMATS, Fields, INT8, LOCAL, OFFLOAD, ONNX, PRECISIONS, TFLITE, join
from splitedge.errors import BundleError
from splitedge.reading import file_kind, read_text_bounded

#: A public sub-face of ``device_runtime``: the contract's words (splits, roles, formats, precisions,
#: tensor names) and the helpers that write a bundle, for the exporter. The types (:class:`Bundle`,
#: :class:`Manifest`, ...) are on the package's face.
__all__ = [
    "BOARD_PART", "BOTTLENECK", "CHAIN", "CHAIN_JOIN", "CUT", "CUT_BITS", "Coding", "FLOAT32", "FORMATS", "FULL", "HEAD", "INT8", "IO_NAMES",
    "LAYER", "LOCAL", "LOGITS", "MIDDLE_STAGE_IO", "OFFLOAD", "ONNX", "PARTS", "PRECISIONS", "SEMANTIC", "TAIL", "TFLITE",
    "artifacts_of", "check_name", "make_artifact", "semantic_id", "stage_id", "write_manifest",
]

#: Schema 2 adds chains (``kind: chain`` with ``stages``) and semantic splits (``kind: semantic``
#: with ``fragments``). Schema 3 adds heads and full models with the normalisation folded in
#: (``model.preprocess.folded``: they take pixel values, 0-255): a board that reads only 1 or 2 would
#: normalise their input a second time and answer wrongly, so it must refuse them. A bundle is
#: written with the oldest schema that holds it (one without chains, fragments or folding as schema
#: 1, byte for byte as before), so older boards still take what they can run; all load here.
SCHEMA_VERSION = 4
CHAIN_SCHEMA = 2
FOLDED_SCHEMA = 3
#: Schema 4 adds early exits (a layer split's ``exit``, issue 48): its heads have a second output,
#: which a board of schema 3 cannot open as a TFLite head (one output, it says) and would not know
#: to ignore; a bundle without exits is still written as before.
EXIT_SCHEMA = 4
MANIFEST_NAME = "manifest.json"
#: The largest manifest read: the zoo's largest (the test bundle's, with its chain and variants) is
#: tens of KB; past this a "manifest" is no bundle's (a link to /dev/zero was read until memory ran out).
MAX_MANIFEST_BYTES = 16 << 20

#: What an artifact holds: the board's part of a split, the host's part, or the whole network.
HEAD, TAIL, FULL = "head", "tail", "full"
ROLES = (HEAD, TAIL, FULL)
#: The tensor names every artifact's single input and output carry, in ONNX and TFLite alike:
#: the exporter writes them and the runtimes feed and read them.
INPUT, CUT, LOGITS = "input", "cut", "logits"
IO_NAMES: dict[str, tuple[str, str]] = {HEAD: (INPUT, CUT), TAIL: (CUT, LOGITS), FULL: (INPUT, LOGITS)}
#: A tensor name an exit's output may have: a plain identifier (it is looked up by name in ONNX and TFLite).
OUTPUT_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
#: A chain's stages are tails (role TAIL, files ``stage/<split>.<k>.onnx``): the last one takes
#: IO_NAMES[TAIL]; one in the middle outputs the next cut, named apart from its input.
NEXT_CUT = "next_cut"
MIDDLE_STAGE_IO = (CUT, NEXT_CUT)
#: How a split was made: cut at a layer, at an injected autoencoder, at a semantic boundary, or at
#: several cuts in a row whose stages run on a chain of hosts (:class:`Stage`).
LAYER, BOTTLENECK, SEMANTIC, CHAIN = "layer", "bottleneck", "semantic", "chain"
SPLIT_KINDS = (LAYER, BOTTLENECK, SEMANTIC, CHAIN)
#: A chain's id joins its cuts' ids with this; a stage is named on the wire as ``<split>#<k>``.
CHAIN_JOIN, STAGE_MARK = "+", "#"
#: A semantic split's id is ``<cut>~<K>`` (K fragments after the cut); fragment k is served and
#: named on the wire like a chain's stage, ``<split>#<k>``.
FRAGMENT_MARK = "~"
#: ``<split>@<coding>`` (``features_14_conv_2@k4``): the option of sending a split's cut in one of its
#: k-bit codings (issue 47); a table, a reason and a trace name it as they name a split.
CODING_MARK = "@"
#: The manifest's identity: derived from the rest of it (:func:`manifest_digest`), so not hashed.
IDENTITY_FIELDS = ("bundle_id", "manifest_sha256")
ID_DIGITS = 12

#: Model names and bundle ids (``<model>-<12 hex>``) name a board's release directories, go into
#: shell commands run on boards and into zeroconf records: letters, digits, ``_``, ``.`` and
#: ``-``, never starting with ``.`` (hidden; ``..``) or ``-`` (read as a flag), and no ``..``.
NAME_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")
_NAME_RULE = "letters, digits, '_', '.' and '-', at most 100, not starting with '.' or '-', no '..'"


def check_name(name: str, what: str, fix: str) -> str:
    """``name``, refused unless it is a safe model name or bundle id (:data:`NAME_PATTERN`): a model
    named ``x/../../../escaped`` would give a bundle id that a board installs outside ``releases/``.
    ``what`` names it in the error, ``fix`` says what to do."""
    if not NAME_PATTERN.fullmatch(name) or ".." in name:
        raise BundleError(f"{what} {name!r} is not a safe name ({_NAME_RULE}); {fix}")
    return name


def check_relpath(relpath: str, where: str) -> str:
    """``relpath``, refused unless it names a file inside a bundle wherever the bundle lies: relative,
    POSIX separators, normalised (no ``.``, ``..`` or empty parts). Checked as a manifest is parsed,
    so no reader ever joins a forged ``../outside.onnx`` or ``/etc/passwd`` to a bundle's root."""
    fix = "re-export the bundle, or copy the bundle again from where it was exported"
    if relpath.startswith("/"):
        raise BundleError(f"{where} {relpath!r}: an absolute path; a bundle's paths are relative to it: {fix}")
    if any(part in ("", ".", "..") for part in relpath.split("/")) or "\\" in relpath or "\0" in relpath:
        raise BundleError(f"{where} {relpath!r}: not a normalised path inside the bundle (no '..', '.', '//' or "
                          f"'\\'): {fix}")
    return relpath


def file_sha256(path: Path, chunk_bytes: int = 1 << 20) -> str:
    """Hash in chunks: artifacts reach hundreds of MB (VGG16 tails) and must not be read whole."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


_AGAIN = "copy the bundle again"


def _size_drift(path: Path, size: int, expected: int) -> BundleError:
    return BundleError(f"{path}: {size:,} bytes, the manifest says {expected:,}; the copy is incomplete or the file "
                       f"was replaced: {_AGAIN}")


def artifact_path(root: str | Path, artifact: Artifact) -> Path:
    """Where ``artifact`` lies in the bundle at ``root``: the one resolver of every reader of bundles
    and releases (verify, load, serve, slice, a board's install and switch).

    Refused with a :class:`BundleError` naming the file and what to do unless it is a regular file
    inside the bundle (a link may point elsewhere inside it, never out: ``/proc/self/pagemap`` says
    it is 0 bytes and never ends) whose size is the manifest's, all before a byte of it is read.
    """
    root = Path(root)
    path = root / check_relpath(artifact.path, f"{root / MANIFEST_NAME}: artifact path")
    if not os.path.lexists(path):
        raise BundleError(f"{path}: listed in the manifest but missing; {_AGAIN}")
    real, base = path.resolve(), root.resolve()
    if base not in real.parents:
        raise BundleError(f"{path}: a link that leads outside the bundle (to {real}); a bundle's files lie inside "
                          f"it: {_AGAIN}, or re-export it")
    try:
        found = real.stat()
    except FileNotFoundError:
        raise BundleError(f"{path}: listed in the manifest but missing (a link to nothing); {_AGAIN}") from None
    if not stat.S_ISREG(found.st_mode):
        raise BundleError(f"{path}: not a regular file ({file_kind(found.st_mode)}); {_AGAIN}")
    if found.st_size != artifact.bytes:
        raise _size_drift(path, found.st_size, artifact.bytes)
    return path


def _check_sha256(root: Path, artifact: Artifact, chunk_bytes: int = 1 << 20) -> Path:
    """:func:`artifact_path`, then the sha256 of exactly the manifest's bytes. The file is opened
    without blocking and checked again on the open descriptor, and a byte past the manifest's size
    refuses it, so a file swapped for a FIFO or a procfs file after the check cannot hang a reader."""
    path = artifact_path(root, artifact)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            raise BundleError(f"{path}: not a regular file ({file_kind(found.st_mode)}); {_AGAIN}")
        digest, left = hashlib.sha256(), artifact.bytes
        while left and (chunk := fh.read(min(chunk_bytes, left))):
            digest.update(chunk)
            left -= len(chunk)
        if left or fh.read(1):
            raise _size_drift(path, os.fstat(fd).st_size, artifact.bytes)
    actual = digest.hexdigest()
    if actual != artifact.sha256:
        raise BundleError(f"{path}: sha256 {actual[:16]}… does not match the manifest's {artifact.sha256[:16]}…; "
                          f"the file is corrupt or was replaced: {_AGAIN}")
    return path


@dataclass(frozen=True)
class Artifact:
    """One file of the bundle: which part of the network it holds, in which format and precision."""

    role: str  # one of ROLES
    format: str  # one of FORMATS
    precision: str  # one of PRECISIONS
    path: str  # relative to the bundle directory, POSIX separators
    sha256: str
    bytes: int
    accuracy: float | None = None  # heads: top-1 of the split model with this head, where measured
    # float32 artifacts, as validated against torch at export: the largest absolute difference of an
    # output, and that over the spread of torch's outputs (a tail: the head and it together)
    max_abs_error: float | None = None
    max_rel_error: float | None = None


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


#: The bit widths a cut coding may have: eight values of each fill whole bytes (issue 47).
CUT_BITS = (8, 6, 4, 3, 2)


@dataclass(frozen=True)
class Coding:
    """A k-bit coding of a split's cut, calibrated at build: ``real = scale[c] * (q - zero[c])``
    per channel ``c`` (the cut's axis 1), ``q`` sent packed in ``bits`` bits (``wire.coding``), and
    what the build measured of it (bytes a sample crosses in, and the answers it keeps: top-1 on
    labelled test data, agreement with the float model on held-out images; None where not measured).
    A board or host never assumes a coding is good enough: the run chooses by what was measured."""

    bits: int  # one of CUT_BITS
    scale: tuple[float, ...]  # per channel, positive and finite
    zero: tuple[int, ...]  # per channel, 0 .. 2**bits - 1
    bytes_per_sample: int
    agreement: float | None = None
    top1: float | None = None

    @property
    def name(self) -> str:
        """How a frame, a reason and a table name it: ``k4`` for four bits."""
        return f"k{self.bits}"


@dataclass(frozen=True)
class Exit:
    """An early exit at a layer split's cut (issue 48): a small classifier on the cut, trained with
    the network frozen, exported as the head's second output ``output`` (so the board pays only the
    exit's own cost beyond the head), and its table of thresholds in ascending ``confidence`` (so
    ``share`` never grows), measured on ``measured_on`` held-out images. ``max_abs_error`` and
    ``max_rel_error``: the exit output's largest difference from torch over the split's float32
    heads, as the artifacts' own are recorded. A run never assumes an exit is good enough: it
    chooses a threshold by what was measured (:meth:`threshold`)."""

    @dataclass(frozen=True)
    class Threshold:
        """One row of an exit's table, measured at build on held-out images: with the exit answering
        every frame whose softmax maximum is at least ``confidence``, the ``share`` of frames it answered,
        their ``agreement`` with the full model's top-1, and where the images had labels the exit's
        top-1 on those frames (``top1``) and the full model's on the same frames (``full_top1``)."""

        confidence: float
        share: float
        agreement: float
        top1: float | None = None
        full_top1: float | None = None

    #: The head's output name a build gives an exit, and the kinds it trains (the exporter's words).
    OUTPUT: ClassVar[str] = "exit_logits"
    KINDS: ClassVar[tuple[str, ...]] = ("pool_linear", "conv")

    output: str  # the head's output name: OUTPUT
    kind: str  # one of KINDS
    params: int  # the exit's parameter count (what it adds to the head)
    measured_on: int  # held-out images the table was measured on
    thresholds: tuple[Exit.Threshold, ...]
    max_abs_error: float | None = None
    max_rel_error: float | None = None

    def threshold(self, agreement: float | None = None, top1_loss: float | None = None) -> Exit.Threshold | None:
        """The row of the lowest confidence (so the largest share) whose measured figure meets the
        floor: ``agreement`` (the exited frames' agreement with the full model at least this), or
        ``top1_loss`` (their top-1 at most this below the full model's on the same frames; rows
        measured without labels never meet it). None where no row does: the exit never answers."""
        if (agreement is None) == (top1_loss is None):
            raise ValueError("give one floor: agreement or top1_loss")
        for row in self.thresholds:
            if agreement is not None and row.agreement >= agreement:
                return row
            if (top1_loss is not None and row.top1 is not None and row.full_top1 is not None
                    and row.full_top1 - row.top1 <= top1_loss + 1e-12):  # 0.91 - 0.90 is 0.01000000000000001
                return row
        return None


@dataclass(frozen=True)
class Stage:
    """Stage ``index`` (1..n) of a chain: runs on a host from cut ``cut`` (its input, ``tensor``)
    to the next cut, or to the logits for the last stage. Stage 0 is the split's head."""

    index: int
    cut: str  # the id of the cut this stage starts from
    tensor: TensorSpec  # its input, per sample
    artifacts: tuple[Artifact, ...]  # role TAIL: input CUT, output CUT (to the next stage) or LOGITS (the last)


@dataclass(frozen=True)
class Fragment:
    """Fragment ``index`` (1..K) of a semantic split (SplitPlace's semantic split, seed-004 paper):
    a narrow network from the split's cut (its ``tensor``) to the logits of one group of classes,
    run on a host in parallel with the others. The board scatters each fragment's logits into
    label order at ``classes`` (label indices, in the order of the fragment's outputs)."""

    index: int
    classes: tuple[int, ...]
    artifacts: tuple[Artifact, ...]  # role TAIL: input CUT, output LOGITS with len(classes) columns
    params: int = 0  # the fragment's parameter count, against the tail's


@dataclass(frozen=True)
class Split:
    """One cut of the network: head on the board, tail on the host; a chain's tail is its
    ``stages``, one per host, each starting from one of its cuts; a semantic split's is its
    ``fragments``, run side by side, each for one group of classes."""

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
    stages: tuple[Stage, ...] = ()  # a chain's stages 1..n; () for every other kind
    fragments: tuple[Fragment, ...] = ()  # a semantic split's fragments 1..K; () for every other kind
    # A semantic split: how its classes were grouped, and top-1 accuracies measured on the same
    # images: "full" (the model), "layer" (head and tail at this cut), "semantic" (head and fragments).
    grouping: str | None = None
    accuracies: dict[str, float] = field(default_factory=dict)
    codings: tuple[Coding, ...] = ()  # k-bit codings of the cut, fewest bits last; () for none (issue 47)
    exit: Exit | None = None  # an early exit at the cut, a second output of its heads (issue 48); layer splits only

    def option(self, coding: Coding) -> str:
        """How a table, a reason and a trace name sending this split's cut in ``coding``."""
        return f"{self.id}{CODING_MARK}{coding.name}"

    def coding(self, name: str) -> Coding:
        """The coding a frame names; :class:`BundleError` naming the ones this split has."""
        for coding in self.codings:
            if coding.name == name:
                return coding
        known = ", ".join(c.name for c in self.codings) or "none"
        raise BundleError(f"split {self.id} has no cut coding {name!r} (it has: {known}); "
                          "rebuild the bundle with split-export build --cut-bits")

    def stage_id(self, index: int) -> str:
        """How a request names stage or fragment ``index`` of this split (:func:`stage_id`)."""
        return stage_id(self.id, index)

    @property
    def parts(self) -> tuple[Stage, ...] | tuple[Fragment, ...]:
        """What hosts serve of it beside its tail: a chain's stages or a semantic split's fragments."""
        return self.stages or self.fragments


def stage_id(split_id: str, index: int) -> str:
    """``<split>#<k>``: what a host serves and a request names for stage k of a chain, or
    fragment k of a semantic split."""
    return f"{split_id}{STAGE_MARK}{index}"


def semantic_id(cut: str, fragments: int) -> str:
    """``<cut>~<K>``: the id of the semantic split of ``fragments`` fragments after ``cut``."""
    return f"{cut}{FRAGMENT_MARK}{fragments}"


@dataclass(frozen=True)
class Preprocess:
    """How a camera frame becomes the model input, as torchvision's ImageClassification does it.

    ``folded``: the heads and the full model apply ``mean`` and ``std`` themselves and take the
    crop's pixel values (0-255), so the board only resizes and crops (schema 3). ``fast_agreement``:
    the top-1 agreement of the board's OpenCV preprocessing with the exact (PIL's) one, measured by
    the build on ``fast_agreement_on`` (in words); the board's ``--preprocess auto`` goes by it.
    """

    resize: int  # shorter side, pixels
    crop: int  # centre crop, pixels
    mean: tuple[float, ...]
    std: tuple[float, ...]
    interpolation: str = "bilinear"
    color: str = "RGB"
    folded: bool = False
    fast_agreement: float | None = None
    fast_agreement_on: str | None = None


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
    accuracy_on: str | None = None  # what every accuracy in the manifest was measured on, in words
    output: str | None = None  # a model of several outputs: the one the bundle answers with, in words


#: The parts a slice is cut for (:mod:`device_runtime._bundle_slice`): what a board runs, what a host serves.
BOARD_PART, HOST_PART = "board", "host"
PARTS = (BOARD_PART, HOST_PART)


@dataclass(frozen=True)
class SliceSource:
    """Where a slice was cut from: the full bundle's identity, and what was kept of it.

    A slice has a manifest of its own (fewer artifacts), hence an identity of its own; the
    source's ``bundle_id`` is the name every part of one export shares on the wire (see
    :attr:`Manifest.wire_id`), so a board running the board slice and a host serving the host
    slice (or the full bundle) find each other.
    """

    bundle_id: str
    manifest_sha256: str
    part: str  # one of PARTS
    formats: tuple[str, ...]  # the formats kept of heads and full model
    precision: str | None = None  # the precision asked for (None: every precision kept)


@dataclass(frozen=True)
class Manifest:
    """What a bundle holds. ``bundle_id`` and ``manifest_sha256`` are its identity, derived from the
    rest (:func:`manifest_digest`): the exporter builds a manifest without them, :func:`write_manifest`
    stamps them, and :func:`parse_manifest` refuses a manifest whose content no longer gives them."""

    model: ModelInfo
    full: tuple[Artifact, ...]
    splits: tuple[Split, ...]
    created_by: str = "splitedge"
    schema_version: int = SCHEMA_VERSION
    bundle_id: str = ""
    manifest_sha256: str = ""
    source: SliceSource | None = None  # a slice's full bundle; None for a bundle as exported

    @property
    def wire_id(self) -> str:
        """The id this bundle answers to on the wire, in ``hello`` and in zeroconf: the source's
        for a slice (every slice of one export, and the export itself, share it), else its own."""
        return self.bundle_id if self.source is None else self.source.bundle_id

    def to_json(self) -> str:
        data = _content(self)
        leading = {key: data[key] for key in ("schema_version", *IDENTITY_FIELDS)}  # read first by a person
        return json.dumps(leading | data, indent=2)

    def option(self, option_id: str) -> tuple[Split, Coding | None]:
        """The split an option runs and the coding it sends its cut in (None: the split's usual
        uint8 or float32), for a split's id or a coded option's (:meth:`Split.option`)."""
        split_id, mark, coding = option_id.rpartition(CODING_MARK)
        if not mark:
            return self.split(option_id), None
        split = self.split(split_id)
        return split, split.coding(coding)

    def split(self, split_id: str) -> Split:
        for split in self.splits:
            if split.id == split_id:
                return split
        known = ", ".join(s.id for s in self.splits) or "none"
        raise BundleError(f"unknown split {split_id!r} in bundle {self.bundle_id}; splits: {known}")


_fields = Fields(BundleError)


def _content(manifest: Manifest) -> dict[str, Any]:
    """The manifest as JSON data; ``source`` only in a slice, so a bundle as exported reads (and
    hashes) exactly as it did before slices existed."""
    data = asdict(manifest)
    if data["source"] is None:
        del data["source"]
    preprocess = data["model"]["preprocess"]
    for key, empty in (("folded", False), ("fast_agreement", None), ("fast_agreement_on", None)):
        if preprocess[key] is empty:
            del preprocess[key]  # a bundle built without them reads (and hashes) as before
    for split in data["splits"]:
        for key, empty in (("stages", ()), ("fragments", ()), ("grouping", None), ("accuracies", {}), ("codings", ()),
                           ("exit", None)):
            if split[key] in (empty, []):
                del split[key]  # only chains have stages, only semantic splits the rest: others read as in schema 1
    return data


def _at(parent: Mapping[str, Any], key: str, path: str) -> tuple[Any, str]:
    """A required member and its path, for a check: ``_fields.text(*_at(obj, "id", path))``."""
    return _fields.member(parent, key, path), join(path, key)


def _shape(parent: Mapping[str, Any], key: str, path: str) -> tuple[int, ...]:
    values, where = _at(parent, key, path)
    return tuple(_fields.integer(v, f"{where}[{i}]", minimum=0) for i, v in enumerate(_fields.array(values, where)))


def _optional_number(parent: Mapping[str, Any], key: str, path: str, minimum: float = 0.0) -> float | None:
    """Measured values (accuracy, CUI) are absent or null where nothing was measured."""
    value = parent.get(key)
    return None if value is None else _fields.number(value, join(path, key), minimum)


def _artifact(raw: Any, path: str) -> Artifact:
    obj = _fields.obj(raw, path)
    return Artifact(
        role=_fields.choice(*_at(obj, "role", path), ROLES),
        format=_fields.choice(*_at(obj, "format", path), FORMATS),
        precision=_fields.choice(*_at(obj, "precision", path), PRECISIONS),
        path=check_relpath(*_at(obj, "path", path)),
        sha256=_fields.text(*_at(obj, "sha256", path)),
        bytes=_fields.integer(*_at(obj, "bytes", path), minimum=0),
        accuracy=_optional_number(obj, "accuracy", path),
        max_abs_error=_optional_number(obj, "max_abs_error", path),
        max_rel_error=_optional_number(obj, "max_rel_error", path),
    )


def _artifacts(parent: Mapping[str, Any], key: str, path: str) -> tuple[Artifact, ...]:
    values, where = _at(parent, key, path)
    return tuple(_artifact(a, f"{where}[{i}]") for i, a in enumerate(_fields.array(values, where)))


def _quantization(raw: Any, path: str) -> Quantization:
    obj = _fields.obj(raw, path)
    return Quantization(
        scale=_fields.number(*_at(obj, "scale", path)),
        zero_point=_fields.integer(*_at(obj, "zero_point", path), minimum=0),
        dtype=_fields.text(*_at(obj, "dtype", path)),
    )


def _coding(raw: Any, path: str, channels: int) -> Coding:
    obj = _fields.obj(raw, path)
    bits = _fields.integer(*_at(obj, "bits", path), minimum=1)
    if bits not in CUT_BITS:
        raise BundleError(f"{join(path, 'bits')}: a cut coding has {', '.join(map(str, CUT_BITS))} bits, not {bits}")
    scale, zero = (_fields.array(*_at(obj, key, path)) for key in ("scale", "zero"))
    if len(scale) != channels or len(zero) != channels:
        raise BundleError(f"{path}: a coding has one scale and one zero point per channel of the cut ({channels}), "
                          f"got {len(scale)} and {len(zero)}")
    scales = tuple(_fields.number(s, f"{join(path, 'scale')}[{i}]") for i, s in enumerate(scale))
    if not all(0 < s < math.inf for s in scales):
        raise BundleError(f"{join(path, 'scale')}: every scale must be positive and finite")
    zeros = tuple(_fields.integer(z, f"{join(path, 'zero')}[{i}]", minimum=0) for i, z in enumerate(zero))
    if max(zeros, default=0) >= 1 << bits:
        raise BundleError(f"{join(path, 'zero')}: a {bits}-bit coding's zero points are 0..{(1 << bits) - 1}")
    return Coding(bits, scales, zeros, _fields.integer(*_at(obj, "bytes_per_sample", path), minimum=0),
                  _optional_number(obj, "agreement", path), _optional_number(obj, "top1", path))


def _codings(split: Mapping[str, Any], tensor: TensorSpec, path: str) -> tuple[Coding, ...]:
    raw = split.get("codings")
    if raw is None:
        return ()
    where = join(path, "codings")
    if len(tensor.shape) < 1:
        raise BundleError(f"{where}: a coded cut needs channels (axis 1), the cut's shape is {list(tensor.shape)}")
    codings = tuple(_coding(c, f"{where}[{i}]", tensor.shape[0]) for i, c in enumerate(_fields.array(raw, where)))
    if len({c.bits for c in codings}) != len(codings):
        raise BundleError(f"{where}: each bit width may be listed once")
    return codings


def _unit(parent: Mapping[str, Any], key: str, path: str, optional: bool = False) -> float | None:
    """A share or a probability: a finite number in [0, 1] (None where ``optional`` and absent or null)."""
    value = parent.get(key)
    if optional and value is None:
        return None
    number = _fields.number(*_at(parent, key, path))
    if number > 1:
        raise BundleError(f"{join(path, key)}: expected a number in [0, 1], got {number!r}")
    return number


def _exit_threshold(raw: Any, path: str) -> Exit.Threshold:
    obj = _fields.obj(raw, path)
    row = Exit.Threshold(
        confidence=_unit(obj, "confidence", path), share=_unit(obj, "share", path),
        agreement=_unit(obj, "agreement", path), top1=_unit(obj, "top1", path, optional=True),
        full_top1=_unit(obj, "full_top1", path, optional=True),
    )
    if (row.top1 is None) != (row.full_top1 is None):
        raise BundleError(f"{path}: top1 and full_top1 are measured on the same frames: both numbers or both null")
    return row


def _exit(split: Mapping[str, Any], path: str) -> Exit | None:
    """A layer split's early exit (issue 48): what a board will let answer a frame, so every number
    is checked, not only its type: a forged table (a share above 1, thresholds out of order, an
    agreement of NaN) would let an exit answer frames it was never measured to answer well."""
    raw = split.get("exit")
    if raw is None:
        return None
    where = join(path, "exit")
    if split.get("kind") != LAYER:
        raise BundleError(f"{where}: only a layer split has an exit (this split is {split.get('kind')!r})")
    obj = _fields.obj(raw, where)
    output = _fields.text(*_at(obj, "output", where))
    if not OUTPUT_NAME.fullmatch(output) or output in (INPUT, CUT):
        raise BundleError(f"{join(where, 'output')}: {output!r} is not a head output name for an exit (a plain name "
                          f"of letters, digits and '_', not {INPUT!r} or {CUT!r})")
    rows_raw, rpath = _at(obj, "thresholds", where)
    rows = tuple(_exit_threshold(r, f"{rpath}[{i}]") for i, r in enumerate(_fields.array(rows_raw, rpath)))
    if not rows:
        raise BundleError(f"{rpath}: an exit has at least one measured threshold")
    for i, (before, row) in enumerate(zip(rows, rows[1:]), 1):
        if row.confidence <= before.confidence:
            raise BundleError(f"{rpath}[{i}].confidence: thresholds are listed in ascending confidence, each once")
        if row.share > before.share:
            raise BundleError(f"{rpath}[{i}].share: a higher threshold lets no more frames exit than a lower one")
    return Exit(
        output=output,
        kind=_fields.choice(*_at(obj, "kind", where), Exit.KINDS),
        params=_fields.integer(*_at(obj, "params", where), minimum=1),
        measured_on=_fields.integer(*_at(obj, "measured_on", where), minimum=1),
        thresholds=rows,
        max_abs_error=_optional_number(obj, "max_abs_error", where),
        max_rel_error=_optional_number(obj, "max_rel_error", where),
    )


def _split(raw: Any, path: str) -> Split:
    obj = _fields.obj(raw, path)
    quantization = obj.get("quantization")
    tensor = _tensor_spec(obj, path)
    return Split(
        id=_fields.text(*_at(obj, "id", path)),
        position=_fields.integer(*_at(obj, "position", path), minimum=0),
        kind=_fields.choice(*_at(obj, "kind", path), SPLIT_KINDS),
        tensor=tensor,
        compression_ratio=_fields.number(*_at(obj, "compression_ratio", path)),
        natural=_fields.flag(*_at(obj, "natural", path)),
        compressive=_fields.flag(*_at(obj, "compressive", path)),
        artifacts=_artifacts(obj, "artifacts", path),
        cui=_optional_number(obj, "cui", path, minimum=-math.inf),
        quantization=None if quantization is None else _quantization(quantization, join(path, "quantization")),
        accuracy=_optional_number(obj, "accuracy", path),
        stages=_stages(obj, path),
        fragments=_fragments(obj, path),
        grouping=None if obj.get("grouping") is None else _fields.text(*_at(obj, "grouping", path)),
        accuracies=_accuracies(obj, path),
        codings=_codings(obj, tensor, path),
        exit=_exit(obj, path),
    )


def _tensor_spec(parent: Mapping[str, Any], path: str) -> TensorSpec:
    tensor, tpath = _at(parent, "tensor", path)
    tensor = _fields.obj(tensor, tpath)
    return TensorSpec(
        shape=_shape(tensor, "shape", tpath),
        dtype=_fields.text(*_at(tensor, "dtype", tpath)),
        bytes_per_sample=_fields.integer(*_at(tensor, "bytes_per_sample", tpath), minimum=0),
    )


#: What a chain's stages and a semantic split's fragments are called in errors: (the kind's name,
#: a part's, the order they run in, what too few of them would be).
_PARTS = {CHAIN: ("a chain", "stage", "stages run 1..n in order", "a chain has two stages or more (one is a layer split)"),
          SEMANTIC: ("a semantic split", "fragment", "1..K in order", "a semantic split has two fragments or more")}


def _numbered(split: Mapping[str, Any], path: str, key: str, kind: str, parse: Callable[[Any, str, int], Any]) -> tuple:
    """A chain's ``stages`` or a semantic split's ``fragments``: numbered 1..n in order, two or more,
    on that kind of split only; each parsed by ``parse(obj, path, index)``."""
    name, word, order, too_few = _PARTS[kind]
    own, raw = split.get("kind"), split.get(key)
    where = join(path, key)
    if raw is None:
        if own == kind:
            raise BundleError(f"{where}: {name} needs its {key}")
        return ()
    if own != kind:
        raise BundleError(f"{where}: only {name} has {key} (this split is {own!r})")
    parts = []
    for i, value in enumerate(_fields.array(raw, where), 1):
        ppath = f"{where}[{i - 1}]"
        obj = _fields.obj(value, ppath)
        index = _fields.integer(*_at(obj, "index", ppath), minimum=1)
        if index != i:
            raise BundleError(f"{join(ppath, 'index')}: {word} {index} where {word} {i} belongs ({order})")
        parts.append(parse(obj, ppath, index))
    if len(parts) < 2:
        raise BundleError(f"{where}: {too_few}")
    return tuple(parts)


def _stages(split: Mapping[str, Any], path: str) -> tuple[Stage, ...]:
    """A chain's stages 1..n, in order; a chain without stages, or stages on another kind, is refused."""
    return _numbered(split, path, "stages", CHAIN, lambda obj, spath, index: Stage(
        index=index, cut=_fields.text(*_at(obj, "cut", spath)), tensor=_tensor_spec(obj, spath),
        artifacts=_artifacts(obj, "artifacts", spath)))


def _fragments(split: Mapping[str, Any], path: str) -> tuple[Fragment, ...]:
    """A semantic split's fragments 1..K, in order, their class groups disjoint label indices; a
    semantic split without fragments, or fragments on another kind, is refused. That the groups
    cover every label is checked against the model's labels by :func:`_check_fragments`."""
    seen: set[int] = set()

    def fragment(obj: Any, fpath: str, index: int) -> Fragment:
        cpath = join(fpath, "classes")
        classes = tuple(_fields.integer(c, f"{cpath}[{j}]", minimum=0)
                        for j, c in enumerate(_fields.array(_fields.member(obj, "classes", fpath), cpath)))
        if not classes:
            raise BundleError(f"{cpath}: a fragment scores at least one class")
        twice = sorted(seen.intersection(classes))
        if twice or len(set(classes)) != len(classes):
            raise BundleError(f"{cpath}: label {(twice or [c for c in classes if classes.count(c) > 1])[0]} is in "
                              "two groups; each label belongs to exactly one fragment")
        seen.update(classes)
        params = obj.get("params", 0)
        return Fragment(index=index, classes=classes, artifacts=_artifacts(obj, "artifacts", fpath),
                        params=_fields.integer(params, join(fpath, "params"), minimum=0))

    return _numbered(split, path, "fragments", SEMANTIC, fragment)


def _check_fragments(split: Split, labels: int, path: str) -> None:
    """A semantic split's groups cover the model's labels exactly: a missing label could never be
    the answer, one past the end has no name."""
    if not split.fragments:
        return
    covered = sorted(c for fragment in split.fragments for c in fragment.classes)
    if covered != list(range(labels)):
        outside = [c for c in covered if c >= labels]
        missing = sorted(set(range(labels)) - set(covered))
        what = f"label {outside[0]} is past the model's {labels} labels" if outside else f"label {missing[0]} is in no group"
        raise BundleError(f"{path}: semantic split {split.id}: {what}; its fragments' groups must cover labels 0..{labels - 1}")


def _accuracies(split: Mapping[str, Any], path: str) -> dict[str, float]:
    raw = split.get("accuracies")
    if raw is None:
        return {}
    where = join(path, "accuracies")
    return {_fields.text(k, where): _fields.number(v, join(where, str(k))) for k, v in _fields.obj(raw, where).items()}


def _splits(parent: Mapping[str, Any], path: str) -> tuple[Split, ...]:
    values, where = _at(parent, "splits", path)
    return tuple(_split(s, f"{where}[{i}]") for i, s in enumerate(_fields.array(values, where)))


def _source(raw: Any, path: str) -> SliceSource:
    obj = _fields.obj(raw, path)
    formats, fpath = _at(obj, "formats", path)
    precision = obj.get("precision")
    return SliceSource(
        bundle_id=check_name(_fields.text(*_at(obj, "bundle_id", path)), join(path, "bundle_id"), _NAME_FIX),
        manifest_sha256=_fields.text(*_at(obj, "manifest_sha256", path)),
        part=_fields.choice(*_at(obj, "part", path), PARTS),
        formats=tuple(_fields.choice(v, f"{fpath}[{i}]", FORMATS) for i, v in enumerate(_fields.array(formats, fpath))),
        precision=None if precision is None else _fields.choice(precision, join(path, "precision"), PRECISIONS),
    )


def _model(raw: Any, path: str) -> ModelInfo:
    obj = _fields.obj(raw, path)
    pre, ppath = _at(obj, "preprocess", path)
    pre = _fields.obj(pre, ppath)
    mean, mpath = _at(pre, "mean", ppath)
    std, spath = _at(pre, "std", ppath)
    labels, lpath = _at(obj, "labels", path)
    return ModelInfo(
        name=check_name(_fields.text(*_at(obj, "name", path)), join(path, "name"), _NAME_FIX),
        input_shape=_shape(obj, "input_shape", path),
        input_dtype=_fields.text(*_at(obj, "input_dtype", path)),
        layout=_fields.text(*_at(obj, "layout", path)),
        output_shape=_shape(obj, "output_shape", path),
        preprocess=Preprocess(
            resize=_fields.integer(*_at(pre, "resize", ppath), minimum=1),
            crop=_fields.integer(*_at(pre, "crop", ppath), minimum=1),
            mean=tuple(_fields.number(v, f"{mpath}[{i}]", -math.inf) for i, v in enumerate(_fields.array(mean, mpath))),
            std=tuple(_fields.number(v, f"{spath}[{i}]") for i, v in enumerate(_fields.array(std, spath))),
            interpolation=_fields.text(*_at(pre, "interpolation", ppath)),
            color=_fields.text(*_at(pre, "color", ppath)),
            folded=_fields.flag(pre.get("folded", False), join(ppath, "folded")),
            fast_agreement=_optional_number(pre, "fast_agreement", ppath),
            fast_agreement_on=None if pre.get("fast_agreement_on") is None
            else _fields.text(*_at(pre, "fast_agreement_on", ppath)),
        ),
        labels=tuple(_fields.text(v, f"{lpath}[{i}]", empty=True) for i, v in enumerate(_fields.array(labels, lpath))),
        accuracy=_optional_number(obj, "accuracy", path),
        accuracy_on=None if obj.get("accuracy_on") is None else _fields.text(*_at(obj, "accuracy_on", path)),
        output=None if obj.get("output") is None else _fields.text(*_at(obj, "output", path)),
    )


def manifest_digest(data: Mapping[str, Any]) -> str:
    """sha256 of the manifest's canonical JSON (sorted keys, no whitespace), its identity left out.

    The artifacts' sha256 are inside, so this one digest covers every file of the bundle and
    every word of its manifest: a label, a split or a quantization scale changed after export
    changes it, as a replaced file does.
    """
    content = {key: value for key, value in data.items() if key not in IDENTITY_FIELDS}
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


#: What to do about an unsafe name in a manifest.
_NAME_FIX = "re-export the bundle from a model whose name is made of letters, digits, '_', '.' and '-'"


def bundle_id(model_name: str, digest: str) -> str:
    """``<model>-<12 hex>``: readable, and as unique as the content (48 bits of its digest); safe to
    name a directory with, since the model name is (:func:`check_name`)."""
    return f"{check_name(model_name, 'model name', _NAME_FIX)}-{digest[:ID_DIGITS]}"


def _check_identity(data: Mapping[str, Any], name: str, source: str) -> tuple[str, str]:
    """The stored (bundle_id, manifest_sha256), refused unless the content gives both."""
    root = f"{source}:"
    stored_id = _fields.text(*_at(data, "bundle_id", root))
    if "manifest_sha256" not in data:
        raise BundleError(
            f"{source}: no manifest_sha256: exported before bundles carried an identity that covers "
            "their manifest; re-export the bundle with this splitedge"
        )
    stored_digest = _fields.text(*_at(data, "manifest_sha256", root))
    digest = manifest_digest(data)
    if (stored_id, stored_digest) != (bundle_id(name, digest), digest):
        raise BundleError(
            f"{source}: edited after export: its content no longer gives its bundle_id {stored_id} "
            f"and manifest_sha256 {stored_digest[:12]}…; re-export the bundle, "
            "or restore the manifest.json it was exported with"
        )
    return stored_id, stored_digest


def parse_manifest(data: Any, source: str = MANIFEST_NAME) -> Manifest:
    """Turn decoded JSON into a :class:`Manifest`, refusing newer schemas, bad fields by name and
    any content that does not give the manifest's identity (see :func:`manifest_digest`)."""
    root = f"{source}:"
    data = _fields.obj(data, source)
    version = _fields.integer(*_at(data, "schema_version", root), minimum=1)
    if version > SCHEMA_VERSION:
        raise BundleError(
            f"{source}: schema_version {version} is newer than this splitedge reads ({SCHEMA_VERSION}); "
            "upgrade splitedge on this machine"
        )
    created_by = data.get("created_by")
    created_by = "unknown" if created_by is None else _fields.text(created_by, join(root, "created_by"))
    model = _model(_fields.member(data, "model", root), join(root, "model"))
    full, splits = _artifacts(data, "full", root), _splits(data, root)
    newer = [s for s in splits if s.kind in (CHAIN, SEMANTIC)]
    if newer and version < CHAIN_SCHEMA:
        raise BundleError(f"{source}: {newer[0].kind} split {newer[0].id} in a schema_version {version} manifest; "
                          f"{newer[0].kind} splits came with schema {CHAIN_SCHEMA}: re-export the bundle")
    exiting = next((s for s in splits if s.exit is not None), None)
    if exiting is not None and version < EXIT_SCHEMA:
        raise BundleError(f"{source}: split {exiting.id} has an exit in a schema_version {version} manifest; exits came "
                          f"with schema {EXIT_SCHEMA}: re-export the bundle")
    if model.preprocess.folded and version < FOLDED_SCHEMA:
        raise BundleError(f"{source}: model.preprocess.folded in a schema_version {version} manifest; folded "
                          f"normalisation came with schema {FOLDED_SCHEMA}: re-export the bundle")
    for split in splits:
        _check_fragments(split, len(model.labels), join(root, "splits"))
    origin = data.get("source")
    origin = None if origin is None else _source(origin, join(root, "source"))
    # Fields first: a manifest that is both malformed and edited is refused naming the field.
    identity, digest = _check_identity(data, model.name, source)
    return Manifest(
        schema_version=version, created_by=created_by, model=model, full=full, splits=splits,
        bundle_id=identity, manifest_sha256=digest, source=origin,
    )


@dataclass
class Bundle:
    """A loaded, verified bundle directory."""

    root: Path
    manifest: Manifest
    verified: set[str] = field(default_factory=set)  # relative paths whose sha256 matched

    @property
    def id(self) -> str:
        """The id requests, ``hello`` and zeroconf name it by (:attr:`Manifest.wire_id`): a slice
        answers to its full bundle's id. Its own identity is ``manifest.bundle_id``."""
        return self.manifest.wire_id

    @classmethod
    def load(cls, root: str | Path, roles: Iterable[str] = ROLES) -> "Bundle":
        """Load ``root/manifest.json`` and verify every artifact of the given roles.

        Heads and the full model matter to a device, tails to a host; artifacts of other
        roles are neither required nor read, which keeps a board from hashing files it lacks.
        A ``root`` that is a link (a board's ``current``) is followed once, here: the bundle
        stays the release it was loaded from when the link is switched under a running board.
        """
        root = Path(root)
        if root.is_symlink():
            root = root.resolve()
        manifest_path = root / MANIFEST_NAME
        try:
            text = read_text_bounded(manifest_path, MAX_MANIFEST_BYTES)  # not a FIFO, a device, or endless
        except FileNotFoundError as exc:
            raise BundleError(f"{manifest_path}: no manifest; is {root} a bundle directory?") from exc
        except OSError as exc:
            raise BundleError(f"{manifest_path}: cannot read the manifest ({exc.strerror or exc}); {_AGAIN}") from exc
        except UnicodeDecodeError as exc:
            raise BundleError(f"{manifest_path}: not valid JSON (not UTF-8 at byte {exc.start})") from exc
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:  # not JSON, nested too deep
            raise BundleError(f"{manifest_path}: not valid JSON ({exc})") from exc
        bundle = cls(root=root, manifest=parse_manifest(data, str(manifest_path)))
        wanted = set(roles)
        for artifact in bundle.all_artifacts():
            if artifact.role in wanted:
                bundle.verify(artifact)
        return bundle

    def all_artifacts(self) -> list[Artifact]:
        return [*self.manifest.full, *(a for s in self.manifest.splits for a in artifacts_of(s))]

    def stage_artifact(self, split_id: str, index: int) -> Path:
        """Path of the verified ONNX artifact of stage (or fragment) ``index`` of split ``split_id``."""
        split = self.manifest.split(split_id)
        for part in split.parts:
            if part.index == index and part.artifacts:
                return self.verify(part.artifacts[0])
        word = "fragment" if split.fragments else "stage"
        raise BundleError(f"bundle {self.id} has no {word} {index} of split {split_id!r}"
                          + (f" ({word}s 1..{len(split.parts)})" if split.parts else " (not a chain or semantic split)"))

    def verify(self, artifact: Artifact) -> Path:
        """The artifact's path once it is confined, of its size and hash (:func:`artifact_path`); each once."""
        if artifact.path in self.verified:
            return self.root / artifact.path
        path = _check_sha256(self.root, artifact)
        self.verified.add(artifact.path)
        return path

    def artifact(self, split_id: str, role: str, fmt: str = ONNX, precision: str = FLOAT32) -> Path:
        """Path of a verified artifact; ``split_id`` is ``local`` for the full model."""
        candidates = self.manifest.full if split_id == LOCAL else self.manifest.split(split_id).artifacts
        for artifact in candidates:
            if (artifact.role, artifact.format, artifact.precision) == (role, fmt, precision):
                return self.verify(artifact)
        raise BundleError(
            f"bundle {self.id} has no {precision} {fmt} {role} for split {split_id!r}"
        )

    def find(self, split_id: str, role: str, fmt: str = ONNX, precision: str = FLOAT32) -> Artifact | None:
        """The artifact's entry where it is listed and present on disk (a host bundle may omit heads).
        Present is any name there, a link or a FIFO too: using it verifies it, which refuses those."""
        candidates = self.manifest.full if split_id == LOCAL else self.manifest.split(split_id).artifacts
        return next((a for a in candidates
                     if (a.role, a.format, a.precision) == (role, fmt, precision)
                     and os.path.lexists(self.root / a.path)), None)

    def has(self, split_id: str, role: str, fmt: str = ONNX, precision: str = FLOAT32) -> bool:
        """Whether the artifact is listed and present on disk."""
        return self.find(split_id, role, fmt, precision) is not None


def artifacts_of(split: Split) -> list[Artifact]:
    """Every artifact of a split: its own (heads, a tail) and its stages' or fragments' (its hosts')."""
    return [*split.artifacts, *(a for part in split.parts for a in part.artifacts)]


def write_manifest(root: str | Path, manifest: Manifest) -> Manifest:
    """Stamp ``manifest`` with its identity and write it as ``manifest.json``; returns the stamped one.

    The exporter calls this after every artifact is in place and hashed. Whatever identity the
    manifest had is replaced: it is derived from the content, never chosen.
    """
    path = Path(root) / MANIFEST_NAME
    # The oldest schema that holds the content: a bundle without chains stays readable by schema-1 boards.
    needs = [FOLDED_SCHEMA if manifest.model.preprocess.folded else 1,
             CHAIN_SCHEMA if any(s.parts for s in manifest.splits) else 1,
             EXIT_SCHEMA if any(s.exit is not None for s in manifest.splits) else 1]
    manifest = replace(manifest, schema_version=max(needs))
    digest = manifest_digest(_content(manifest))
    stamped = replace(manifest, bundle_id=bundle_id(manifest.model.name, digest), manifest_sha256=digest)
    # Round-trip through the parser so that a writer bug cannot produce a bundle readers refuse.
    parse_manifest(json.loads(stamped.to_json()), str(path))
    path.write_text(stamped.to_json() + "\n")
    return stamped


def make_artifact(root: str | Path, relpath: str, role: str, fmt: str, precision: str,
                  errors: tuple[float, float | None] | None = None) -> Artifact:
    """Describe a file already written under ``root``: its hash and size (its path checked as a reader
    will), and ``errors`` (absolute, relative) where it was validated."""
    path = Path(root) / check_relpath(relpath, "artifact path")
    max_abs, max_rel = errors if errors is not None else (None, None)
    return Artifact(role=role, format=fmt, precision=precision, path=relpath, sha256=file_sha256(path),
                    bytes=path.stat().st_size, max_abs_error=max_abs, max_rel_error=max_rel)


def verify_files(root: str | Path) -> tuple[Manifest | None, list[str]]:
    """Every problem of the bundle at ``root``, one line each naming the file and what to do.

    Unlike :meth:`Bundle.load`, which stops at the first file it refuses, this checks every
    artifact the manifest lists (present, size, sha256), for scripts and deploys that must say
    all that is wrong at once. The manifest is None when it could not be read.
    """
    root = Path(root)
    try:
        manifest = Bundle.load(root, roles=()).manifest
    except BundleError as exc:
        return None, [str(exc)]
    problems = []
    for artifact in [*manifest.full, *(a for s in manifest.splits for a in artifacts_of(s))]:
        try:
            _check_sha256(root, artifact)
        except BundleError as exc:
            problems.append(str(exc))
    return manifest, problems
