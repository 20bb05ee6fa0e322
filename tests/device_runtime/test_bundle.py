"""Bundles are refused, by name of file or field, when they are corrupt, incomplete or too new."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from device_runtime.bundle import LOCAL, MANIFEST_NAME, SCHEMA_VERSION, Bundle, parse_manifest
from splitedge.errors import BundleError
from tests.conftest import TEST_SPLITS


@pytest.fixture
def bundle_copy(mobilenet_bundle: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(mobilenet_bundle, tmp_path / "bundle"))


def edit_manifest(root: Path, edit) -> None:
    path = root / MANIFEST_NAME
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def test_exported_bundle_loads_and_lists_its_splits(mobilenet_bundle: Path) -> None:
    bundle = Bundle.load(mobilenet_bundle)
    assert [s.id for s in bundle.manifest.splits] == list(TEST_SPLITS)
    assert bundle.manifest.model.labels[967] == "espresso"
    assert bundle.artifact(LOCAL, "full").is_file()
    assert len(bundle.verified) == 1 + 2 * len(TEST_SPLITS)  # every file was hashed


def test_corrupt_artifact_is_refused_by_name(bundle_copy: Path) -> None:
    tail = bundle_copy / "tail" / f"{TEST_SPLITS[0]}.onnx"
    data = bytearray(tail.read_bytes())
    data[len(data) // 2] ^= 0xFF
    tail.write_bytes(bytes(data))
    with pytest.raises(BundleError, match=rf"tail/{TEST_SPLITS[0]}\.onnx: sha256 .* does not match"):
        Bundle.load(bundle_copy)
    # A device does not read tails, so the same bundle is fine for it.
    assert Bundle.load(bundle_copy, roles=("head", "full")).id


def test_device_bundle_may_omit_tails_but_not_heads(bundle_copy: Path) -> None:
    shutil.rmtree(bundle_copy / "tail")
    Bundle.load(bundle_copy, roles=("head", "full"))
    with pytest.raises(BundleError, match=r"tail/.*\.onnx: listed in the manifest but missing"):
        Bundle.load(bundle_copy, roles=("tail",))
    shutil.rmtree(bundle_copy / "head")
    with pytest.raises(BundleError, match=r"head/.*\.onnx: listed in the manifest but missing"):
        Bundle.load(bundle_copy, roles=("head",))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.pop("bundle_id"), "missing field 'bundle_id'"),
        (lambda d: d["model"].pop("labels"), "missing field 'model.labels'"),
        (lambda d: d["splits"][1]["tensor"].pop("shape"), "missing field 'splits[1].tensor.shape'"),
        (lambda d: d["splits"][0]["artifacts"][0].pop("sha256"), "missing field 'splits[0].artifacts[0].sha256'"),
        (lambda d: d["full"][0].update(bytes="many"), "field 'full[0].bytes' has type str, expected int"),
        (lambda d: d["splits"][0].update(kind="diagonal"), "splits[0].kind is 'diagonal'"),
        (lambda d: d["model"]["preprocess"].pop("crop"), "missing field 'model.preprocess.crop'"),
        (lambda d: d.update(schema_version=SCHEMA_VERSION + 1), f"schema_version {SCHEMA_VERSION + 1} is newer"),
    ],
)
def test_bad_manifest_is_refused_naming_the_field(bundle_copy: Path, edit, message: str) -> None:
    edit_manifest(bundle_copy, edit)
    with pytest.raises(BundleError, match=message.replace("[", r"\[").replace("]", r"\]")):
        Bundle.load(bundle_copy)


def test_not_a_bundle(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="no manifest"):
        Bundle.load(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(BundleError, match="not valid JSON"):
        Bundle.load(tmp_path)
    with pytest.raises(BundleError, match="field 'root' must be an object"):
        parse_manifest([1, 2])


def test_unknown_split_names_the_known_ones(mobilenet_bundle: Path) -> None:
    bundle = Bundle.load(mobilenet_bundle, roles=())
    with pytest.raises(BundleError, match=f"unknown split 'features_99'.*{TEST_SPLITS[0]}"):
        bundle.artifact("features_99", "head")
