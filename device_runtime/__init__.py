"""The board runtime (no torch, no matplotlib): contract 1 at the top, subpackages below.

``bundle`` (contract 1: manifest, artifacts, verification, the shared words) and ``wire``
(contract 2: the protocol) are what the host and the exporter import; ``engine`` runs
networks, ``hosts`` talks to hosts, ``stream`` is the camera-to-answer pipeline, ``board``
knows this board; ``cli`` is ``split-device``. Importing this package loads only the bundle
contract.
"""

from device_runtime.bundle import LOCAL, OFFLOAD, Bundle, Manifest

__all__ = ["LOCAL", "OFFLOAD", "Bundle", "Manifest"]
