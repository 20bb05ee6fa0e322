"""The board runtime (no torch, no matplotlib): contract 1 at the top, subpackages below.

``bundle`` (contract 1: manifest, artifacts, verification, the shared words) and ``wire``
(contract 2: the protocol) are what the host and the exporter import; ``engine`` runs
networks, ``hosts`` talks to hosts, ``stream`` is the camera-to-answer pipeline, ``board``
knows this board; ``cli`` is ``split-device``. Importing this package loads only the bundle
contract.
"""

from device_runtime.bundle import LOCAL, OFFLOAD, Bundle, Manifest

from device_runtime.bundle import (
    Artifact, BOARD_PART, BOTTLENECK, CHAIN, CHAIN_JOIN, CUT, FLOAT32, FORMATS, FULL, Fragment, HEAD, INT8,
    IO_NAMES, LAYER, LOGITS, MIDDLE_STAGE_IO, ModelInfo, ONNX, PARTS, PRECISIONS, Preprocess, Quantization,
    SEMANTIC, Split, Stage, TAIL, TFLITE, TensorSpec, artifacts_of, check_name, make_artifact, semantic_id,
    stage_id, write_manifest,
)
from device_runtime.bundle_slice import slice_bundle

__all__ = [
    "Artifact",
    "BOARD_PART",
    "BOTTLENECK",
    "Bundle",
    "CHAIN",
    "CHAIN_JOIN",
    "CUT",
    "FLOAT32",
    "FORMATS",
    "FULL",
    "Fragment",
    "HEAD",
    "INT8",
    "IO_NAMES",
    "LAYER",
    "LOCAL",
    "LOGITS",
    "MIDDLE_STAGE_IO",
    "Manifest",
    "ModelInfo",
    "OFFLOAD",
    "ONNX",
    "PARTS",
    "PRECISIONS",
    "Preprocess",
    "Quantization",
    "SEMANTIC",
    "Split",
    "Stage",
    "TAIL",
    "TFLITE",
    "TensorSpec",
    "artifacts_of",
    "check_name",
    "make_artifact",
    "semantic_id",
    "slice_bundle",
    "stage_id",
    "write_manifest",
]
