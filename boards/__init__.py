"""Board profiles: what splitedge knows about each Raspberry-Pi-class board, as data.

Standard library only, and nothing of the project: the exporter on a workstation, the host
and the board itself all read the same profiles, so this package sits below every other
(DESIGN.md, "Parts and where they run"). Its errors derive from ``Exception``; callers in
the project convert them to ``SplitEdgeError`` where they enter.
"""

from boards._fit import LOAD_FACTOR, SESSION_MB, ArtifactEstimate, BoardFitError, FitReport, check_fits
from boards._identify import identify, model_family
from boards._profile import BACKENDS, RASPBERRY_PI_OS_PYTHONS, BoardProfile
from boards._registry import BOARDS

__all__ = [
    "BACKENDS",
    "BOARDS",
    "LOAD_FACTOR",
    "RASPBERRY_PI_OS_PYTHONS",
    "SESSION_MB",
    "ArtifactEstimate",
    "BoardFitError",
    "BoardProfile",
    "FitReport",
    "check_fits",
    "identify",
    "model_family",
]
