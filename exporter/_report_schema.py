"""The schema of ``points.json``, checked when a report is written and when it is read back.

Other tools (notebooks, the board's planner, CI dashboards) read these reports; a schema
that the writer itself must pass keeps them from drifting apart silently.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema

from splitedge import SplitEdgeError

SCHEMA_ID = "splitedge.points/1"

_NUMBER = {"type": "number"}
_COUNT = {"type": "integer", "minimum": 0}
_NONNEG = {"type": "number", "minimum": 0}
_SIDE = {
    "type": "object",
    "required": ["parameters", "macs"],
    "properties": {"parameters": _COUNT, "macs": _COUNT},
    "additionalProperties": False,
}
_CUI = {
    "type": "object",
    "required": ["global", "per_class"],
    "properties": {
        "global": _NONNEG,
        "per_class": {"type": "object", "additionalProperties": _NONNEG},
        "subset": {"oneOf": [_NONNEG, {"type": "null"}]},
    },
    "additionalProperties": False,
}
_POINT = {
    "type": "object",
    "required": [
        "id", "position", "op", "shape", "bytes_per_sample", "compression_ratio", "natural", "compressive",
        "head", "tail", "cui",
    ],
    "properties": {
        "id": {"type": "string"},
        "position": _COUNT,
        "op": {"type": "string"},
        "shape": {"type": "array", "items": _COUNT},
        "bytes_per_sample": {
            "type": "object",
            "required": ["float32", "uint8"],
            "properties": {"float32": _COUNT, "uint8": _COUNT},
            "additionalProperties": False,
        },
        "compression_ratio": _NONNEG,
        "natural": {"type": "boolean"},
        "compressive": {"type": "boolean"},
        "head": _SIDE,
        "tail": _SIDE,
        "cui": _CUI,
    },
    "additionalProperties": False,
}
SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": SCHEMA_ID,
    "type": "object",
    "required": ["schema", "model", "data", "choices", "points", "summary"],
    "properties": {
        "schema": {"const": SCHEMA_ID},
        "model": {
            "type": "object",
            "required": ["name", "input_shape", "parameters", "macs"],
            "properties": {
                "name": {"type": "string"},
                "input_shape": {"type": "array", "items": _COUNT},
                "parameters": _COUNT,
                "macs": _COUNT,
            },
        },
        "data": {
            "type": "object",
            "required": ["source", "images", "classes", "images_per_class", "class_subset", "seed"],
            "properties": {
                "source": {"type": "string"},
                "images": _COUNT,
                "classes": {"type": "array", "items": {"type": "string"}},
                "images_per_class": {"type": "object", "additionalProperties": _COUNT},
                "class_subset": {"oneOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]},
                "seed": {"type": "integer"},
                "accuracy": {"oneOf": [_NUMBER, {"type": "null"}]},
            },
        },
        "choices": {"type": "object", "additionalProperties": {"type": "string"}},
        "points": {"type": "array", "items": _POINT, "minItems": 1},
        "summary": {
            "type": "object",
            "required": ["compressive", "cui_maxima", "recommended", "recommended_subset"],
            "properties": {
                "compressive": {"type": "array", "items": {"type": "string"}},
                "cui_maxima": {"type": "array", "items": {"type": "string"}},
                "recommended": {"type": "string"},
                "recommended_subset": {"oneOf": [{"type": "string"}, {"type": "null"}]},
                "blocks": {  # DSC's counts at block level (exporter._blocks), beside the operator-level ones
                    "type": "object",
                    "required": ["blocks", "cut_points", "natural", "compressive", "block_cut_points",
                                 "block_natural", "block_compressive"],
                    "additionalProperties": _COUNT,
                },
            },
        },
    },
}


class ReportError(SplitEdgeError):
    """A ``points.json`` does not follow :data:`SCHEMA`; the message names the offending path."""


def check(report: Any, source: str = "points.json") -> None:
    errors = sorted(jsonschema.Draft202012Validator(SCHEMA).iter_errors(report), key=lambda e: list(e.path))
    if errors:
        details = "; ".join(f"{'/'.join(map(str, e.path)) or 'root'}: {e.message}" for e in errors[:5])
        raise ReportError(f"{source} does not follow {SCHEMA_ID}: {details}")


def write_report(path: Path, report: dict[str, Any]) -> None:
    check(report, str(path))
    path.write_text(json.dumps(report, indent=2) + "\n")


def read_report(path: Path) -> dict[str, Any]:
    try:
        report = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ReportError(f"cannot read {path}: {exc}") from exc
    check(report, str(path))
    return report
