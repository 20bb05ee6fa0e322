"""A layer split's early exit in the manifest (issue 48): written as a build writes it, read back
equal, its threshold chosen by what was measured, every forged value refused naming the field, and
a bundle without exits read (and hashed) exactly as before."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from device_runtime import Exit
from device_runtime.bundle import CHAIN, EXIT_SCHEMA, FOLDED_SCHEMA, MANIFEST_NAME, Bundle, write_manifest
from splitedge.errors import BundleError

ROWS = (  # confidence, share, agreement, top1, full_top1: as a labelled build measures them
    (0.0, 1.0, 0.80, 0.70, 0.82),
    (0.5, 0.60, 0.93, 0.88, 0.90),
    (0.8, 0.40, 0.97, 0.93, 0.935),
    (0.9, 0.25, 0.99, 0.97, 0.97),
)


def _exit(rows=ROWS) -> Exit:
    return Exit(output=Exit.OUTPUT, kind="conv", params=12810, measured_on=500,
                thresholds=tuple(Exit.Threshold(*row) for row in rows), max_abs_error=1e-6, max_rel_error=2e-7)


@pytest.fixture
def exiting(mobilenet_bundle: Path, tmp_path: Path) -> Path:
    """The test bundle with an exit on its first split, written as a build writes it."""
    root = Path(shutil.copytree(mobilenet_bundle, tmp_path / "bundle"))
    manifest = Bundle.load(root, roles=()).manifest
    split = manifest.splits[0]
    write_manifest(root, replace(manifest, splits=(replace(split, exit=_exit()), *manifest.splits[1:])))
    return root


def test_an_exit_round_trips_through_the_manifest(exiting: Path) -> None:
    manifest = Bundle.load(exiting, roles=()).manifest
    assert manifest.splits[0].exit == _exit()
    assert manifest.schema_version == EXIT_SCHEMA  # an older board refuses it rather than misread its heads
    assert all(s.exit is None for s in manifest.splits[1:])
    entry = json.loads((exiting / MANIFEST_NAME).read_text())["splits"][0]["exit"]
    assert entry["output"] == "exit_logits" and entry["kind"] == "conv" and entry["params"] == 12810
    assert entry["measured_on"] == 500
    assert entry["thresholds"][1] == {"confidence": 0.5, "share": 0.6, "agreement": 0.93, "top1": 0.88,
                                      "full_top1": 0.9}


def test_a_bundle_without_exits_reads_and_hashes_as_before(mobilenet_bundle: Path) -> None:
    data = json.loads((mobilenet_bundle / MANIFEST_NAME).read_text())
    assert all("exit" not in s for s in data["splits"])
    manifest = Bundle.load(mobilenet_bundle, roles=()).manifest
    assert all(s.exit is None for s in manifest.splits)
    assert manifest.schema_version < EXIT_SCHEMA


def test_the_threshold_is_the_lowest_confidence_meeting_the_floor() -> None:
    exit_ = _exit()
    assert exit_.threshold(agreement=0.95).confidence == 0.8  # 0.97: the first row at or above the floor
    assert exit_.threshold(agreement=0.93).confidence == 0.5  # met exactly
    assert exit_.threshold(agreement=0.995) is None  # no row measured that well: the exit never answers
    assert exit_.threshold(top1_loss=0.01).confidence == 0.8  # 0.935 - 0.93 = 0.005; at 0.5 it is 0.02
    assert exit_.threshold(top1_loss=0.0).confidence == 0.9
    assert exit_.threshold(top1_loss=0.2).confidence == 0.0  # 0.12 lost, answering every frame
    unlabelled = _exit(tuple((*row[:3], None, None) for row in ROWS))
    assert unlabelled.threshold(top1_loss=0.5) is None  # no labels: no top-1 to lose, nothing meets it
    with pytest.raises(ValueError, match="one floor"):
        exit_.threshold()
    with pytest.raises(ValueError, match="one floor"):
        exit_.threshold(agreement=0.9, top1_loss=0.01)


def _forge(root: Path, edit) -> None:
    path = root / MANIFEST_NAME
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _row(data: dict, i: int) -> dict:
    return data["splits"][0]["exit"]["thresholds"][i]


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: _row(d, 1).update(share=1.5),
     r"splits\[0\]\.exit\.thresholds\[1\]\.share: expected a number in \[0, 1\]"),
    (lambda d: _row(d, 1).update(confidence=-0.1), r"thresholds\[1\]\.confidence: expected a finite number >= 0"),
    (lambda d: _row(d, 1).update(agreement=float("nan")), r"thresholds\[1\]\.agreement: expected a finite number"),
    (lambda d: _row(d, 1).update(agreement="0.9"), r"thresholds\[1\]\.agreement: expected a number"),
    (lambda d: _row(d, 2).update(top1=None), r"thresholds\[2\]: top1 and full_top1 are measured on the same frames"),
    (lambda d: _row(d, 2).update(confidence=0.5), r"thresholds\[2\]\.confidence: thresholds are listed in ascending"),
    (lambda d: _row(d, 3).update(share=0.5), r"thresholds\[3\]\.share: a higher threshold lets no more frames exit"),
    (lambda d: _row(d, 0).pop("agreement"), r"thresholds\[0\]\.agreement: missing"),
    (lambda d: d["splits"][0]["exit"].update(thresholds=[]), r"exit\.thresholds: an exit has at least one"),
    (lambda d: d["splits"][0]["exit"].update(output="cut"), r"exit\.output: 'cut' is not a head output name"),
    (lambda d: d["splits"][0]["exit"].update(output="../x"), r"exit\.output: '\.\./x' is not a head output name"),
    (lambda d: d["splits"][0]["exit"].update(kind="mlp"), r"exit\.kind: expected one of pool_linear, conv, got 'mlp'"),
    (lambda d: d["splits"][0]["exit"].update(params=0), r"exit\.params: expected an integer >= 1"),
    (lambda d: d["splits"][0]["exit"].update(measured_on=2.5), r"exit\.measured_on: expected an integer"),
    (lambda d: d["splits"][0].update(exit=[1]), r"splits\[0\]\.exit: expected an object"),
    (lambda d: d.update(schema_version=FOLDED_SCHEMA), r"has an exit in a schema_version 3 manifest; exits came with"),
    (lambda d: next(s for s in d["splits"] if s["kind"] == CHAIN).update(exit=d["splits"][0]["exit"]),
     r"exit: only a layer split has an exit \(this split is 'chain'\)"),
])
def test_a_forged_exit_is_refused_in_one_line_naming_the_field(exiting: Path, edit, message: str) -> None:
    _forge(exiting, edit)
    with pytest.raises(BundleError, match=message) as caught:
        Bundle.load(exiting, roles=())
    assert "\n" not in str(caught.value)


def test_an_edited_table_is_refused_even_where_every_value_is_valid(exiting: Path) -> None:
    """A forged but well-formed table (a better agreement than measured) changes the manifest's identity."""
    _forge(exiting, lambda d: _row(d, 1).update(agreement=0.99))
    with pytest.raises(BundleError, match="edited after export"):
        Bundle.load(exiting, roles=())
