"""calibration.json: round trip, one table per (backend, precision), spreads, schema 1 still read,
atomic save, and each refusal with the message a user sees."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibration import CalibrationError, LatencyModel, SplitTable, Spread
from calibration.calibration_file import (
    Calibration, Calibrations, FILENAME, Preprocessing, SCHEMA, load, load_all, save,
)
from splitedge._words import LOCAL
from tests.calibration.models import corners, preprocessed

SHA = "ab" * 32


SPREADS = dict(
    head_spread={LOCAL: {1: Spread(7.5, 8.0, 8.5)}},
    link_spread={"rtt_ms": Spread(4.0, 5.0, 7.0), "probe_ms": Spread(80.0, 85.0, 90.0)},
)


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
        **SPREADS,
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


def first(edit):
    """``edit`` applied to the file's first table."""
    return lambda d: edit(d["calibrations"][0])


def test_round_trip(saved: Path) -> None:
    assert load(saved, bundle_id="mobilenet_v2-3f69", manifest_sha256=SHA) == calibration()


def test_loads_from_the_bundle_directory_and_without_a_host(tmp_path: Path) -> None:
    save(calibration(link=None, threads=None, created="2025-05-01T12:00:00Z"), tmp_path / FILENAME)
    loaded = load(tmp_path)
    assert (loaded.link, loaded.threads) == (None, None)


def test_the_pace_of_the_timed_runs_is_kept_and_older_files_were_back_to_back(saved: Path) -> None:
    save(calibration(fps=5), saved)
    assert load(saved).fps == 5.0
    rewrite(saved, first(lambda d: d.pop("fps")))  # written before runs could be paced
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
    rewrite(saved, lambda d: d.update(schema="splitedge.calibration/3"))
    with pytest.raises(CalibrationError, match=rf"^{saved}: schema splitedge.calibration/3 is newer than this splitedge reads \({SCHEMA}\)"):
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
        (first(lambda d: d["model"]["splits"][2]["tail_ms"].update({"1": "x"})), r"calibrations\[0\].model.splits\[2\].tail_ms\[1\]: expected a number, got 'x'"),
        (first(lambda d: d["model"]["splits"][1]["head_ms"].update({"four": 1.0})), r"calibrations\[0\].model.splits\[1\].head_ms\['four'\]: expected a batch size"),
        (first(lambda d: d["model"].pop("rtt_ms")), r"calibrations\[0\].model.rtt_ms: missing"),
        (first(lambda d: d["table"]["best"][0].pop()), r"calibrations\[0\].table.best\[0\]: expected 81 entries"),
        (first(lambda d: d.update(backend="tensorrt")), r"calibrations\[0\].backend: expected one of onnx, tflite, got 'tensorrt'"),
        (first(lambda d: d.update(repeats=True)), r"calibrations\[0\].repeats: expected an integer >= 1, got True"),
        (first(lambda d: d.update(fps=-5)), r"calibrations\[0\].fps: expected a finite number >= 0, got -5"),
        (first(lambda d: d.update(created="2025-05-01T12:00:00")), r"calibrations\[0\].created: expected an ISO 8601 UTC time"),
        (lambda d: d.update(manifest_sha256="abc"), r"manifest_sha256: expected 64 lowercase hex digits"),
        (first(lambda d: d["link"].pop("rate_bps")), r"calibrations\[0\].link.rate_bps: missing"),
        (first(lambda d: d["table"]["splits"].__setitem__(1, "conv9")), r"calibrations\[0\].table.splits: conv9 not in the model's splits"),
        (first(lambda d: d["spread"]["heads"][LOCAL]["1"].update(p10=9.0)), r"calibrations\[0\].spread.heads.local\[1\]: expected p10 <= p50 <= p90"),
        (first(lambda d: d["spread"]["link"]["rtt_ms"].pop("p90")), r"calibrations\[0\].spread.link.rtt_ms.p90: missing"),
        (lambda d: d["calibrations"].append(d["calibrations"][0]), r"calibrations\[1\]: a second table for onnx/float32"),
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


def test_spreads_round_trip_beside_the_medians(saved: Path) -> None:
    loaded = load(saved)
    assert loaded.head_spread == {LOCAL: {1: Spread(7.5, 8.0, 8.5)}}
    assert loaded.link_spread["rtt_ms"] == Spread(4.0, 5.0, 7.0)
    assert json.loads(saved.read_text())["calibrations"][0]["spread"]["heads"][LOCAL]["1"] == {
        "p10": 7.5, "p50": 8.0, "p90": 8.5
    }


def test_one_table_per_backend_and_precision(saved: Path) -> None:
    tflite = calibration(backend="tflite", precision="int8", created="2025-05-02T12:00:00+00:00")
    kept = save(tflite, saved)
    assert kept.keys == (("onnx", "float32"), ("tflite", "int8"))
    assert load(saved, backend="tflite", precision="int8") == tflite
    assert load(saved, backend="onnx", precision="float32") == calibration()
    assert load(saved) == tflite  # the latest, without a key
    # Calibrating a pair again replaces its table in place and keeps the other.
    save(calibration(repeats=50), saved)
    tables = load_all(saved)
    assert tables.keys == (("onnx", "float32"), ("tflite", "int8"))
    assert tables.get("onnx", "float32").repeats == 50 and tables.get("tflite", "int8") == tflite


def test_a_missing_table_names_the_ones_there_and_the_command(saved: Path) -> None:
    with pytest.raises(CalibrationError) as info:
        load(saved.parent, backend="tflite", precision="int8")
    assert str(info.value) == (
        f"{saved} has no table for tflite/int8 (it has onnx/float32); "
        f"run split-device calibrate {saved.parent} --backend tflite --precision int8"
    )


def test_nearest_prefers_the_same_backend_then_the_same_precision() -> None:
    onnx_int8 = calibration(precision="int8", created="2025-05-01T12:00:00+00:00")
    tflite_fp32 = calibration(backend="tflite", created="2025-05-03T12:00:00+00:00")
    tables = Calibrations(onnx_int8.bundle_id, SHA, (onnx_int8, tflite_fp32))
    assert tables.nearest("onnx", "int8") is onnx_int8  # exact
    assert tables.nearest("onnx", "float32") is onnx_int8  # same runtime, other precision
    assert tables.nearest("tflite", "int8") is tflite_fp32  # same runtime
    assert tables.describe() == "onnx/int8, tflite/float32"
    only_int8 = Calibrations(onnx_int8.bundle_id, SHA, (onnx_int8,))
    assert only_int8.nearest("tflite", "int8") is onnx_int8  # same precision: the only one anyway


def test_saving_over_another_bundles_file_replaces_it(saved: Path) -> None:
    other = calibration(bundle_id="resnet18-0c1d", backend="tflite")
    assert save(other, saved).keys == (("tflite", "float32"),)
    assert load_all(saved).bundle_id == "resnet18-0c1d"


def test_a_schema_1_file_is_read_as_one_table_without_spreads(tmp_path: Path) -> None:
    # What splitedge wrote before it kept spreads and several tables: one table at the top.
    old = {"schema": "splitedge.calibration/1", **calibration().to_dict()}
    del old["spread"]
    (tmp_path / FILENAME).write_text(json.dumps(old))
    tables = load_all(tmp_path, bundle_id="mobilenet_v2-3f69", manifest_sha256=SHA)
    assert tables.keys == (("onnx", "float32"),)
    assert tables.tables[0] == calibration(head_spread={}, link_spread={})
    # Calibrating another backend on top keeps it, now in schema 2.
    save(calibration(backend="tflite"), tmp_path / FILENAME)
    assert json.loads((tmp_path / FILENAME).read_text())["schema"] == SCHEMA
    assert load_all(tmp_path).keys == (("onnx", "float32"), ("tflite", "float32"))


def timed(path: str = "fast", p50: float = 3.0) -> dict:
    """The changes to :func:`calibration` of a board that timed a 640x480 frame's preprocessing."""
    model = preprocessed(corners(), p50)
    return dict(model=model, table=SplitTable.build(model, [1]),
                preprocess=Preprocessing(path, 640, 480, Spread(2.5, p50, 4.0)))


def test_preprocessing_round_trips_with_its_frame_path_and_spread(tmp_path: Path) -> None:
    save(calibration(**timed()), tmp_path / FILENAME)
    loaded = load(tmp_path)
    assert loaded == calibration(**timed())
    assert loaded.model.preprocess_ms == 3.0 and loaded.preprocess.frame == "640x480"
    stored = json.loads((tmp_path / FILENAME).read_text())["calibrations"][0]
    assert stored["preprocess"] == {"path": "fast", "width": 640, "height": 480,
                                    "spread": {"p10": 2.5, "p50": 3.0, "p90": 4.0}}
    assert stored["model"]["preprocess_ms"] == 3.0


def test_a_file_from_before_preprocessing_was_timed_loads_without_it(saved: Path) -> None:
    stored = json.loads(saved.read_text())["calibrations"][0]
    assert "preprocess" not in stored and "preprocess_ms" not in stored["model"]  # as older files were written
    loaded = load(saved)
    assert loaded.preprocess is None and loaded.model.preprocess_ms is None


def test_the_models_preprocessing_is_the_timed_median() -> None:
    with pytest.raises(CalibrationError, match=r"model.preprocess_ms: expected the preprocessing's median \(3.0\), got 5.0"):
        calibration(**{**timed(), "model": preprocessed(corners(), 5.0)})
    with pytest.raises(CalibrationError, match=r"expected the preprocessing's median \(None\), got 3.0"):
        calibration(model=preprocessed(corners(), 3.0))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (first(lambda d: d["preprocess"].update(width=0)), r"calibrations\[0\].preprocess.width: expected an integer >= 1, got 0"),
        (first(lambda d: d["preprocess"]["spread"].pop("p50")), r"calibrations\[0\].preprocess.spread.p50: missing"),
        (first(lambda d: d["preprocess"].pop("path")), r"calibrations\[0\].preprocess.path: missing"),
    ],
)
def test_bad_preprocessing_is_named_by_its_path(tmp_path: Path, edit, message: str) -> None:
    path = tmp_path / FILENAME
    save(calibration(**timed()), path)
    rewrite(path, edit)
    with pytest.raises(CalibrationError, match=rf"^{path}: {message}"):
        load(path)
