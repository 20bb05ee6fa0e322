"""What a package imports, read from its source: for the tests that keep a package's dependencies small."""

from __future__ import annotations

import ast
from pathlib import Path


def imported_modules(path: Path, package: str) -> set[str]:
    """Top-level names of every module ``path`` imports (relative imports count as ``package``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add(package if node.level else (node.module or "").split(".")[0])
    return names


def foreign_imports(package_dir: Path, package: str, allowed: set[str]) -> dict[str, list[str]]:
    """For each module of the package, what it imports outside ``allowed`` (empty lists dropped)."""
    offenders = {path.name: sorted(imported_modules(path, package) - allowed) for path in sorted(package_dir.rglob("*.py"))}
    return {name: bad for name, bad in offenders.items() if bad}
