"""``split-export build --exits``: early exits at the cut, trained, exported, calibrated (issue 48).

Two real builds: the suite's Fashion-MNIST VGG (real labels: the exits learn them and the table
has top-1 beside agreement) and the small RGB network of the preprocessing tests on crops of the
scikit-image photos in folders no label names (no labels: the exit is distilled from the full
model, the table is agreement only, held out of the training crops), with int8 heads. What is
checked runs the bundle's own files through the board's own engine and recomputes what the build
recorded.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")

from device_runtime import Bundle, Exit  # noqa: E402
from device_runtime.bundle import CUT, FLOAT32, HEAD, INT8, LOCAL, MANIFEST_NAME, ONNX  # noqa: E402
from device_runtime.engine import DeviceRunner  # noqa: E402
from exporter import BuildSpec, build_bundle  # noqa: E402
from exporter import _build  # noqa: E402
from exporter._datasets import load_images  # noqa: E402
from exporter._exits import CONFIDENCES, DEFAULT_KIND, EPOCHS, EXITS_PNG, ExitOptions, exit_table  # noqa: E402
from exporter._exits import kind_for, read_exits  # noqa: E402
from exporter._graph import split_at, trace  # noqa: E402
from exporter._validate import FLOAT32_EPS_FLOOR, RTOL  # noqa: E402
from exporter.cli import EXIT_EPOCHS, EXIT_KIND, EXIT_KINDS, main  # noqa: E402
from tests.exporter.test_int8_accuracy import crops  # noqa: E402

SHAPE = (1, 28, 28)
TRAIN_IMAGES = 3000  # the exits' training images: seconds, and an exit at _17 still answers most frames well


def _main(*argv: str) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        status = main(list(argv))
    return status, stdout.getvalue(), stderr.getvalue()


@pytest.fixture(scope="module")
def fmnist(trained, tmp_path_factory: pytest.TempPathFactory):
    """fmnist_vgg (the suite's trained weights) cut at _13 and _17 with conv exits, through
    build_bundle with the exits it trained kept for torch's side (the build keeps no torch modules)."""
    model, weights = trained
    kept: dict[tuple[int, ...], torch.nn.Module] = {}
    train_exit = _build.train_exit

    def keep(head, tail, cut_shape, options, train, progress):
        kept[tuple(cut_shape)] = module = train_exit(head, tail, cut_shape, options, train, progress)
        return module

    out = tmp_path_factory.mktemp("fmnist") / "bundle"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_build, "train_exit", keep)
        manifest = build_bundle(BuildSpec(
            "exporter.zoo:fmnist_vgg", weights=weights, splits=["_13", "_17"], input_shape=SHAPE,
            exits=ExitOptions(train_data="fashion-mnist", kind="conv", train_images=TRAIN_IMAGES)), out, progress=False)
    return out, manifest, model, kept


def test_each_layer_split_gets_an_exit_with_a_table_measured_on_the_test_split(fmnist) -> None:
    out, manifest, _, _ = fmnist
    assert [s.id for s in manifest.splits] == ["_13", "_17"]
    for split in manifest.splits:
        e = split.exit
        assert e is not None and (e.output, e.kind, e.measured_on) == (Exit.OUTPUT, "conv", 10_000)
        c = split.tensor.shape[0]
        assert e.params == 9 * c * c + 2 * c + c * 10 + 10  # conv (no bias), batch norm, linear
        assert e.max_rel_error is not None and e.max_rel_error < RTOL
        confidences = [r.confidence for r in e.thresholds]
        assert confidences == list(CONFIDENCES[: len(confidences)]) and confidences[0] == 0.0
        shares = [r.share for r in e.thresholds]
        assert shares[0] == 1.0 and shares == sorted(shares, reverse=True)
        assert all(r.top1 is not None and r.full_top1 is not None for r in e.thresholds)
        # on every frame (confidence 0) the full model's top-1 is the bundle's measured accuracy of it
        assert e.thresholds[0].full_top1 == pytest.approx(0.8243, abs=0.02)
    # the report holds the same tables, for people
    report = read_exits(out)
    assert report is not None and [s["split"] for s in report["splits"]] == ["_13", "_17"]
    assert report["splits"][1]["thresholds"][0]["agreement"] == manifest.splits[1].exit.thresholds[0].agreement
    assert (out / "report" / EXITS_PNG).stat().st_size > 10_000


def test_the_table_is_what_the_exported_head_and_full_model_answer_on_the_test_images(fmnist) -> None:
    out, manifest, _, _ = fmnist
    test = load_images("fashion-mnist:test", SHAPE)
    bundle = Bundle.load(out)
    runner = DeviceRunner(bundle, threads=1)
    full = np.concatenate([runner.run_full(test.x[i : i + 1000])[0] for i in range(0, len(test), 1000)])
    assert (full.argmax(1) == test.y).mean() == pytest.approx(manifest.splits[0].exit.thresholds[0].full_top1)
    for split in manifest.splits:
        logits = np.concatenate([runner.run_head_exit(split.id, test.x[i : i + 1000])[0][1]
                                 for i in range(0, len(test), 1000)])
        assert exit_table(logits, full, test.y) == split.exit.thresholds
    best = manifest.splits[1].exit.threshold(top1_loss=0.01)
    # the target on the suite's network: an exit answering half the test images within a point
    assert best is not None and best.share >= 0.5 and best.full_top1 - best.top1 <= 0.01


def test_the_engine_gives_the_cut_alone_or_with_the_exit_both_equal_to_torch(fmnist) -> None:
    out, manifest, model, kept = fmnist
    x = load_images("fashion-mnist:test", SHAPE).x[:64]
    runner = DeviceRunner(Bundle.load(out), threads=1)
    traced = trace(model, SHAPE)
    for split in manifest.splits:
        head, _ = split_at(traced, split.id)
        exit_module = kept[split.tensor.shape].eval()
        with torch.no_grad():
            cut_torch = head(torch.from_numpy(x))
            exit_torch = exit_module(cut_torch).numpy()
        cut_torch = cut_torch.numpy()
        alone, _ = runner.run_head(split.id, x)  # what every board runs today: the cut, the exit ignored
        (cut, logits), _ = runner.run_head_exit(split.id, x)
        for got, want in ((alone, cut_torch), (cut, cut_torch), (logits, exit_torch)):
            tolerance = max(RTOL * want.std(), FLOAT32_EPS_FLOOR * np.finfo(np.float32).eps * np.abs(want).max())
            assert got.shape == want.shape and np.abs(got - want).max() <= tolerance
        assert np.array_equal(alone, cut)
    head = onnx.load(out / next(a.path for a in manifest.splits[0].artifacts if a.role == HEAD))
    assert [o.name for o in head.graph.output] == [CUT, Exit.OUTPUT]
    with pytest.raises(Exception, match="split local has no early exit|has no early exit"):
        runner.run_head_exit(LOCAL, x)


def test_without_labels_the_exit_is_distilled_and_measured_on_held_out_crops(factory, photos_dir: Path,
                                                                             tmp_path: Path) -> None:
    data = crops(photos_dir, tmp_path / "data", {"misc": "astronaut", "more": "coffee"}, 60)  # no label's name
    status, stdout, stderr = _main("build", factory, "--splits", "b", "--exits", "--exit-kind", "pool_linear",
                                   "--train-data", str(data), "--quantize", "int8", "--out", str(tmp_path / "b"),
                                   "--json")
    assert status == 0, stderr
    summary = json.loads(stdout)
    (split,) = summary["splits"]
    assert split["exit"]["kind"] == "pool_linear" and split["exit"]["measured_on"] == 24  # a fifth of 120, held out
    assert all(r["top1"] is None and r["full_top1"] is None for r in split["exit"]["thresholds"])
    assert "early exits" in stderr and "agreement" in stderr  # the summary's table (stdout holds the JSON alone)
    manifest = Bundle.load(tmp_path / "b").manifest
    (layer,) = manifest.splits
    held_out = _build._exit_data(ExitOptions(train_data=str(data)), (3, 32, 32),
                                 _build.load_model(factory, for_board=True))
    train_rows = {row.tobytes() for row in held_out.train.x}
    assert len(held_out.test) == 24 and not any(row.tobytes() in train_rows for row in held_out.test.x)
    # every head has the exit: the int8 one too, and the board's engine runs it
    runner = DeviceRunner(Bundle.load(tmp_path / "b"), threads=1, precision=INT8)
    pixels = np.random.default_rng(0).uniform(0, 255, (2, 3, 32, 32)).astype(np.float32)
    (cut, logits), _ = runner.run_head_exit(layer.id, pixels)
    assert cut.shape == (2, *layer.tensor.shape) and logits.shape == (2, 3)
    for artifact in layer.artifacts:
        if artifact.role == HEAD:
            assert [o.name for o in onnx.load(tmp_path / "b" / artifact.path).graph.output] == [CUT, Exit.OUTPUT]
    assert {(a.format, a.precision) for a in layer.artifacts if a.role == HEAD} == {(ONNX, FLOAT32), (ONNX, INT8)}
    assert json.loads((tmp_path / "b" / MANIFEST_NAME).read_text())["schema_version"] == 4


@pytest.mark.parametrize(("flags", "message"), [
    (["--splits", "_13", "--chain", "_6,_13", "--exits", "--train-data", "fashion-mnist"],
     "--exits and --chain together: an exit is trained at a layer split's cut; export the chain split in a build "
     "without --exits"),
    (["--splits", "_13", "--semantic", "3", "--train-data", "fashion-mnist", "--exits"],
     "--exits and --semantic together"),
    (["--splits", "_13", "--bottleneck", "ae", "--train-data", "fashion-mnist", "--exits"],
     "--exits and --bottleneck together"),
    (["--splits", "_13", "--exits"], "--exits needs --train-data to train the exits on"),
    (["--chain", "_6,_13", "--exits", "--train-data", "fashion-mnist"], "--exits and --chain together"),
    (["--splits", "_13", "--exit-kind", "conv"], "--exit-kind conv chooses the exit --exits trains: give --exits"),
    (["--splits", "_18", "--exits", "--exit-kind", "conv", "--train-data", "fashion-mnist"],
     "--exit-kind conv convolves a (C, H, W) cut; this cut's shape is [576]: use --exit-kind pool_linear"),
])
def test_flags_that_cannot_go_with_exits_are_refused_in_one_line(flags: list[str], message: str,
                                                                  tmp_path: Path) -> None:
    status, _, stderr = _main("build", "exporter.zoo:fmnist_vgg", "--input-shape", "1,28,28", *flags,
                              "--out", str(tmp_path / "b"))
    assert status == 2
    (line,) = stderr.strip().splitlines()
    assert line.startswith("split-export: error: ") and message in line
    assert not (tmp_path / "b").exists()


def test_the_command_line_and_the_library_agree_on_the_exits_defaults() -> None:
    assert EXIT_KINDS == Exit.KINDS and EXIT_KIND == DEFAULT_KIND and EXIT_EPOCHS == EPOCHS
    # the default convolves a (C, H, W) cut and pools a flat one; a kind asked for is what is trained
    assert (kind_for(None, (32, 7, 7)), kind_for(None, (128,)), kind_for("pool_linear", (32, 7, 7))) == (
        DEFAULT_KIND, "pool_linear", "pool_linear")


def test_a_tflite_head_carries_the_exit_and_the_board_reads_both_outputs(tmp_path: Path) -> None:
    """LiteRT: the head with its exit converts with two named outputs (cut, exit_logits); the
    board's interpreter gives the cut from ``run`` and both from ``run_outputs``, at batch 1 and 3,
    each within the validator's tolerance of torch's."""
    from device_runtime.engine import LiteRTBackend
    from exporter._exits import WithExit, make_exit
    from exporter._tflite_export import export_tflite

    torch.manual_seed(0)
    head = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), torch.nn.ReLU()).eval()
    exit_module = make_exit("conv", (8, 8, 8), 5)
    exit_module.block[1].running_mean.uniform_(-0.5, 0.5)  # batch norm as a trained one folds it, not the identity
    exit_module.eval()
    export_tflite(WithExit(head, exit_module), HEAD, torch.zeros(1, 3, 16, 16), tmp_path / "head.tflite",
                  outputs=(CUT, Exit.OUTPUT))
    backend = LiteRTBackend(tmp_path / "head.tflite", threads=1)
    assert (backend.input_name, backend.output_names) == ("input", (CUT, Exit.OUTPUT))
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 16, 16), dtype=np.float32)
        with torch.no_grad():
            cut_torch = head(torch.from_numpy(x))
            want = (cut_torch.numpy(), exit_module(cut_torch).numpy())
        got = backend.run_outputs(x, (CUT, Exit.OUTPUT))
        assert np.array_equal(backend.run(x), got[0])
        for g, w in zip(got, want):
            assert g.shape == w.shape and np.abs(g - w).max() <= max(RTOL * w.std(), 1e-5 * np.abs(w).max())
