"""Slices of a bundle: the part a board needs, or the part a host needs, as bundles of their own.

A board runs heads and the full model (local fallback), in the format and precision it runs;
a host serves tails and the full model (full offload) in ONNX. A slice keeps those artifacts,
hard-linked where it can (copied across file systems; never symlinked: a slice is uploaded and
must stand alone), and writes a manifest of its own, so it is verified like any bundle. Fewer
artifacts make another manifest, so a slice has an identity of its own (its ``bundle_id`` names
its release directory on a board); it also records its source (:class:`SliceSource`), whose
``bundle_id`` is the name every part of one export answers to on the wire
(:attr:`Manifest.wire_id`): a board running a board slice is served by a host serving the host
slice, the full bundle, or a host slice of it.

No torch and nothing of the exporter: deploys slice where only the runtimes are installed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable, Sequence

from device_runtime.bundle import (
    BOARD_PART,
    FLOAT32,
    FORMATS,
    FULL,
    HEAD,
    HOST_PART,
    ONNX,
    PARTS,
    PRECISIONS,
    TAIL,
    Artifact,
    Bundle,
    Manifest,
    SliceSource,
    artifacts_of,
    write_manifest,
)
from splitedge.errors import BundleError
from splitedge.lifecycle import signals_held

__all__ = ["SliceResult", "slice_bundle"]

#: What each part runs: heads on the board, tails on the host, the full model on both.
ROLES_OF = {BOARD_PART: (HEAD, FULL), HOST_PART: (TAIL, FULL)}


@dataclass
class SliceResult:
    """What :func:`slice_bundle` wrote: the slice's manifest, how its files got there, what it left out."""

    out: Path
    manifest: Manifest
    files: int = 0
    bytes: int = 0
    linked: int = 0  # hard links: no bytes copied
    notes: list[str] = field(default_factory=list)  # splits left out, precisions that fell back

    def summary(self) -> str:
        m = self.manifest
        kept = ", ".join(s.id for s in m.splits) or "none"
        how = f"{self.linked} hard-linked, {self.files - self.linked} copied"
        part = m.source.part if m.source is not None else "?"
        return (f"wrote {part} slice {m.bundle_id} of {m.wire_id} to {self.out}: "
                f"{self.files} files, {self.bytes / 1e6:.1f} MB ({how}); splits {kept}")


def _keep(
    artifacts: Iterable[Artifact], roles: Sequence[str], formats: Sequence[str], precision: str | None,
) -> tuple[list[Artifact], list[str]]:
    """The artifacts of one split (or the full model) a part keeps, and the (role, format) pairs whose
    ``precision`` was missing so that float32 stands in (every artifact has a float32 variant: a board
    running ``--precision auto`` runs the same files from the slice as from the bundle)."""
    kept, fell_back = [], []
    candidates = [a for a in artifacts if a.role in roles and a.format in formats]
    for role in roles:
        for fmt in formats:
            group = [a for a in candidates if (a.role, a.format) == (role, fmt)]
            if precision is None or not group:
                kept += group
                continue
            chosen = [a for a in group if a.precision == precision]
            if not chosen:
                chosen = [a for a in group if a.precision == FLOAT32]
                fell_back.append(f"{fmt} {role}")
            kept += chosen
    return kept, fell_back


def _formats_for(part: str, bundle: Bundle, formats: Sequence[str] | None) -> tuple[str, ...]:
    present = {a.format for a in bundle.all_artifacts() if a.role in ROLES_OF[part]}
    if part == HOST_PART:
        # A host runs onnxruntime: tails are ONNX, and so is the full model it serves as offload.
        if formats is not None and set(formats) - {ONNX}:
            raise BundleError(f"a host runs ONNX tails only: --formats {','.join(formats)} cannot apply to --for host")
        return (ONNX,)
    if formats is None:
        return tuple(f for f in FORMATS if f in present)
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise BundleError(f"unknown format(s) {', '.join(unknown)}; formats: {', '.join(FORMATS)}")
    missing = [f for f in formats if f not in present]
    if missing:
        raise BundleError(f"bundle {bundle.manifest.bundle_id} has no {', '.join(missing)} heads or full model "
                          f"(it has {', '.join(sorted(present)) or 'none'}); export them with split-export build "
                          f"--formats onnx,{','.join(missing)}")
    return tuple(formats)


def slice_manifest(
    bundle: Bundle, part: str, formats: Sequence[str] | None = None, precision: str | None = None,
) -> tuple[Manifest, list[str]]:
    """The manifest of ``bundle``'s ``part`` (unstamped: :func:`write_manifest` gives it its identity)
    and notes on what was left out or fell back."""
    if part not in PARTS:
        raise BundleError(f"part {part!r}: expected one of {', '.join(PARTS)}")
    if precision is not None and precision not in PRECISIONS:
        raise BundleError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
    if part == HOST_PART and precision not in (None, FLOAT32):
        raise BundleError("a host runs float32 tails: --precision cannot apply to --for host")
    manifest = bundle.manifest
    origin = manifest.source
    if origin is not None and origin.part != part:
        raise BundleError(f"bundle {manifest.bundle_id} is already a {origin.part} slice of {origin.bundle_id}, "
                          f"which has no {part} artifacts; slice the full bundle {origin.bundle_id} instead")
    kept_formats = _formats_for(part, bundle, formats)
    roles = ROLES_OF[part]
    # The host's offload runs the float32 ONNX full model; a board keeps what it may run.
    full_precision = FLOAT32 if part == HOST_PART else precision
    full, fell_back = _keep(manifest.full, (FULL,), kept_formats, full_precision)
    notes = [f"full model: no {precision} {what}, the float32 one is kept" for what in fell_back]
    if part == BOARD_PART and not full:
        raise BundleError(f"bundle {manifest.bundle_id} has no {'/'.join(kept_formats)} full model, which a board "
                          "needs to answer without a host")
    splits = []
    for split in manifest.splits:
        artifacts, fell_back = _keep(split.artifacts, roles[:1], kept_formats, precision)
        # A chain's stages and a semantic split's fragments run on hosts: a host keeps their files; a
        # board keeps what they are (cuts, tensors, class groups) to send requests to them, without the files.
        stages, fragments = ([replace(p, artifacts=p.artifacts if part == HOST_PART else ()) for p in parts]
                             for parts in (split.stages, split.fragments))
        if not artifacts and not any(p.artifacts for p in (*stages, *fragments)):
            notes.append(f"split {split.id}: no {'/'.join(kept_formats)} {roles[0]}, left out")
            continue
        notes += [f"split {split.id}: no {precision} {what}, the float32 one is kept" for what in fell_back]
        splits.append(replace(split, artifacts=tuple(artifacts), stages=tuple(stages), fragments=tuple(fragments)))
    source = SliceSource(
        bundle_id=manifest.wire_id,
        manifest_sha256=origin.manifest_sha256 if origin is not None else manifest.manifest_sha256,
        part=part, formats=kept_formats, precision=precision,
    )
    return replace(manifest, full=tuple(full), splits=tuple(splits), source=source,
                   bundle_id="", manifest_sha256=""), notes


def _place(src: Path, dst: Path) -> bool:
    """Hard-link ``src`` at ``dst`` (True), or copy it where a link cannot be made (another file
    system, a file system without links)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
        return True
    except OSError:
        shutil.copyfile(src, dst)
        return False


def slice_bundle(
    source: str | Path, out: str | Path, part: str, formats: Sequence[str] | None = None,
    precision: str | None = None,
) -> SliceResult:
    """Write ``part`` (``board`` or ``host``) of the bundle at ``source`` to ``out``, a bundle of its own.

    Every artifact kept is verified against the source manifest before it is placed, and the
    slice is loaded and verified whole before it appears at ``out`` (built beside it and renamed
    into place: a slice interrupted half-way never looks like a bundle). ``out`` must not exist,
    or be an empty directory.
    """
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BundleError(f"{out}: already exists; choose another --out or remove it")
    bundle = Bundle.load(source, roles=())
    manifest, notes = slice_manifest(bundle, part, formats, precision)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)  # mkdtemp's 0700 would keep the service's user out of the release
    try:
        result = SliceResult(out=out, manifest=manifest, notes=notes)
        for artifact in [*manifest.full, *(a for s in manifest.splits for a in artifacts_of(s))]:
            src = bundle.verify(artifact)
            result.linked += _place(src, staging / artifact.path)
            result.files += 1
            result.bytes += artifact.bytes
        result.manifest = write_manifest(staging, manifest)
        Bundle.load(staging)  # every role present is verified: what is written is what was meant
        if out.exists():
            out.rmdir()  # empty, checked above
        staging.rename(out)
    except BaseException:
        with signals_held():  # a second Ctrl-C must not leave half of it
            shutil.rmtree(staging, ignore_errors=True)
        raise
    return result
