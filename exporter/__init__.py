"""The workstation side of splitedge: find cut points, export and validate split bundles.

Only this package imports torch; the board and the host read what it writes.
"""

from exporter.build import build_bundle, select_splits
from exporter.graph import CutPoint, TracedModel, find_cut_points, get_cut_point, split_at, trace
from exporter.models import LoadedModel, load_model
from exporter.onnx_export import export_onnx
from exporter.validate import Case, Chain, OnnxRunner, Runner, compare, validate

__all__ = [
    "Case",
    "Chain",
    "CutPoint",
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
