"""Schema 3: a bundle with the normalisation folded into its artifacts, refused by boards that
would normalise a second time; bundles without it are written and read as before."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from device_runtime.bundle import FOLDED_SCHEMA, MANIFEST_NAME, Bundle, manifest_digest, parse_manifest, write_manifest
from splitedge.errors import BundleError


def _copy(mobilenet_bundle: Path, tmp_path: Path) -> Path:
    (tmp_path / MANIFEST_NAME).write_text((mobilenet_bundle / MANIFEST_NAME).read_text())
    return tmp_path


def test_a_folded_manifest_is_schema_3_and_an_unfolded_one_keeps_its_bytes(mobilenet_bundle: Path, tmp_path: Path) -> None:
    root = _copy(mobilenet_bundle, tmp_path)
    manifest = Bundle.load(root, roles=()).manifest
    model = manifest.model
    unfolded = replace(model, preprocess=replace(model.preprocess, folded=False, fast_agreement=None,
                                                 fast_agreement_on=None))
    before = write_manifest(root, replace(manifest, model=unfolded))
    assert "folded" not in json.loads((root / MANIFEST_NAME).read_text())["model"]["preprocess"]
    folded = replace(model, preprocess=replace(model.preprocess, folded=True, fast_agreement=0.996,
                                               fast_agreement_on="20 photos"))
    written = write_manifest(root, replace(manifest, model=folded))
    assert written.schema_version == FOLDED_SCHEMA and written.bundle_id != before.bundle_id
    loaded = Bundle.load(root, roles=()).manifest.model.preprocess
    assert (loaded.folded, loaded.fast_agreement, loaded.fast_agreement_on) == (True, 0.996, "20 photos")


def test_folded_in_an_older_schema_is_refused(mobilenet_bundle: Path) -> None:
    data = json.loads((mobilenet_bundle / MANIFEST_NAME).read_text())
    data["model"]["preprocess"]["folded"] = True
    data["schema_version"] = 2  # a chain bundle is schema 2 already: only the fold is newer
    data["manifest_sha256"] = manifest_digest(data)
    with pytest.raises(BundleError, match="model.preprocess.folded in a schema_version 2 manifest; folded "
                                          "normalisation came with schema 3: re-export the bundle"):
        parse_manifest(data)


def test_folded_must_be_true_or_false(mobilenet_bundle: Path) -> None:
    data = json.loads((mobilenet_bundle / MANIFEST_NAME).read_text())
    data["model"]["preprocess"]["folded"] = "yes"
    with pytest.raises(BundleError, match="folded: expected true or false"):
        parse_manifest(data)
