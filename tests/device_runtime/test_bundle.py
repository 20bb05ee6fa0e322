"""Bundles are refused, by name of file or field, when they are corrupt, incomplete, too new or edited."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from device_runtime.bundle import (
    FLOAT32,
    HEAD,
    LAYER,
    LOCAL,
    MANIFEST_NAME,
    ONNX,
    SCHEMA_VERSION,
    SEMANTIC,
    TAIL,
    Bundle,
    Fragment,
    Manifest,
    ModelInfo,
    Preprocess,
    Quantization,
    Split,
    TensorSpec,
    make_artifact,
    manifest_digest,
    parse_manifest,
    semantic_id,
    write_manifest,
)
from splitedge.errors import BundleError
from tests.conftest import TEST_CHAIN, TEST_SPLITS


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
    assert [s.id for s in bundle.manifest.splits] == [*TEST_SPLITS, TEST_CHAIN]
    assert bundle.manifest.model.labels[967] == "espresso"
    assert bundle.artifact(LOCAL, "full").is_file()
    # every file was hashed: the full model, a head and a tail per cut, the chain's head and two stages
    assert len(bundle.verified) == 1 + 2 * len(TEST_SPLITS) + 3


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
        (lambda d: d.pop("bundle_id"), "bundle_id: missing"),
        (lambda d: d["model"].pop("labels"), "model.labels: missing"),
        (lambda d: d["splits"][1]["tensor"].pop("shape"), "splits[1].tensor.shape: missing"),
        (lambda d: d["splits"][0]["artifacts"][0].pop("sha256"), "splits[0].artifacts[0].sha256: missing"),
        (lambda d: d["full"][0].update(bytes="many"), "full[0].bytes: expected an integer >= 0, got 'many'"),
        (lambda d: d["splits"][0].update(kind="diagonal"),
         "splits[0].kind: expected one of layer, bottleneck, semantic, chain, got 'diagonal'"),
        (lambda d: d["model"]["preprocess"].pop("crop"), "model.preprocess.crop: missing"),
        (lambda d: d["full"][0].update(format="onxx"), "full[0].format: expected one of onnx, tflite, got 'onxx'"),
        (lambda d: d["splits"][1]["artifacts"][0].update(precision="int4"),
         "splits[1].artifacts[0].precision: expected one of float32, int8, got 'int4'"),
        (lambda d: d["splits"][0]["artifacts"][1].update(role="middle"),
         "splits[0].artifacts[1].role: expected one of head, tail, full, got 'middle'"),
        (lambda d: d.update(schema_version=SCHEMA_VERSION + 1), f"schema_version {SCHEMA_VERSION + 1} is newer"),
    ],
)
def test_bad_manifest_is_refused_naming_the_file_and_the_field(bundle_copy: Path, edit, message: str) -> None:
    edit_manifest(bundle_copy, edit)  # fields are checked before the identity: the message names the field
    pattern = f"^{bundle_copy / MANIFEST_NAME}: " + message.replace("[", r"\[").replace("]", r"\]")
    with pytest.raises(BundleError, match=pattern):
        Bundle.load(bundle_copy)


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(lambda d: d["model"]["labels"].__setitem__(967, "tea"), id="a label"),
        pytest.param(lambda d: d.update(bundle_id="mobilenet_v2-000000000000"), id="the bundle id"),
        pytest.param(lambda d: d["splits"][0]["quantization"].update(scale=0.5), id="a quantization scale"),
        pytest.param(lambda d: d["splits"].pop(), id="a split dropped"),
        pytest.param(lambda d: d.update(manifest_sha256="0" * 64), id="the digest"),
    ],
)
def test_manifest_edited_after_export_is_refused(bundle_copy: Path, edit) -> None:
    """The manifest's identity covers its content (finding 7): no field can change unnoticed."""
    manifest = Bundle.load(bundle_copy, roles=()).manifest
    quantized = replace(manifest.splits[0], quantization=Quantization(scale=0.05, zero_point=3))
    write_manifest(bundle_copy, replace(manifest, splits=(quantized, *manifest.splits[1:])))  # as an export would
    assert Bundle.load(bundle_copy).manifest.splits[0].quantization == quantized.quantization  # untouched: loads
    edit_manifest(bundle_copy, edit)
    with pytest.raises(BundleError, match=rf"^{bundle_copy / MANIFEST_NAME}: edited after export: .*; "
                                          "re-export the bundle, or restore the manifest.json it was exported with$"):
        Bundle.load(bundle_copy, roles=())


def test_identity_is_derived_from_the_content(mobilenet_bundle: Path, bundle_copy: Path) -> None:
    """Exported bundles carry ``<model>-<12 hex>`` of the digest; whitespace does not count, content does."""
    manifest = Bundle.load(mobilenet_bundle, roles=()).manifest
    data = json.loads((mobilenet_bundle / MANIFEST_NAME).read_text())
    assert manifest.manifest_sha256 == manifest_digest(data)
    assert manifest.bundle_id == f"mobilenet_v2-{manifest.manifest_sha256[:12]}"
    edit_manifest(bundle_copy, lambda d: None)  # rewritten without indentation
    assert Bundle.load(bundle_copy, roles=()).id == manifest.bundle_id
    relabelled = write_manifest(bundle_copy, replace(manifest, model=replace(manifest.model, labels=manifest.model.labels[::-1])))
    assert relabelled.bundle_id != manifest.bundle_id
    assert Bundle.load(bundle_copy, roles=()).id == relabelled.bundle_id


def test_manifest_without_identity_says_to_re_export(bundle_copy: Path) -> None:
    edit_manifest(bundle_copy, lambda d: d.pop("manifest_sha256"))
    with pytest.raises(BundleError, match=r"no manifest_sha256: exported before .*; re-export the bundle"):
        Bundle.load(bundle_copy, roles=())


def test_not_a_bundle(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="no manifest"):
        Bundle.load(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(BundleError, match="not valid JSON"):
        Bundle.load(tmp_path)
    with pytest.raises(BundleError, match=r"^manifest.json: expected an object, got \[1, 2\]$"):
        parse_manifest([1, 2])


def test_unknown_split_names_the_known_ones(mobilenet_bundle: Path) -> None:
    bundle = Bundle.load(mobilenet_bundle, roles=())
    with pytest.raises(BundleError, match=f"unknown split 'features_99'.*{TEST_SPLITS[0]}"):
        bundle.artifact("features_99", "head")


def _semantic_manifest(root: Path) -> dict:
    """A written manifest with a layer split and a semantic split of it in 3 fragments (labels 0..5),
    as JSON data, its files dummies (the parser reads the manifest, not the files)."""
    def artifact(path: str, role: str):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(path.encode())
        return make_artifact(root, path, role, ONNX, FLOAT32)

    tensor = TensorSpec((8, 2, 2), FLOAT32, 128)
    common = dict(position=4, tensor=tensor, compression_ratio=0.5, natural=True, compressive=True)
    split_id = semantic_id("_4", 3)
    groups = ((0, 3), (1, 4), (2, 5))
    manifest = Manifest(
        model=ModelInfo(name="tiny", input_shape=(1, 8, 8), input_dtype=FLOAT32, layout="NCHW", output_shape=(6,),
                        preprocess=Preprocess(8, 8, (0.5,), (0.5,)), labels=tuple("abcdef"), accuracy=0.9),
        full=(artifact("full/model.onnx", "full"),),
        splits=(
            Split(id="_4", kind=LAYER, artifacts=(artifact("head/_4.onnx", HEAD), artifact("tail/_4.onnx", TAIL)),
                  **common),
            Split(id=split_id, kind=SEMANTIC, artifacts=(artifact(f"head/{split_id}.onnx", HEAD),), **common,
                  fragments=tuple(Fragment(index=k, classes=g, artifacts=(artifact(f"fragment/{split_id}.{k}.onnx", TAIL),),
                                           params=100 + k) for k, g in enumerate(groups, 1)),
                  grouping="confusion of the full model on 60 training images; 3 groups of 2",
                  accuracies={"full": 0.9, "layer": 0.9, "semantic": 0.85}),
        ),
    )
    written = write_manifest(root, manifest)
    assert written.schema_version == 2 and written.splits == manifest.splits  # a semantic split round-trips
    return json.loads((root / MANIFEST_NAME).read_text())


def test_a_semantic_split_round_trips(tmp_path: Path) -> None:
    _semantic_manifest(tmp_path)
    bundle = Bundle.load(tmp_path)
    split = bundle.manifest.split("_4~3")
    assert split.kind == "semantic" and [f.classes for f in split.fragments] == [(0, 3), (1, 4), (2, 5)]
    assert split.accuracies == {"full": 0.9, "layer": 0.9, "semantic": 0.85} and split.grouping.startswith("confusion")
    assert [f.params for f in split.fragments] == [101, 102, 103]
    assert bundle.stage_artifact("_4~3", 2) == tmp_path / "fragment" / "_4~3.2.onnx"
    assert bundle.manifest.split("_4").fragments == () and bundle.manifest.split("_4").accuracies == {}
    with pytest.raises(BundleError, match=r"no fragment 4 of split '_4~3' \(fragments 1\.\.3\)"):
        bundle.stage_artifact("_4~3", 4)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        pytest.param(lambda d: d["splits"][1]["fragments"][1].update(classes=[1, 3]),
                     "splits[1].fragments[1].classes: label 3 is in two groups; each label belongs to exactly one fragment",
                     id="overlapping groups"),
        pytest.param(lambda d: d["splits"][1]["fragments"][2].update(classes=[2]),
                     "splits: semantic split _4~3: label 5 is in no group; its fragments' groups must cover labels 0..5",
                     id="a label in no group"),
        pytest.param(lambda d: d["splits"][1]["fragments"][2].update(classes=[2, 5, 6]),
                     "splits: semantic split _4~3: label 6 is past the model's 6 labels",
                     id="a label past the end"),
        pytest.param(lambda d: d["splits"][0].update(fragments=d["splits"][1]["fragments"]),
                     "splits[0].fragments: only a semantic split has fragments (this split is 'layer')",
                     id="fragments on a layer split"),
        pytest.param(lambda d: d["splits"][1].update(fragments=[{**d["splits"][1]["fragments"][0], "classes": list(range(6))}]),
                     "splits[1].fragments: a semantic split has two fragments or more", id="one fragment"),
        pytest.param(lambda d: d["splits"][1].pop("fragments"), "splits[1].fragments: a semantic split needs its fragments",
                     id="no fragments"),
        pytest.param(lambda d: d["splits"][1]["fragments"][1].update(index=3),
                     "splits[1].fragments[1].index: fragment 3 where fragment 2 belongs", id="out of order"),
        pytest.param(lambda d: d["splits"][1].update(accuracies={"semantic": "high"}),
                     "splits[1].accuracies.semantic: expected a number", id="an accuracy not a number"),
    ],
)
def test_bad_semantic_splits_are_refused_naming_the_field(tmp_path: Path, edit, message: str) -> None:
    data = _semantic_manifest(tmp_path)
    edit(data)
    with pytest.raises(BundleError, match="^manifest.json: " + re.escape(message)):
        parse_manifest(data)
