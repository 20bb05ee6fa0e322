"""k-bit cut codings at build (``split-export build --cut-bits``, issue 47): calibrated, measured, drawn.

For each split, whatever its kind (a layer or bottleneck split's cut, a chain's first cut, a
semantic split's cut: in every kind the board's head output is what crosses the link), one
:class:`~device_runtime.wire.CutCoding` per bit width is calibrated on the float32 head's cut over
the calibration images, the same images int8 calibrates on. Then its accuracy is **measured,
never assumed**: the exported float32 head (onnxruntime), the coding's encode and decode, and the
exported hosts' part, on labelled test images (top-1) or on images held out of the calibration
(agreement with the float32 model). Measured in the same pass, the cut as it crosses today
(float32, and affine uint8 with the float32 head) gives the curve its baselines. The manifest
keeps each coding with its bytes and its figure (:class:`~device_runtime.bundle.Coding`); the
curve, baselines included, goes to ``report/codings.json`` and ``report/codings.png`` in the
bundle, beside nothing a board loads (a slice or deploy carries only what the manifest lists).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

import jsonschema
import numpy as np

from device_runtime import Split
from device_runtime.bundle import CUT_BITS
from device_runtime.wire.coding import CutCoding
from exporter._datasets import ImageSet
from exporter._measure import RoundTrip, top1_each, uint8_round_trip
from exporter._quantize import head_outputs, uint8_link
from exporter._validate import Runner
from splitedge.errors import ExportError

__all__ = ["CURVE_JSON", "CURVE_PNG", "REPORT_DIR", "Curve", "Point", "SplitCurve", "calibrate", "check_bits",
           "coded", "read_curve", "write_curve"]

REPORT_DIR = "report"  # in the bundle: what the build measured, for people; no runtime reads it
CURVE_JSON, CURVE_PNG = "codings.json", "codings.png"
CURVE_SCHEMA_ID = "splitedge.codings/1"
FLOAT32_LINK, UINT8_LINK = "float32", "uint8"  # the baselines' names on the curve, beside k8 ... k2
#: The cut values a split's codings are calibrated on, at most: the calibration holds them in
#: float32, a few times over while it searches each channel's clip. 64 images of MobileNetV2's
#: earliest cut are 25 MB; the 10,000 --calib-samples allows would be 4 GB, so fewer are used.
MAX_CALIBRATION_BYTES = 256 << 20
#: Values encoded at once while measuring: packing holds eight bytes a value while it works.
MAX_ROUND_TRIP_VALUES = 1 << 22
#: A report's file is read whole: past this it is no report this module wrote (a split's curve is
#: a few hundred bytes).
MAX_CURVE_BYTES = 4 << 20

Metric = Literal["top1", "agreement"]


@dataclass(frozen=True)
class Point:
    """One point of a split's curve: how its cut crossed (``float32``, ``uint8``, ``k4``), in how
    many bits a value and bytes a sample, and the answers it kept."""

    coding: str
    bits: int
    bytes_per_sample: int
    accuracy: float


@dataclass(frozen=True)
class SplitCurve:
    split: str
    kind: str
    points: tuple[Point, ...]  # float32, uint8, then the codings, most bits first


@dataclass(frozen=True)
class Curve:
    """Bytes per sample against accuracy, per split, all measured on the same images."""

    model: str
    metric: Metric  # top1: against labels; agreement: with the float32 model's answers
    measured_on: str  # the images, in words (the manifest's accuracy_on)
    splits: tuple[SplitCurve, ...]


def check_bits(bits: Sequence[int]) -> tuple[int, ...]:
    """``bits`` as the manifest lists codings, most bits first and each once; :class:`ExportError`
    for a width the wire has no coding of."""
    unknown = sorted(set(bits) - set(CUT_BITS))
    if unknown:
        raise ExportError(f"cut bits {', '.join(map(str, unknown))}: a cut coding has "
                          f"{', '.join(map(str, CUT_BITS))} bits a value")
    return tuple(sorted(set(bits), reverse=True))


def calibrate(
    head: Path, samples: np.ndarray, bits: Sequence[int], cut_bytes: int,
) -> tuple[np.ndarray, list[CutCoding]]:
    """The float32 head's cut on (at most :data:`MAX_CALIBRATION_BYTES` of) ``samples``, the
    calibration images as the head takes them, and one coding per width of ``bits`` calibrated on it
    (``cut_bytes``: a sample's cut in float32)."""
    used = max(1, min(len(samples), MAX_CALIBRATION_BYTES // max(1, cut_bytes)))
    outputs = head_outputs(head, samples[:used])
    if outputs.ndim < 2:
        raise ExportError(f"head {head}: a cut coding scales each channel (axis 1); this cut's shape is "
                          f"{list(outputs.shape[1:])}, with none")
    return outputs, [CutCoding.calibrate(outputs, k) for k in check_bits(bits)]


def _coding_round_trip(coding: CutCoding) -> RoundTrip:
    """What the host tail takes from a cut the board encoded with ``coding``, a few samples at a time."""

    def round_trip(cut: np.ndarray) -> np.ndarray:
        rows = max(1, MAX_ROUND_TRIP_VALUES // max(1, math.prod(cut.shape[1:])))
        return np.concatenate([coding.decode(coding.encode(part), part.shape)
                               for part in (cut[i : i + rows] for i in range(0, len(cut), rows))])
    return round_trip


def coded(
    split: Split, head: Runner, host: Runner, outputs: np.ndarray, codings: Sequence[CutCoding], images: ImageSet,
    advance: Callable[[int], object] | None = None,
) -> tuple[Split, SplitCurve]:
    """``split`` with ``codings`` (calibrated on ``outputs``, the head's cut on the calibration
    images) recorded with their measured figure, and its curve: top-1 on ``images`` (their labels,
    or the float32 model's where they have none: agreement) of ``head`` (the float32 artifact),
    the link, then ``host`` (a tail, a chain's stages, a semantic split's merged fragments), for
    float32, uint8 (the split's own link, else one fitted on ``outputs``) and each coding."""
    links: dict[str, tuple[int, RoundTrip]] = {
        FLOAT32_LINK: (32, lambda cut: cut),
        UINT8_LINK: (8, uint8_round_trip(split.quantization or uint8_link(outputs))),
        **{c.name: (c.bits, _coding_round_trip(c)) for c in codings},
    }

    def then(round_trip: RoundTrip) -> Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]:
        return lambda cut: host(dict(zip(host.input_names, (round_trip(v) for v in cut.values()))))

    measured = top1_each(head, {name: then(f) for name, (_, f) in links.items()}, images, advance=advance)
    metric: Metric = "top1" if images.labelled else "agreement"
    values = math.prod(split.tensor.shape)
    specs = tuple(c.spec(values, **{metric: measured[c.name]}) for c in codings)
    sizes = {FLOAT32_LINK: split.tensor.bytes_per_sample, UINT8_LINK: values,
             **{s.name: s.bytes_per_sample for s in specs}}
    points = tuple(Point(name, bits, sizes[name], measured[name]) for name, (bits, _) in links.items())
    return replace(split, codings=specs), SplitCurve(split.id, split.kind, points)


_POINT = {
    "type": "object",
    "required": ["coding", "bits", "bytes_per_sample", "accuracy"],
    "properties": {"coding": {"type": "string"}, "bits": {"type": "integer", "minimum": 1, "maximum": 32},
                   "bytes_per_sample": {"type": "integer", "minimum": 0},
                   "accuracy": {"type": "number", "minimum": 0, "maximum": 1}},
    "additionalProperties": False,
}
SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": CURVE_SCHEMA_ID,
    "type": "object",
    "required": ["schema", "model", "metric", "measured_on", "splits"],
    "properties": {
        "schema": {"const": CURVE_SCHEMA_ID},
        "model": {"type": "string"},
        "metric": {"enum": ["top1", "agreement"]},
        "measured_on": {"type": "string"},
        "splits": {"type": "array", "items": {
            "type": "object",
            "required": ["split", "kind", "points"],
            "properties": {"split": {"type": "string"}, "kind": {"type": "string"},
                           "points": {"type": "array", "items": _POINT, "minItems": 1}},
            "additionalProperties": False,
        }},
    },
    "additionalProperties": False,
}


def curve_report(curve: Curve) -> dict[str, Any]:
    """``codings.json``'s dictionary (:data:`SCHEMA`), as JSON reads it back (tuples as lists)."""
    return json.loads(json.dumps({"schema": CURVE_SCHEMA_ID, **asdict(curve)}))


def write_curve(curve: Curve, root: Path) -> tuple[Path, Path]:
    """``report/codings.json`` and ``report/codings.png`` in the bundle at ``root``; the JSON is held
    to :data:`SCHEMA` before it is written, so no reader meets a report its writer would refuse."""
    from exporter._plots import plot_codings  # matplotlib: only where a curve is drawn

    return write_bundle_report(root, CURVE_JSON, CURVE_PNG, curve_report(curve), SCHEMA, plot_codings)


def write_bundle_report(root: Path, json_name: str, png_name: str, report: dict[str, Any], schema: dict[str, Any],
                        plot: Callable[[dict[str, Any], Path], object]) -> tuple[Path, Path]:
    """``report`` as JSON and its picture in the bundle's :data:`REPORT_DIR`, the JSON held to
    ``schema`` first (what :func:`read_bundle_report` will hold it to)."""
    jsonschema.validate(report, schema)
    folder = root / REPORT_DIR
    folder.mkdir(exist_ok=True)
    (folder / json_name).write_text(json.dumps(report, indent=2) + "\n")
    plot(report, folder / png_name)
    return folder / json_name, folder / png_name


def read_bundle_report(path: Path, schema: dict[str, Any], max_bytes: int, what: str) -> Any:
    """A JSON report a build wrote into a bundle's :data:`REPORT_DIR` (``what`` names it: "an
    exits report"), held to ``schema`` and ``max_bytes``: a bundle is copied between machines, and
    a report that is not what the build wrote is one line saying to rebuild, never a traceback."""
    if path.stat().st_size > max_bytes:
        raise ExportError(f"{path}: over {max_bytes:,} bytes, not {what} a build wrote; rebuild the bundle")
    try:
        report = json.loads(path.read_text())
        jsonschema.validate(report, schema)
    except (ValueError, jsonschema.ValidationError) as exc:
        reason = exc.message if isinstance(exc, jsonschema.ValidationError) else str(exc)
        raise ExportError(f"{path}: not {what} ({reason}); rebuild the bundle") from exc
    return report


def read_curve(bundle: str | Path) -> Curve | None:
    """The curve a build wrote into ``bundle``, or None where it measured no codings;
    :class:`ExportError` naming the file for one that is not a curve this module wrote."""
    path = Path(bundle) / REPORT_DIR / CURVE_JSON
    if not path.is_file():
        return None
    report = read_bundle_report(path, SCHEMA, MAX_CURVE_BYTES, "a curve of cut codings")
    splits = tuple(SplitCurve(s["split"], s["kind"], tuple(Point(**p) for p in s["points"])) for s in report["splits"])
    return Curve(report["model"], report["metric"], report["measured_on"], splits)
