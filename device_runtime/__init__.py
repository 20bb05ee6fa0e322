"""The board runtime (no torch, no matplotlib): contract 1 at the top, subpackages below.

``bundle`` (contract 1: manifest, artifacts, verification, the shared words) and ``wire``
(contract 2: the protocol) are what the host and the exporter import; ``engine`` runs
networks, ``link`` and ``hosts`` talk to hosts, ``stream`` is the camera-to-answer pipeline,
``board`` knows this board; ``cli`` is ``split-device``. Importing this package loads only the
bundle contract. The face holds the contract's types and the words every part uses; the rest of
its words (roles, formats, precisions, tensor names) are the public sub-face
:mod:`device_runtime.bundle`.
"""

from device_runtime._bundle_slice import slice_bundle
from device_runtime.bundle import (
    FULL, HEAD, LOCAL, OFFLOAD, TAIL, Artifact, Bundle, Exit, Fragment, Manifest, ModelInfo, Preprocess, Quantization, Split,
    Stage, TensorSpec, artifacts_of, check_name, make_artifact, semantic_id, stage_id, write_manifest,
)

__all__ = [
    "Artifact", "Bundle", "Exit", "FULL", "Fragment", "HEAD", "LOCAL", "Manifest", "ModelInfo", "OFFLOAD", "Preprocess",
    "Quantization", "Split", "Stage", "TAIL", "TensorSpec", "artifacts_of", "check_name", "make_artifact",
    "semantic_id", "slice_bundle", "stage_id", "write_manifest",
]
