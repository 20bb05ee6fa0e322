"""One field checker for every reader: it names the field, quotes the value, raises the reader's error."""

from __future__ import annotations

import pytest

from splitedge.errors import BundleError, CalibrationError
from splitedge._fields import Fields, join, shown

bundle_fields = Fields(BundleError)
calibration_fields = Fields(CalibrationError)


def test_each_reader_gets_its_own_error_class() -> None:
    with pytest.raises(BundleError, match=r"^full\[0\]\.bytes: expected an integer >= 0, got 'many'$"):
        bundle_fields.integer("many", "full[0].bytes", minimum=0)
    with pytest.raises(CalibrationError, match=r"^repeats: expected an integer >= 1, got True$"):
        calibration_fields.integer(True, "repeats", minimum=1)


def test_located_prefixes_the_path_and_keeps_the_class() -> None:
    with pytest.raises(BundleError, match=r"^manifest.json: splits\[0\]: expected an object, got \[\]$"):
        with bundle_fields.located("manifest.json:"):
            bundle_fields.obj([], "splits[0]")
    # Another class's error passes through untouched: it is not this reader's field.
    with pytest.raises(CalibrationError, match=r"^model\.rtt_ms: missing$"):
        with bundle_fields.located("manifest.json:"):
            calibration_fields.member({}, "rtt_ms", "model")
    assert join("manifest.json:", "model") == "manifest.json: model" and join("model", "labels") == "model.labels"


@pytest.mark.parametrize(
    ("check", "message"),
    [
        (lambda f: f.member({}, "labels", "model"), r"^model\.labels: missing$"),
        (lambda f: f.array("x", "labels"), r"^labels: expected a list, got 'x'$"),
        (lambda f: f.text("", "id"), r"^id: expected a non-empty string, got ''$"),
        (lambda f: f.text(3, "labels[2]", empty=True), r"^labels\[2\]: expected a string, got 3$"),
        (lambda f: f.number(float("nan"), "scale"), r"^scale: expected a finite number >= 0, got nan$"),
        (lambda f: f.number(float("inf"), "mean[0]", minimum=float("-inf")), r"^mean\[0\]: expected a finite number, got inf$"),
        (lambda f: f.flag(1, "natural"), r"^natural: expected true or false, got 1$"),
        (lambda f: f.choice("onxx", "format", ("onnx", "tflite")), r"^format: expected one of onnx, tflite, got 'onxx'$"),
    ],
)
def test_checks_name_the_field_and_quote_the_value(check, message: str) -> None:
    with pytest.raises(BundleError, match=message):
        check(bundle_fields)


def test_good_values_come_back() -> None:
    assert calibration_fields.number(3, "ms") == 3.0 and isinstance(calibration_fields.number(3, "ms"), float)
    assert calibration_fields.text("", "label", empty=True) == ""
    assert calibration_fields.choice("int8", "precision", ("float32", "int8")) == "int8"
    assert len(shown(list(range(100)))) == 60
