"""Slices of a bundle: the board's and the host's parts, bundles of their own that still find each other."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from device_runtime.bundle import (
    BOARD_PART,
    FLOAT32,
    FULL,
    HEAD,
    HOST_PART,
    INT8,
    LOCAL,
    MANIFEST_NAME,
    ONNX,
    TAIL,
    TFLITE,
    Bundle,
    Manifest,
    ModelInfo,
    Preprocess,
    Split,
    TensorSpec,
    make_artifact,
    write_manifest,
)
from device_runtime._bundle_slice import slice_bundle
from splitedge.errors import BundleError
from tests.conftest import TEST_SPLITS, run_stream, start_host

ROOT = Path(__file__).resolve().parents[2]


def fake_bundle(root: Path, int8_tflite_heads: tuple[str, ...] = ("a", "b")) -> Manifest:
    """A bundle of made-up files in every role, format and precision the contract has: slicing
    only moves files and manifests, so their bytes need not be networks."""
    rng = np.random.default_rng(0)

    def artifact(relpath: str, role: str, fmt: str, precision: str):
        path = root / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.bytes(64))
        return make_artifact(root, relpath, role, fmt, precision)

    def variants(name: str, role: str, int8_tflite: bool) -> tuple:
        found = [artifact(f"{role}/{name}.onnx", role, ONNX, FLOAT32)]
        if role != TAIL:
            found += [artifact(f"{role}/{name}.int8.onnx", role, ONNX, INT8),
                      artifact(f"{role}/{name}.tflite", role, TFLITE, FLOAT32)]
            if int8_tflite:
                found.append(artifact(f"{role}/{name}.int8.tflite", role, TFLITE, INT8))
        return tuple(found)

    splits = tuple(
        Split(id=name, position=i + 1, kind="layer", tensor=TensorSpec((4,), "float32", 16), compression_ratio=0.5,
              natural=True, compressive=True,
              artifacts=variants(name, HEAD, name in int8_tflite_heads) + variants(name, TAIL, False))
        for i, name in enumerate(("a", "b"))
    )
    model = ModelInfo(name="fake", input_shape=(3, 8, 8), input_dtype="float32", layout="NCHW", output_shape=(10,),
                      preprocess=Preprocess(8, 8, (0.5,) * 3, (0.5,) * 3), labels=tuple("0123456789"))
    return write_manifest(root, Manifest(model=model, full=variants("model", FULL, True), splits=splits))


def kinds(manifest: Manifest) -> set[tuple[str, str, str, str]]:
    """(split, role, format, precision) of every artifact listed."""
    found = {(LOCAL, a.role, a.format, a.precision) for a in manifest.full}
    return found | {(s.id, a.role, a.format, a.precision) for s in manifest.splits for a in s.artifacts}


@pytest.fixture
def full(tmp_path: Path) -> Path:
    fake_bundle(tmp_path / "full")
    return tmp_path / "full"


def test_board_slice_keeps_heads_and_full_model_of_one_format_and_precision(full: Path, tmp_path: Path) -> None:
    result = slice_bundle(full, tmp_path / "board", BOARD_PART, formats=[TFLITE], precision=INT8)
    expected = {(s, role, TFLITE, INT8) for s, role in (("a", HEAD), ("b", HEAD), (LOCAL, FULL))}
    assert kinds(result.manifest) == expected
    board = Bundle.load(tmp_path / "board")  # a bundle of its own, every file verified
    assert board.manifest == result.manifest
    assert sorted(p.name for p in (tmp_path / "board").rglob("*") if p.is_file()) == sorted(
        [MANIFEST_NAME, "a.int8.tflite", "b.int8.tflite", "model.int8.tflite"])
    # Hard links, not symlinks: the slice stands alone yet copies nothing on one file system.
    head = tmp_path / "board" / "head" / "a.int8.tflite"
    assert not head.is_symlink() and head.stat().st_ino == (full / "head" / "a.int8.tflite").stat().st_ino
    assert result.linked == result.files == 3


def test_a_slice_has_its_own_identity_and_answers_to_its_sources(full: Path, tmp_path: Path) -> None:
    source = Bundle.load(full).manifest
    board = slice_bundle(full, tmp_path / "board", BOARD_PART).manifest
    host = slice_bundle(full, tmp_path / "host", HOST_PART).manifest
    assert len({source.bundle_id, board.bundle_id, host.bundle_id}) == 3
    assert board.wire_id == host.wire_id == source.bundle_id == source.wire_id
    assert board.source.manifest_sha256 == host.source.manifest_sha256 == source.manifest_sha256
    assert Bundle.load(tmp_path / "board").id == Bundle.load(tmp_path / "host").id == source.bundle_id
    # A slice of a slice still answers to the bundle as exported.
    onnx_only = slice_bundle(tmp_path / "board", tmp_path / "onnx", BOARD_PART, formats=[ONNX]).manifest
    assert onnx_only.wire_id == source.bundle_id and onnx_only.bundle_id != board.bundle_id


def test_host_slice_keeps_tails_and_the_onnx_full_model(full: Path, tmp_path: Path) -> None:
    host = slice_bundle(full, tmp_path / "host", HOST_PART).manifest
    assert kinds(host) == {("a", TAIL, ONNX, FLOAT32), ("b", TAIL, ONNX, FLOAT32), (LOCAL, FULL, ONNX, FLOAT32)}


def test_a_precision_an_artifact_lacks_falls_back_to_float32_and_says_so(tmp_path: Path) -> None:
    fake_bundle(tmp_path / "full", int8_tflite_heads=("a",))
    result = slice_bundle(tmp_path / "full", tmp_path / "board", BOARD_PART, formats=[TFLITE], precision=INT8)
    assert ("b", HEAD, TFLITE, FLOAT32) in kinds(result.manifest)
    assert ("a", HEAD, TFLITE, FLOAT32) not in kinds(result.manifest)
    assert result.notes == ["split b: no int8 tflite head, the float32 one is kept"]


@pytest.mark.parametrize("part, options, message", [
    (HOST_PART, {"formats": [TFLITE]}, "a host runs ONNX tails only"),
    (HOST_PART, {"precision": INT8}, "a host runs float32 tails"),
    (BOARD_PART, {"formats": ["coreml"]}, "unknown format(s) coreml"),
])
def test_options_a_part_cannot_use_are_refused(full: Path, tmp_path: Path, part, options, message) -> None:
    with pytest.raises(BundleError, match=message.replace("(", r"\(").replace(")", r"\)")):
        slice_bundle(full, tmp_path / "out", part, **options)
    assert not (tmp_path / "out").exists()


def test_a_board_slice_cannot_become_a_host_slice(full: Path, tmp_path: Path) -> None:
    slice_bundle(full, tmp_path / "board", BOARD_PART)
    with pytest.raises(BundleError, match="already a board slice of fake-.*slice the full bundle"):
        slice_bundle(tmp_path / "board", tmp_path / "host", HOST_PART)


def test_a_corrupt_source_file_is_refused_and_leaves_nothing(full: Path, tmp_path: Path) -> None:
    (full / "head" / "b.tflite").write_bytes(b"not what was exported".ljust(64, b"!"))  # same size, other bytes
    with pytest.raises(BundleError, match=r"b\.tflite: sha256 .* does not match"):
        slice_bundle(full, tmp_path / "board", BOARD_PART)
    assert list(tmp_path.iterdir()) == [full]  # no slice, no staging directory left behind


def test_an_existing_output_is_not_overwritten(full: Path, tmp_path: Path) -> None:
    (tmp_path / "board").mkdir()
    (tmp_path / "board" / "keep.txt").write_text("mine")
    with pytest.raises(BundleError, match="already exists"):
        slice_bundle(full, tmp_path / "board", BOARD_PART)
    assert (tmp_path / "board" / "keep.txt").read_text() == "mine"


def test_a_bundle_as_exported_has_no_source_field(full: Path) -> None:
    """Bundles exported before slices existed keep their bytes and their identity."""
    data = json.loads((full / MANIFEST_NAME).read_text())
    assert "source" not in data
    assert Bundle.load(full).manifest.source is None


def test_split_export_slice_runs_without_torch(mobilenet_bundle: Path, tmp_path: Path) -> None:
    """The command a deploy runs: torch is never imported, wherever it is installed."""
    code = (
        "import sys; from exporter.cli import main; "
        f"rc = main(['slice', {str(mobilenet_bundle)!r}, '--for', 'board', '--out', {str(tmp_path / 'b')!r}]); "
        "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "wrote board slice" in out.stdout
    assert {a.role for a in Bundle.load(tmp_path / "b").all_artifacts()} == {HEAD, FULL}


def test_host_slice_serves_board_slice_with_the_full_bundles_answers(
    mobilenet_bundle: Path, photos_dir: Path, tmp_path: Path,
) -> None:
    from device_runtime.engine._runner import DeviceRunner

    board = Bundle.load(slice_bundle(mobilenet_bundle, tmp_path / "board", BOARD_PART).out, roles=(HEAD, FULL))
    host_dir = slice_bundle(mobilenet_bundle, tmp_path / "host", HOST_PART).out
    full = Bundle.load(mobilenet_bundle, roles=(HEAD, FULL))
    split = TEST_SPLITS[1]
    for host in start_host([host_dir]):
        sliced = run_stream(DeviceRunner(board, threads=1), str(photos_dir), split, host)
        whole = run_stream(DeviceRunner(full, threads=1), str(photos_dir), split, host)
    assert [(r.error, r.where, r.split) for r in sliced] == [(None, "remote", split)] * 4
    assert [(r.name, r.label) for r in sliced] == [(r.name, r.label) for r in whole]
    assert dict((r.name, r.label) for r in sliced)["coffee.png"] == "espresso"
    for a, b in zip(sliced, whole):
        assert a.probability == pytest.approx(b.probability, abs=1e-5)


ROW = re.compile(r"^#\d+\s+(?P<name>\S+)\s+(?P<label>.+?)\s+(?P<prob>[01]\.\d{3})\s+split=(?P<split>\S+)")


def answers(stdout: str) -> dict[str, tuple[str, str, str]]:
    return {m["name"]: (m["label"], m["prob"], m["split"]) for m in map(ROW.match, stdout.splitlines()) if m}


def test_split_host_serves_the_host_slice_found_by_zeroconf_for_the_board_slice(
    mobilenet_bundle: Path, photos_dir: Path, tmp_path: Path,
) -> None:
    """As deployed: `split-host serve host-slice/`, advertised on 127.0.0.1; `split-device run board-slice/`
    finds it by zeroconf under the id both slices share, and answers as the full bundle does on the board."""
    for part in (BOARD_PART, HOST_PART):
        slice_bundle(mobilenet_bundle, tmp_path / part, part)
    host = subprocess.Popen(
        [sys.executable, "-m", "host_runtime.cli", "serve", str(tmp_path / HOST_PART), "--interface", "127.0.0.1",
         "--port", "0"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        seen = []
        for line in host.stdout:
            seen.append(line)
            if "advertised as" in line:
                break
        assert any(f"bundle {Bundle.load(mobilenet_bundle).id}:" in line for line in seen), seen
        split = TEST_SPLITS[1]
        remote = subprocess.run(
            [sys.executable, "-m", "device_runtime.cli", "run", str(tmp_path / BOARD_PART), "--camera", str(photos_dir),
             "--interface", "127.0.0.1", "--split", split, "--threads", "1", "--verbose"],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )
    finally:
        host.kill()
        host.wait(10)
    assert remote.returncode == 0, remote.stderr
    local = subprocess.run(
        [sys.executable, "-m", "device_runtime.cli", "run", str(mobilenet_bundle), "--camera", str(photos_dir),
         "--split", "local", "--threads", "1", "--verbose"], cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert local.returncode == 0, local.stderr
    sliced, whole = answers(remote.stdout), answers(local.stdout)
    assert len(sliced) == 4 and {s for _, _, s in sliced.values()} == {split}
    assert {name: label for name, (label, _, _) in sliced.items()} == {n: l for n, (l, _, _) in whole.items()}
    assert sliced["coffee.png"][0] == "espresso"
