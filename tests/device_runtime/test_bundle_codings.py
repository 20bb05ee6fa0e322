"""A split's k-bit cut codings in the manifest (issue 47): written by the build, read back equal,
and every forged value refused naming the field, before anything trusts it."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from device_runtime.bundle import MANIFEST_NAME, Bundle, write_manifest
from device_runtime.wire.coding import CutCoding
from splitedge.errors import BundleError


@pytest.fixture
def coded(mobilenet_bundle: Path, tmp_path: Path) -> Path:
    """The test bundle with 4- and 2-bit codings on its first split, written as a build would."""
    root = Path(shutil.copytree(mobilenet_bundle, tmp_path / "bundle"))
    manifest = Bundle.load(root, roles=()).manifest
    split = manifest.splits[0]
    channels, values = split.tensor.shape[0], int(np.prod(split.tensor.shape))
    samples = np.random.default_rng(0).gamma(1.0, 1.0, (4, *split.tensor.shape)).astype(np.float32)
    codings = tuple(CutCoding.calibrate(samples, bits).spec(values, agreement=a) for bits, a in ((4, 0.94), (2, 0.92)))
    assert all(len(c.scale) == channels for c in codings)
    write_manifest(root, replace(manifest, splits=(replace(split, codings=codings), *manifest.splits[1:])))
    return root


def test_codings_round_trip_through_the_manifest(coded: Path, mobilenet_bundle: Path) -> None:
    split = Bundle.load(coded, roles=()).manifest.splits[0]
    assert [(c.name, c.agreement, c.top1) for c in split.codings] == [("k4", 0.94, None), ("k2", 0.92, None)]
    assert split.codings[1].bytes_per_sample == -(-int(np.prod(split.tensor.shape)) // 8) * 2
    assert split.coding("k2") is split.codings[1]
    # a bundle without codings reads (and hashes) as before: no ``codings`` key at all
    assert all("codings" not in s for s in json.loads((mobilenet_bundle / MANIFEST_NAME).read_text())["splits"])


def test_a_coding_the_split_does_not_have_is_refused_naming_those_it_has(coded: Path) -> None:
    split = Bundle.load(coded, roles=()).manifest.splits[0]
    with pytest.raises(BundleError, match=rf"split {split.id} has no cut coding 'k3' \(it has: k4, k2\); rebuild"):
        split.coding("k3")
    with pytest.raises(BundleError, match=r"has no cut coding 'k8' \(it has: none\)"):
        Bundle.load(coded, roles=()).manifest.splits[1].coding("k8")


def _forge(root: Path, edit) -> None:
    path = root / MANIFEST_NAME
    data = json.loads(path.read_text())
    edit(data["splits"][0]["codings"][0])
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(("edit", "message"), [
    (lambda c: c.update(bits=5), r"codings\[0\]\.bits: a cut coding has 8, 6, 4, 3, 2 bits, not 5"),
    (lambda c: c.update(bits=True), r"codings\[0\]\.bits: expected an integer"),
    (lambda c: c["scale"].__setitem__(0, float("nan")), r"codings\[0\]\.scale\[0\]: expected a finite number|scale"),
    (lambda c: c["scale"].__setitem__(0, 0.0), r"codings\[0\]\.scale: every scale must be positive and finite"),
    (lambda c: c["scale"].__setitem__(0, "1"), r"codings\[0\]\.scale\[0\]: expected a number"),
    (lambda c: c["zero"].__setitem__(0, 16), r"codings\[0\]\.zero: a 4-bit coding's zero points are 0\.\.15"),
    (lambda c: c["zero"].__setitem__(0, 0.5), r"codings\[0\]\.zero\[0\]: expected an integer"),
    (lambda c: c["scale"].pop(), r"codings\[0\]: a coding has one scale and one zero point per channel"),
    (lambda c: c.update(scale=1.0), r"codings\[0\]\.scale: expected a list"),
    (lambda c: c.pop("bytes_per_sample"), r"codings\[0\]\.bytes_per_sample: missing"),
    (lambda c: c.update(bits=2), r"codings: each bit width may be listed once"),
])
def test_a_forged_coding_is_refused_naming_the_field(coded: Path, edit, message: str) -> None:
    _forge(coded, edit)
    with pytest.raises(BundleError, match=message):
        Bundle.load(coded, roles=())
