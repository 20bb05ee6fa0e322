"""boards/ sits below every other part (DESIGN.md): it imports the standard library and itself only."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import boards

PACKAGE = Path(boards.__file__).parent


def imported_modules(path: Path) -> set[str]:
    """Top-level names of every module ``path`` imports (relative imports count as boards)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add("boards" if node.level else (node.module or "").split(".")[0])
    return names


def test_boards_imports_only_the_stdlib_and_itself() -> None:
    allowed = set(sys.stdlib_module_names) | {"__future__", "boards"}
    offenders = {
        path.name: sorted(imported_modules(path) - allowed) for path in sorted(PACKAGE.rglob("*.py"))
    }
    assert {name: bad for name, bad in offenders.items() if bad} == {}
    assert len(offenders) >= 4  # the walk did find the package's modules
