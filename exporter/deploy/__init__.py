"""Deploys to boards over the user's own OpenSSH: board slices, verified on the board, switched atomically.

No torch: ``split-export deploy`` runs wherever splitedge's runtimes are installed. A
:class:`Fleet` slices a bundle for a board once and deploys it in rolling batches; each board's
steps (:mod:`exporter.deploy._remote_board`) leave it on a working release whatever fails.
"""

from exporter.deploy._remote_board import BoardFacts, BoardResult, Release, board_steps, deploy_board, probe, rollback_board
from exporter.deploy._fleet import Fleet, FleetResult, parse_max_fail
from exporter.deploy._remote import Remote, UploadStats

from exporter.deploy._command import add_deploy_command

__all__ = [
    "BoardFacts",
    "BoardResult",
    "Fleet",
    "FleetResult",
    "Release",
    "Remote",
    "UploadStats",
    "add_deploy_command",
    "board_steps",
    "deploy_board",
    "parse_max_fail",
    "probe",
    "rollback_board",
]
