"""The workstation side of splitedge: find cut points, export and validate split bundles.

Only this package imports torch; the board and the host read what it writes. Its names are
imported when first used (PEP 562), so ``split-export slice``, which needs no torch, runs where
torch is not installed (a deploy from a machine with the runtimes only).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from exporter._build import BuildSpec, build_bundle, select_splits
    from exporter._graph import CutPoint, TracedModel, find_cut_points, get_cut_point, split_at, trace
    from exporter._models import LoadedModel, load_model
    from exporter._onnx_export import export_onnx
    from exporter._validate import Case, Chain, OnnxRunner, Runner, compare, validate

_HOMES = {
    "exporter._build": ("BuildSpec", "build_bundle", "select_splits"),
    "exporter._exits": ("ExitOptions",),
    "exporter._graph": ("CutPoint", "TracedModel", "find_cut_points", "get_cut_point", "split_at", "trace"),
    "exporter._models": ("LoadedModel", "load_model"),
    "exporter._onnx_export": ("export_onnx",),
    "exporter._validate": ("Case", "Chain", "OnnxRunner", "Runner", "compare", "validate"),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = [
    "BuildSpec",
    "Case",
    "Chain",
    "CutPoint",
    "ExitOptions",
    "LoadedModel",
    "OnnxRunner",
    "Runner",
    "TracedModel",
    "build_bundle",
    "compare",
    "export_onnx",
    "find_cut_points",
    "get_cut_point",
    "load_model",
    "select_splits",
    "split_at",
    "trace",
    "validate",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME_OF:
        raise AttributeError(f"module 'exporter' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME_OF[name]), name)
    globals()[name] = value  # once imported, an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
