"""boards/ sits below every other part (DESIGN.md): it imports the standard library and itself only."""

from __future__ import annotations

import sys
from pathlib import Path

import boards
from tests.imports import foreign_imports

PACKAGE = Path(boards.__file__).parent


def test_boards_imports_only_the_stdlib_and_itself() -> None:
    allowed = set(sys.stdlib_module_names) | {"__future__", "boards"}
    assert foreign_imports(PACKAGE, "boards", allowed) == {}
    assert len(list(PACKAGE.rglob("*.py"))) >= 4  # the walk did find the package's modules
