"""calibration.json: round trip, atomic save, and each refusal with the message a user sees."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibration import FILENAME, SCHEMA, Calibration, CalibrationError, SplitTable, load, save
from tests.calibration.models import corners

SHA = "ab" * 32


def calibration(**changes) -> Calibration:
    model = corners()
    fields = dict(
        bundle_id="mobilenet_v2-3f69",
        manifest_sha256=SHA,
        created="2025-05-01T12:00:00+00:00",
        board={"model": "Raspberry Pi 5 Model B Rev 1.0", "cores": 4},
        backend="onnx",
        precision="float32",
        threads=4,
        repeats=20,
        batches=(1,),
        link={"rtt_ms": 5.0, "probe_bytes": 1_000_000, "probe_ms": 85.0, "rate_bps": 9.4e7},
        model=model,
        table=SplitTable.build(model, [1]),
    )
    fields.update(changes)
    return Calibration(**fields)


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    path = tmp_path / FILENAME
    save(calibration(), path)
    return path


def rewrite(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def test_round_trip(saved: Path) -> None:
    assert load(saved, bundle_id="mobilenet_v2-3f69", manifest_sha256=SHA) == calibration()


def test_loads_from_the_bundle_directory_and_without_a_host(tmp_path: Path) -> None:
    save(calibration(link=None, threads=None, created="2025-05-01T12:00:00Z"), tmp_path / FILENAME)
    loaded = load(tmp_path)
    assert (loaded.link, loaded.threads) == (None, None)


def test_the_pace_of_the_timed_runs_is_kept_and_older_files_were_back_to_back(saved: Path) -> None:
    save(calibration(fps=5), saved)
    assert load(saved).fps == 5.0
    rewrite(saved, lambda d: d.pop("fps"))  # written before runs could be paced
    assert load(saved).fps == 0.0


def test_save_replaces_atomically_and_leaves_no_temp_file(saved: Path) -> None:
    save(calibration(repeats=50), saved)
    assert load(saved).repeats == 50
    assert [p.name for p in saved.parent.iterdir()] == [FILENAME]


def test_failed_save_keeps_the_old_file(saved: Path) -> None:
    before = saved.read_text()
    with pytest.raises(TypeError):
        save(calibration(board={"clock": object()}), saved)  # not JSON
    assert saved.read_text() == before
    assert [p.name for p in saved.parent.iterdir()] == [FILENAME]


def test_missing_file_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(CalibrationError) as info:
        load(tmp_path)
    assert str(info.value) == f"no calibration for this bundle at {tmp_path / FILENAME}; run split-device calibrate {tmp_path}"


def test_other_bundle_is_refused(saved: Path) -> None:
    with pytest.raises(CalibrationError) as info:
        load(saved, bundle_id="resnet18-0c1d")
    assert str(info.value) == (
        f"{saved} was calibrated for bundle mobilenet_v2-3f69 (manifest sha256 abababababab…), "
        "not for resnet18-0c1d; run split-device calibrate again"
    )


def test_other_export_under_the_same_id_is_refused(saved: Path) -> None:
    with pytest.raises(CalibrationError, match=r"not for mobilenet_v2-3f69 \(manifest sha256 cdcdcdcdcdcd…\); run split-device calibrate again"):
        load(saved, bundle_id="mobilenet_v2-3f69", manifest_sha256="cd" * 32)


def test_newer_schema_is_refused(saved: Path) -> None:
    rewrite(saved, lambda d: d.update(schema="splitedge.calibration/2"))
    with pytest.raises(CalibrationError, match=rf"^{saved}: schema splitedge.calibration/2 is newer than this splitedge reads \({SCHEMA}\)"):
        load(saved)


def test_not_a_calibration_file_is_refused(saved: Path) -> None:
    rewrite(saved, lambda d: d.update(schema="splitedge.manifest/1"))
    with pytest.raises(CalibrationError, match=rf"schema: expected {SCHEMA}, got 'splitedge.manifest/1'"):
        load(saved)


def test_invalid_json_is_refused(saved: Path) -> None:
    saved.write_text('{"schema": ')
    with pytest.raises(CalibrationError, match=rf"^{saved}: not valid JSON"):
        load(saved)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["model"]["splits"][2]["tail_ms"].update({"1": "x"}), r"model.splits\[2\].tail_ms\[1\]: expected a number, got 'x'"),
        (lambda d: d["model"]["splits"][1]["head_ms"].update({"four": 1.0}), r"model.splits\[1\].head_ms\['four'\]: expected a batch size"),
        (lambda d: d["model"].pop("rtt_ms"), r"model.rtt_ms: missing"),
        (lambda d: d["table"]["best"][0].pop(), r"table.best\[0\]: expected 81 entries"),
        (lambda d: d.update(backend="tensorrt"), r"backend: expected one of onnx, tflite, got 'tensorrt'"),
        (lambda d: d.update(repeats=True), r"repeats: expected an integer >= 1, got True"),
        (lambda d: d.update(fps=-5), r"fps: expected a finite number >= 0, got -5"),
        (lambda d: d.update(created="2025-05-01T12:00:00"), r"created: expected an ISO 8601 UTC time"),
        (lambda d: d.update(manifest_sha256="abc"), r"manifest_sha256: expected 64 lowercase hex digits"),
        (lambda d: d["link"].pop("rate_bps"), r"link.rate_bps: missing"),
        (lambda d: d["table"]["splits"].__setitem__(1, "conv9"), r"table.splits: conv9 not in the model's splits"),
    ],
)
def test_bad_field_is_named_by_its_path(saved: Path, edit, message: str) -> None:
    rewrite(saved, edit)
    with pytest.raises(CalibrationError, match=rf"^{saved}: {message}"):
        load(saved)


def test_from_dict_names_the_source() -> None:
    d = calibration().to_dict()
    d["model"]["splits"][2]["head_ms"]["4"] = "x"
    with pytest.raises(CalibrationError, match=r"^calibration.json: model.splits\[2\].head_ms\[4\]: expected a number, got 'x'$"):
        Calibration.from_dict(d)
