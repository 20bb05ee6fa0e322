"""Imports only go down (DESIGN.md, "Parts and where they run"), read from every package's source.

A module counts as importing what it imports at any level, and what it starts as a process
(``[sys.executable, "-m", "host_runtime.cli", ...]``): a board module that launches the host
reaches the host as surely as one that imports it. Imports inside a function body are lazy:
they are allowed only where listed in :data:`LAZY` (nowhere now: ``split-device report`` finds
``fieldtrial`` by its entry point).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STDLIB = set(sys.stdlib_module_names) | {"__future__"}
PROJECT = {"splitedge", "boards", "calibration", "device_runtime", "host_runtime", "exporter", "fieldtrial", "testbed"}
HEAVY = {"torch", "torchvision", "onnx", "onnxscript", "litert_torch", "matplotlib"}

#: What each package may import besides the standard library and itself.
ALLOWED: dict[str, set[str]] = {
    "splitedge": set(),
    "boards": {"splitedge"},
    "calibration": {"splitedge", "numpy"},
    "device_runtime": {
        "splitedge", "boards", "calibration",
        "numpy", "msgpack", "zeroconf", "onnxruntime", "ai_edge_litert", "tflite_runtime", "cv2", "picamera2", "tqdm",
        "tomli",  # device.toml on Python 3.10 (3.11 has tomllib)
        "tomli_w",  # device.toml written by a TOML writer
    },
    "host_runtime": {
        "splitedge", "boards", "calibration", "device_runtime",
        "numpy", "msgpack", "zeroconf", "onnxruntime", "prometheus_client", "uvloop",
    },
    "exporter": {
        "splitedge", "boards", "calibration", "device_runtime",
        "numpy", "onnxruntime", "onnx", "onnxscript", "torch", "torchvision", "litert_torch", "ai_edge_litert",
        "torchao", "tqdm", "jsonschema", "matplotlib",
        "skimage",  # the built-in photos the fast preprocessing's agreement is measured on without data
    },
    "fieldtrial": {"splitedge", "boards", "calibration", "device_runtime", "host_runtime", "numpy", "matplotlib"},
    "testbed": {"splitedge", "boards", "calibration", "device_runtime", "host_runtime", "numpy"},
}

#: Inside the board runtime, each room sees only the rooms below it (the top: run, then cli).
BOARD_ROOMS: dict[str, set[str]] = {
    "bundle": set(),
    "bundle_slice": {"bundle"},
    "wire": {"bundle"},
    "link": {"bundle", "wire"},  # the board's client, its pool and the kernel's timing, on the contract
    "engine": {"bundle", "wire"},
    "hosts": {"bundle", "wire", "link"},
    "stream": {"bundle", "wire", "link", "engine", "hosts"},
    "board": {"bundle", "wire", "link", "engine", "hosts"},
    "live": {"bundle", "wire", "link", "engine", "hosts", "stream"},  # the live pages: what the stream publishes
    "run": {"bundle", "wire", "link", "engine", "hosts", "stream", "board", "live"},
    "cli": {"bundle", "bundle_slice", "wire", "link", "engine", "hosts", "stream", "board", "live", "run"},
}
#: Launched, not imported: the board's systemd unit runs ``python -m device_runtime.cli run``.
LAUNCHED = {("device_runtime.board._service", "device_runtime.cli")}
#: The host imports the two contracts, the engine for its sessions, and the live pages' server
#: (``split-host serve --live``: one page server for the board and the host).
HOST_SEES = {"bundle", "wire", "engine", "live"}
#: ... and the board's link (the protocol's client and its pool) only where it dials peers: a
#: chain's next hops and the links measured to them.
HOST_DIALS = {"host_runtime._peers"}

#: (module, what it may import inside a function): the only lazy imports that go up or sideways.
#: None: ``split-device report`` reaches ``fieldtrial`` through an entry point.
LAZY: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Import:
    module: str  # dotted name of what is imported or started
    lazy: bool  # inside a function body


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, package: str | None = None) -> list[Import]:
    """``package``: the package relative imports start from (by default, where ``path`` sits)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    if package is None:
        package = module_name(path).rpartition(".")[0] if path.name != "__init__.py" else module_name(path)
    found: list[Import] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend(Import(alias.name, lazy) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - child.level + 1] + ([base] if base else []))
                # ``from device_runtime import cli`` imports device_runtime.cli
                found.extend(Import(f"{base}.{alias.name}" if base in PROJECT or "." in base else base, lazy)
                             for alias in child.names)
            elif isinstance(child, (ast.List, ast.Tuple)):
                items = child.elts
                for first, second in zip(items, items[1:]):
                    if isinstance(first, ast.Constant) and first.value == "-m" and isinstance(second, ast.Constant):
                        found.append(Import(str(second.value), lazy))
            visit(child, inner)

    visit(tree, False)
    return found


def modules_of(package: str) -> list[Path]:
    paths = sorted((ROOT / package).rglob("*.py"))
    assert paths, f"no modules found for {package}"
    return paths


def top(name: str) -> str:
    return name.split(".")[0]


def board_room(dotted: str) -> str | None:
    """``device_runtime.wire._auth`` -> ``wire``; a name from the face (``device_runtime.Bundle``) ->
    ``bundle``, the contract the face exports; ``device_runtime`` itself -> None."""
    parts = dotted.split(".")
    if len(parts) < 2 or parts[0] != "device_runtime":
        return None
    room = ROOT / "device_runtime" / parts[1]
    # a private module is the room of its name (``device_runtime._run``: ``run``)
    return parts[1].lstrip("_") if room.is_dir() or room.with_suffix(".py").is_file() else "bundle"


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_each_package_imports_only_what_is_below_it(package: str) -> None:
    allowed = STDLIB | ALLOWED[package] | {package}
    offences = []
    for path in modules_of(package):
        name = module_name(path)
        for imp in imports_of(path):
            if top(imp.module) in allowed:
                continue
            if imp.lazy and (name, top(imp.module)) in LAZY:
                continue
            offences.append(f"{name} imports {imp.module}" + (" (lazily)" if imp.lazy else ""))
    assert offences == []


def test_the_board_side_never_reaches_heavy_packages_or_the_host() -> None:
    """The rule that matters on a board, stated once more on its own: no torch, onnx, matplotlib,
    host or exporter, whatever the allow-lists above say."""
    forbidden = HEAVY | {"host_runtime", "exporter", "testbed"}
    for package in ("splitedge", "boards", "calibration", "device_runtime"):
        for path in modules_of(package):
            bad = [i.module for i in imports_of(path) if top(i.module) in forbidden and (module_name(path), top(i.module)) not in LAZY]
            assert bad == [], f"{module_name(path)} imports {bad}"


def test_the_board_runtimes_rooms_only_look_down() -> None:
    offences = []
    for path in modules_of("device_runtime"):
        own = board_room(module_name(path))
        if own is None:  # device_runtime/__init__.py: the public face, the bundle contract and its slicing only
            own = "bundle_slice"
        for imp in imports_of(path):
            room = board_room(imp.module)
            if room is None or room == own or room in BOARD_ROOMS[own] or (module_name(path), imp.module) in LAUNCHED:
                continue
            offences.append(f"{module_name(path)} ({own}) imports {imp.module} ({room})")
    assert offences == []


def test_the_host_uses_only_the_contracts_and_the_engine_of_the_board_runtime() -> None:
    offences = [
        f"{module_name(path)} imports {imp.module}"
        for path in modules_of("host_runtime")
        for imp in imports_of(path)
        if (room := board_room(imp.module)) is not None and room not in HOST_SEES
        and not (room == "link" and module_name(path) in HOST_DIALS)
    ]
    assert offences == []


def test_the_host_dials_peers_in_one_module_only(tmp_path: Path) -> None:
    """The board's link is the host's only in ``HOST_DIALS``: a host module elsewhere that imports
    it is refused by the rule above (checked here on a probe, so the rule cannot go blind)."""
    probe = tmp_path / "probe.py"
    probe.write_text("from device_runtime.link import ClientPool\n")
    assert board_room(imports_of(probe, package="host_runtime")[0].module) == "link"
    assert "link" not in HOST_SEES and HOST_DIALS == {"host_runtime._peers"}
    assert any(board_room(i.module) == "link" for i in imports_of(ROOT / "host_runtime" / "_peers.py"))


def test_a_process_started_with_python_m_counts_as_an_import(tmp_path: Path) -> None:
    """The walker itself: it must see a ``-m`` launch and a lazy import, or the rules above check nothing."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import subprocess, sys\n"
        "from . import wire\n"
        "from device_runtime import cli\n"
        "def go():\n"
        "    import fieldtrial\n"
        "    subprocess.run([sys.executable, '-m', 'host_runtime.cli', 'serve'])\n"
    )
    found = imports_of(probe, package="device_runtime")
    assert Import("host_runtime.cli", True) in found
    assert Import("fieldtrial", True) in found
    assert Import("device_runtime.wire", False) in found
    assert Import("device_runtime.cli", False) in found
    assert module_name(ROOT / "device_runtime" / "wire" / "_auth.py") == "device_runtime.wire._auth"


def test_the_board_box_builder_needs_only_the_standard_library() -> None:
    """``make`` runs ``python3 -m testbed.board_box build`` with the machine's own Python, before
    any venv exists: importing it must not reach numpy, msgpack or anything else installed."""
    blocked = ["numpy", "msgpack", "zeroconf", "onnxruntime", "cv2", "torch", "matplotlib", "tomli_w"]
    code = f"import sys; sys.modules.update(dict.fromkeys({blocked!r})); import testbed.board_box"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
