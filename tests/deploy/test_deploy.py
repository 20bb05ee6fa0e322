"""split-export deploy against real OpenSSH servers: every board's current is whole or untouched."""

from __future__ import annotations

from pathlib import Path

from tests.deploy.conftest import needs_boards, split_export

pytestmark = needs_boards


def test_smoke(make_boards, mobilenet_bundle: Path) -> None:
    fleet = make_boards(board1={})
    out = split_export("deploy", str(mobilenet_bundle), "--to", "board1", "--ssh-config", str(fleet.ssh_config))
    print(out.stdout, out.stderr)
    assert out.returncode == 0
    assert fleet["board1"].current() is not None
