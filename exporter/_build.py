"""Build a bundle: the full model and a head and tail per split (a head and stages per chain, a
head and fragments per semantic split), each validated, then the manifest.

Nothing is written to the manifest that has not been checked: the full ONNX model must
reproduce the torch model, every head must reproduce the torch head, and every head
followed by its tail (or by a chain's stages, one after the other) must reproduce the full
torch model (a semantic split's head and fragments, merged, its torch semantic model), at batch
1 and batch 3 from the same files (so the dynamic batch axis is exercised too). A failed build
leaves the output directory as it was: the bundle is written beside it and moved into place
only when whole.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import os
import shutil
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator, Literal, Sequence

import numpy as np
import torch
from tqdm import tqdm

from boards import BOARDS, check_fits
from device_runtime import (
    Artifact, Exit, FULL, Fragment, HEAD, Manifest, ModelInfo, Preprocess, Quantization, Split, Stage, TAIL, TensorSpec,
    artifacts_of, check_name, make_artifact, semantic_id, write_manifest,
)
from device_runtime.bundle import (
    BOTTLENECK, CHAIN, CHAIN_JOIN, CUT, FLOAT32, FORMATS, INT8, IO_NAMES, LAYER, MIDDLE_STAGE_IO, ONNX, SEMANTIC,
    TFLITE,
)
from exporter._bottleneck import BottleneckOptions, SplitModel, make_autoencoder, train_bottleneck
from exporter._codings import Curve, SplitCurve, calibrate, check_bits, coded, write_curve
from exporter._datasets import ImageSet, TrainTest, hold_out, load_images, photos, train_test, training_spec
from exporter._exits import ExitOptions, ExitReport, WithExit, make_exit, measure_exit, parameters as exit_parameters
from exporter._exits import kind_for, train_exit, write_exits
from exporter._fast_agreement import MAX_PHOTOS, with_agreement
from exporter._fold import Folded, normalise, pixels
from exporter._graph import CutPoint, TracedModel, find_cut_points, get_chain, get_cut_point, split_at, split_chain, trace
from exporter._models import LoadedModel, load_model, read_labels
from exporter._measure import Link, top1, uint8_round_trip
from exporter._preprocessing import PreprocessFlags
from exporter._onnx_export import export_onnx, onnx_bytes
from exporter._quantize import calibration_sets, cut_quantization, quantize_onnx
from exporter._rate import KBitQuantizer
from exporter._semantic import (
    Merged, SemanticOptions, SemanticParts, check_fragment_count, default_cut, make_semantic, parameters,
)
from exporter._tflite_export import export_tflite
from exporter._train import accuracy
from exporter._validate import (
    RTOL, Agreement, Case, Chain, Emitted, Handing, OnnxRunner, Only, Runner, TfliteRunner, check_sizes, torch_cases, validate,
)
from splitedge.errors import (
    BackendError, BoardFitError, CutPointError, ExportError, ModelSpecError, ValidationError,
)
from splitedge.lifecycle import signals_held

__all__ = ["VALIDATION_BATCHES", "BuildSpec", "build_bundle", "check_board", "select_splits", "staged"]

log = logging.getLogger("splitedge.export")

VALIDATION_BATCHES = (1, 3)
FULL_PATH = "full/model.onnx"
FULL_TFLITE_PATH = "full/model.tflite"
BOTTLENECK_SUFFIX = "_ae"  # a bottleneck split's id: the cut's id and this
LAYOUTS = {1: "NC", 2: "NCW", 3: "NCHW", 4: "NCDHW"}


def select_splits(cuts: Sequence[CutPoint], splits: Literal["auto"] | Sequence[str]) -> list[CutPoint]:
    """The cut points to export, in graph order, without duplicates.

    ``"auto"`` keeps the compressive natural bottlenecks, the only cuts DSC (Eq. 1-3)
    shows can be optimal: a later cut with no smaller tensor only moves work to the board.
    """
    if splits == "auto":
        chosen = [c for c in cuts if c.compressive]
        if not chosen:
            raise CutPointError(
                "the model has no natural bottleneck (no cut tensor smaller than the input); "
                "name the splits to export by id (see `split-export points`)"
            )
        return chosen
    return sorted({get_cut_point(cuts, s) for s in splits}, key=lambda c: c.position)


@dataclass(frozen=True)
class BuildSpec:
    """What a bundle is built from: the model, its cuts and the variants to export, as
    ``split-export build``'s flags say it. Defaults are the flags' defaults."""

    model: str  # torchvision:NAME or package.module:factory
    weights: str | Path | None = None
    splits: Literal["auto"] | Sequence[str] = "auto"
    labels: str | Path | None = None
    input_shape: tuple[int, ...] | None = None  # per sample; None: the model's own (its weights' crop)
    seed: int = 0
    board: str | None = None
    bottleneck: BottleneckOptions | None = None
    formats: Sequence[str] = (ONNX,)
    quantize_from: str | None = None
    calibration_samples: int = 64
    test_data: str | None = None
    preprocessing: PreprocessFlags | None = None
    chains: Sequence[Sequence[str]] = ()
    semantic: SemanticOptions | None = None
    fold: bool = True  # the normalisation folded into heads and full model: they take pixels (exporter._fold)
    output: str | None = None  # a model of several outputs: the one the bundle answers with (index or key)
    cut_bits: Sequence[int] = ()  # k-bit cut codings to calibrate and measure per split (CUT_BITS; issue 47)
    calib_data: str | None = None  # what cut_bits calibrates on without quantize_from (which serves both)
    exits: ExitOptions | None = None  # an early exit at every layer split, trained and calibrated (issue 48)


def build_bundle(spec: BuildSpec, out_dir: str | Path = "bundle", progress: bool = True) -> Manifest:
    """Export, validate and describe ``spec.model`` cut at ``spec.splits`` into the bundle ``out_dir``.

    ``input_shape`` is per sample and defaults to the model's own (its weights' crop size).
    Random validation inputs come from ``seed`` so that a failure can be reproduced.
    With ``bottleneck``, each split is an I-SPLIT autoencoder injected after the cut and
    trained (see :mod:`exporter._bottleneck`); the manifest records the full model's and each
    split model's measured test accuracy. With ``board`` (a :data:`boards.BOARDS` id), every split's head together with the full
    model (a device keeps both loaded, to fall back) must fit that board's memory, or no
    manifest is written. ``formats`` adds ``tflite`` heads and full model beside the ONNX
    ones (tails stay ONNX: they run on the host); each is validated like the ONNX files.
    With ``quantize_from`` (a data spec), each split also gets int8 heads (and the full model
    an int8 twin), in every format, and uint8 parameters for its cut tensor, calibrated on
    ``calibration_samples`` of those images. With ``test_data`` (or a bottleneck's test data)
    the top-1 accuracy of every full-model variant and of every head variant (with its
    link: uint8 for int8 heads) is measured and recorded; an int8 build without either holds
    some calibration images out and measures on them (agreement with the float32 model where
    they carry no labels of the model's), so every int8 bundle says what int8 costs, and a
    board's ``--precision auto`` can weigh it. ``model.accuracy_on`` says what was measured.
    Each of ``chains`` (two cut ids or more, in graph order) is one split of kind ``chain``
    after the layer splits: the board's head up to its first cut, as a layer split's (in every
    variant), then one stage per cut for the hosts (float32 ONNX), head and stages in a row
    validated against the model and measured as a layer split is.
    With ``semantic``, one split of kind ``semantic`` comes last (:mod:`exporter._semantic`): the
    board's head up to its cut, as a layer split's (in every variant), then K fragments trained on
    its training data, validated merged against the torch semantic model; its ``accuracies``
    (full, layer, semantic) are measured on the same test images, which the bundle's others use too.
    With ``cut_bits``, every split's cut gets a k-bit coding per width (:mod:`exporter._codings`),
    calibrated on ``calibration_samples`` images of ``quantize_from`` (else ``calib_data``), each with
    its bytes per sample and its top-1 or agreement measured as int8's is (held-out images without
    test data), beside float32's and uint8's in ``report/codings.json`` and ``codings.png``.
    With ``exits``, every layer split's heads get an early exit as a second output
    (:mod:`exporter._exits`), trained on ``exits.train_data`` with the network frozen, validated
    against torch, and its table of thresholds measured on held-out images (``exits.test_data``, else
    Fashion-MNIST's test split or a fifth of the training data held out): in the manifest
    (:class:`device_runtime.Exit`) and in ``report/exits.json`` and ``exits.png``.
    The bundle is built beside ``out_dir`` and replaces it only once it is whole (:func:`staged`).
    """
    model_spec, weights, splits, labels, input_shape, seed = (
        spec.model, spec.weights, spec.splits, spec.labels, spec.input_shape, spec.seed)
    board, bottleneck, formats, quantize_from, calibration_samples = (
        spec.board, spec.bottleneck, spec.formats, spec.quantize_from, spec.calibration_samples)
    test_data, preprocessing, chains, semantic = spec.test_data, spec.preprocessing, spec.chains, spec.semantic
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown or ONNX not in formats:
        raise ExportError(f"formats {list(formats)}: ONNX is always written, and the others are {FORMATS[1:]}")
    tflite = TFLITE in formats
    if bottleneck is not None and bottleneck.bits is not None:
        # The learned rate term trains for the wire's k-bit coding; the build calibrates and measures
        # that coding like every other (--bottleneck-bits K adds K to --cut-bits).
        check_bits([bottleneck.bits])
        cut_bits = check_bits([*spec.cut_bits, bottleneck.bits])
    else:
        cut_bits = check_bits(spec.cut_bits)
    calibrate_on = quantize_from or (spec.calib_data if cut_bits else None)
    if cut_bits and calibrate_on is None:
        raise ExportError("cut codings are calibrated on images: give --calib-data (or --train-data) with --cut-bits")
    loaded = load_model(model_spec, weights, preprocessing, input_shape, for_board=True, output=spec.output)
    # The name becomes the bundle id, which names the release directory on every board: refused now,
    # not after minutes of export (write_manifest would refuse it too).
    check_name(loaded.name, f"{model_spec}: model name", "name the factory with letters, digits, '_', '.' and '-'")
    shape = loaded.input_shape
    traced = trace(loaded.module, shape)
    cut_points = find_cut_points(traced)
    chosen = select_splits(cut_points, splits)
    chained = list({CHAIN_JOIN.join(ids): get_chain(cut_points, ids) for ids in chains}.values())
    if chained and bottleneck is not None:
        raise ExportError("--bottleneck and --chain together: an autoencoder is trained at a layer split's cut; "
                          "export chains in a build without --bottleneck")
    exits = spec.exits
    if exits is not None:
        for given, flag in ((chained, "--chain"), (semantic, "--semantic"), (bottleneck, "--bottleneck")):
            if given:
                raise ExportError(f"--exits and {flag} together: an exit is trained at a layer split's cut; "
                                  f"export the {flag.lstrip('-')} split in a build without --exits")
        if not chosen:
            raise ExportError("--exits adds an exit at each layer split: give --splits (auto or cut ids)")
        with torch.no_grad():
            classes = int(traced.module(torch.zeros((1, *shape))).shape[-1])
        for cut in chosen:  # a kind the cut cannot take is refused before anything is trained
            make_exit(kind_for(exits.kind, cut.shape), cut.shape, classes)
    if semantic is not None:
        if bottleneck is not None:
            raise ExportError("--bottleneck and --semantic together: export the semantic split in a build "
                              "without --bottleneck")
        semantic = replace(semantic, cut=(default_cut(cut_points) if semantic.cut is None
                                          else get_cut_point(cut_points, semantic.cut)).id)
        with torch.no_grad():
            check_fragment_count(semantic.fragments, int(traced.module(torch.zeros((1, *shape))).shape[-1]))
    # Everything that can refuse the data is read before the first file is written.
    calibration = None
    if calibrate_on is not None:
        images = load_images(calibrate_on, shape, loaded.preprocess, loaded.categories, labelled=False)
        needed_by = " and ".join(["int8"] * (quantize_from is not None) + ["--cut-bits"] * bool(cut_bits))
        calibration = calibration_sets(images, calibration_samples, test_data is None and bottleneck is None, seed,
                                       needed_by)
        if bottleneck is not None and bottleneck.bits is not None:  # trained on what the build will fit on
            bottleneck = replace(bottleneck, calibration_samples=len(calibration.calibration))
    test = load_images(test_data, shape, loaded.preprocess, loaded.categories) if test_data and not bottleneck else None
    semantic_parts = None
    if semantic is not None:
        data = train_test(semantic.train_data, semantic.test_data or test_data, shape, loaded.preprocess,
                          loaded.categories, seed=seed)
        test = data.test if test is None else test
        semantic_parts = make_semantic(traced, cut_points, semantic, data.train.subset(semantic.train_images, seed),
                                       progress)
    exit_data = _exit_data(exits, shape, loaded) if exits is not None else None
    rng = np.random.default_rng(seed)
    # A camera's frame is RGB: only a model taking it has a normalisation to fold and a fast path to measure.
    camera = len(shape) == 3 and shape[0] == len(loaded.preprocess.mean) == 3
    folded = loaded.preprocess if spec.fold and camera else None
    # A folded artifact takes pixels (0-255); torch takes them normalised (Variants.cases).
    inputs = [rng.uniform(0, 255, (b, *shape)).astype(np.float32) if folded else
              rng.standard_normal((b, *shape), dtype=np.float32) for b in VALIDATION_BATCHES]
    variants = Variants(tflite=tflite, folded=folded)
    if quantize_from is not None and calibration is not None:
        variants = replace(variants, calibration=variants.artifact_view(calibration.calibration))

    with staged(Path(out_dir)) as root:
        # The reference is the original module, not the traced one: this also proves the trace.
        reference = variants.cases(loaded.module, IO_NAMES[FULL], inputs)
        full_module = variants.board_module(traced.module)
        agreement = validate(_export(full_module, FULL, root, FULL_PATH, inputs[0]), reference, RTOL,
                             f"full model {FULL_PATH}")
        full = (make_artifact(root, FULL_PATH, FULL, ONNX, FLOAT32, _errors(agreement)),)
        if tflite:
            full += _optional_tflite(root, FULL_TFLITE_PATH, lambda: _export_tflite(
                full_module, FULL, root, FULL_TFLITE_PATH, inputs, reference))
        if variants.calibration is not None:
            full += _int8_full(full_module, root, inputs[0], variants.calibration, tflite)
        board_preprocess = replace(loaded.preprocess, folded=folded is not None)
        if camera:
            source = quantize_from or test_data
            board_preprocess = with_agreement(board_preprocess, OnnxRunner(root / FULL_PATH),
                                              photos(source, MAX_PHOTOS) if source else [], source)
        # A layer split is cut at one point, a chain at several (no chain with a bottleneck: refused above).
        cuts = tqdm([*([cut] for cut in chosen), *chained], desc=f"exporting {loaded.name} splits", unit="split",
                    disable=not progress)
        model_accuracy = None
        if bottleneck is None:
            split_entries = [
                _export_split(traced, at, root, inputs, reference, variants, exits, exit_data, progress) if len(at) == 1
                else _export_chain(traced, at, root, inputs, reference, variants)
                for at in cuts
            ]
        else:
            data = train_test(bottleneck.train_data, bottleneck.test_data, shape, loaded.preprocess, loaded.categories,
                              seed=seed)
            data = TrainTest(data.train.subset(bottleneck.train_images, seed), data.test)
            model_accuracy = accuracy(loaded.module, data.test)
            split_entries = [
                _export_bottleneck_split(loaded, traced, cut, bottleneck, data, root, inputs, progress, variants)
                for (cut,) in cuts
            ]
            test = data.test
        if semantic_parts is not None:
            split_entries.append(_export_semantic(semantic_parts, root, inputs, variants))
        if test is not None:
            test = variants.artifact_images(test)
        if test is None and calibration is not None and calibration.held_out is not None:
            test = _held_out_test(variants.artifact_images(calibration.held_out), OnnxRunner(root / FULL_PATH))
        accuracy_on = None
        if test is not None:
            if test.labelled and model_accuracy is None:
                model_accuracy = top1(OnnxRunner(root / FULL_PATH), test)
            split_entries = [_measure_variants(split, root, test) for split in split_entries]
            if semantic_parts is not None and test.labelled:
                split_entries[-1] = _with_accuracies(split_entries[-1], semantic_parts, root, test, model_accuracy)
            full = tuple(replace(a, accuracy=top1(_runner(root, a), test)) for a in full)
            accuracy_on = _described(test)
        exit_report = None
        if exit_data is not None:
            exit_test = variants.artifact_images(exit_data.test)
            split_entries = [_with_exit_table(split, root, exit_test) for split in split_entries]
            words = ("labelled: top-1 beside agreement with the float32 ONNX model" if exit_test.labelled else
                     "no labels of the model's: agreement with the float32 ONNX model only")
            exit_report = ExitReport(loaded.name, f"{len(exit_test)} held-out images of {exit_test.source} ({words})",
                                     tuple((s.id, s.exit) for s in split_entries if s.exit is not None))
        curve = None
        if cut_bits:  # calibration images, so a test set: --test-data, a bottleneck's, or held out of them
            assert calibration is not None and test is not None and accuracy_on is not None
            split_entries, curves = _with_codings(split_entries, root, variants.artifact_view(calibration.calibration),
                                                  cut_bits, test, progress)
            curve = Curve(loaded.name, "top1" if test.labelled else "agreement", accuracy_on, curves)
        output_shape = tuple(next(iter(reference[0].expected.values())).shape[1:])
        manifest = Manifest(
            model=ModelInfo(
                name=loaded.name,
                input_shape=shape,
                input_dtype=FLOAT32,
                layout=LAYOUTS.get(len(shape), "N" + "?" * len(shape)),
                output_shape=output_shape,
                preprocess=board_preprocess,
                labels=_labels(loaded, output_shape, labels),
                accuracy=model_accuracy,
                accuracy_on=accuracy_on,
                output=loaded.output,
            ),
            full=full,
            splits=tuple(split_entries),
        )
        if board is not None:
            check_board(board, manifest)
        if curve is not None:
            write_curve(curve, root)
        if exit_report is not None:
            write_exits(exit_report, root)
        return write_manifest(root, manifest)


@contextlib.contextmanager
def staged(out_dir: Path) -> Iterator[Path]:
    """A directory beside ``out_dir`` to build in, put in its place only once the build succeeds.

    A build that fails (a validation, a refused board, Ctrl-C, SIGTERM: see
    :func:`splitedge.exit_on_signals`) leaves ``out_dir`` as it was, the last good bundle included,
    and nothing half written; one that succeeds replaces it whole. A signal never cuts the removal
    of the staging directory or the swap in two (:func:`splitedge.signals_held`): a second Ctrl-C
    while a 100 MB staging directory is removed would leave it behind.
    """
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        yield staging
    except BaseException:
        with signals_held():
            shutil.rmtree(staging, ignore_errors=True)
        raise
    old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
    with signals_held():
        if out_dir.exists():
            out_dir.rename(old)
        staging.rename(out_dir)
        shutil.rmtree(old, ignore_errors=True)


def _held_out_test(held_out: ImageSet | None, full_model: Runner) -> ImageSet | None:
    """The held-out calibration images as a test set: with their labels where they are the
    model's, else labelled by the float32 model, so that accuracy reads as agreement with it."""
    if held_out is None or held_out.labelled:
        return held_out
    (input_name,), (output_name,) = full_model.input_names, full_model.output_names
    predicted = np.concatenate([full_model({input_name: held_out.x[i : i + 256]})[output_name].argmax(1)
                                for i in range(0, len(held_out), 256)])
    return ImageSet(held_out.x, predicted.astype(np.int64), held_out.classes, held_out.source, labelled=False)


def _described(test: ImageSet) -> str:
    """What the manifest's accuracies mean, in words: the data, and labels or agreement."""
    if test.labelled:
        return f"top-1 on {len(test)} labelled images of {test.source}"
    return (f"top-1 agreement with the float32 ONNX model on {len(test)} unlabelled images of {test.source} "
            "(no labels: give --test-data to measure accuracy)")


def check_board(board_id: str, manifest: Manifest) -> None:
    """Refuse a bundle whose head and full model, loaded together, would not fit the board."""
    if board_id not in BOARDS:
        raise BoardFitError(f"unknown board {board_id!r}; boards: {', '.join(sorted(BOARDS))}")
    full = {a.path: a.bytes for a in manifest.full if a.role == FULL}
    for split in manifest.splits:
        heads = {a.path: a.bytes for a in split.artifacts if a.role == HEAD}
        check_fits(BOARDS[board_id], {**heads, **full})


@dataclass(frozen=True)
class Variants:
    """Which variants of each head to write beside the float32 ONNX one, and what every artifact
    the board runs takes: pixels, the normalisation folded in (``folded``: the model's preprocessing),
    or torch's normalised input (None)."""

    tflite: bool = False
    calibration: np.ndarray | None = None  # images (as artifacts take them) for int8 heads and the uint8 link
    folded: Preprocess | None = None

    def board_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """What is exported of a head or full model: ``module``, with the normalisation where folded."""
        return module if self.folded is None else Folded(module, self.folded)

    def cases(self, module: torch.nn.Module, names: tuple[str, str], inputs: list[np.ndarray]) -> list[Case]:
        """Torch's reference for an artifact taking ``inputs``: where folded, the normalisation is
        applied outside the torch module (:func:`exporter._validate.torch_cases`)."""
        spec = self.folded
        return torch_cases(module, names, inputs, None if spec is None else lambda x: normalise(x, spec))

    def artifact_view(self, x: np.ndarray) -> np.ndarray:
        """Normalised images (torch's view, as data sets load) as the board's artifacts take them."""
        return x if self.folded is None else pixels(x, self.folded)

    def artifact_images(self, images: ImageSet) -> ImageSet:
        """:meth:`artifact_view` of a whole image set, labels kept."""
        return replace(images, x=self.artifact_view(images.x))


def _export_parts(
    head: torch.nn.Module, hosts: Sequence[tuple[torch.nn.Module, str]], name: str, root: Path,
    inputs: list[np.ndarray], reference: list[Case], variants: Variants, sent: Sequence[TensorSpec],
    groups: Sequence[Sequence[int]] | None = None, exit_module: torch.nn.Module | None = None,
) -> tuple[tuple[Artifact, ...], tuple[Artifact, ...], Quantization | None, tuple[float, float | None] | None]:
    """Export and validate a head (in every variant asked for) and what the hosts run after it, in
    a row (``(module, path)``: a tail, or a chain's stages) or, with ``groups``, side by side (a
    semantic split's fragments, one per group of classes, merged into label order); head and hosts
    together must reproduce ``reference``, and what every head variant and middle stage emits must
    be what the manifest records as crossing each link (``sent``: the head's output, then each
    middle stage's). Returns the head's artifacts (float32 ONNX first), the hosts' (one each, in
    order) and the uint8 link's parameters. With ``exit_module``, every head has it as its second
    output (issue 48), validated against torch apart from the cut (each against its own spread), and
    the largest of its errors over the float32 heads is returned last (else None)."""
    head_path = f"head/{name}.onnx"
    head_cases = variants.cases(head, IO_NAMES[HEAD], inputs)
    outputs = (CUT,) if exit_module is None else (CUT, Exit.OUTPUT)
    exit_cases = ([] if exit_module is None else
                  variants.cases(torch.nn.Sequential(head, exit_module), (IO_NAMES[HEAD][0], Exit.OUTPUT), inputs))
    board_head = variants.board_module(head if exit_module is None else WithExit(head, exit_module))
    head_runner = Handing(_export(board_head, HEAD, root, head_path, inputs[0], (IO_NAMES[HEAD][0], *outputs)))
    head_agreement = validate(Only(head_runner, (CUT,)), head_cases, RTOL, f"head {head_path}")
    exit_agreements = [] if exit_module is None else [
        validate(Only(head_runner, (Exit.OUTPUT,)), exit_cases, RTOL, f"the exit of head {head_path}")]
    check_sizes(f"split {name}", sent[0], f"head {head_path}", head_runner.emitted)
    # Each host part is traced on the torch output before it; what they must reproduce is the whole model.
    example = head_cases[0].expected[IO_NAMES[HEAD][1]]
    host_runners = []
    if groups is not None:  # fragments: each from the cut, merged as the board merges them
        host = Merged([_export(module, TAIL, root, path, example) for module, path in hosts], groups)
        followed_by = f"fragments {', '.join(path for _, path in hosts)}, merged"
    else:
        for module, path in hosts[:-1]:  # a chain's middle stages: from one cut to the next
            host_runners.append(Handing(_export(module, TAIL, root, path, example, MIDDLE_STAGE_IO)))
            with torch.no_grad():
                example = module(torch.from_numpy(example)).numpy()
        tail, tail_path = hosts[-1]
        host_runners.append(_export(tail, TAIL, root, tail_path, example))
        host = Chain(*host_runners)
        followed_by = ", then ".join(f"{'tail' if len(hosts) == 1 else 'stage'} {path}" for _, path in hosts)
    together = validate(Chain(head_runner, host), reference, RTOL, f"head {head_path} followed by {followed_by}")
    for k, (stage, (_, path)) in enumerate(zip(host_runners[:-1], hosts), 2):  # stage k takes stage k-1's output
        check_sizes(f"split {name}, stage {k}'s input", sent[k - 1], f"stage {path}", stage.emitted)
    artifacts = (make_artifact(root, head_path, HEAD, ONNX, FLOAT32, _errors(head_agreement)),)
    host_artifacts = tuple(make_artifact(root, path, TAIL, ONNX, FLOAT32, _errors(together)) for _, path in hosts)
    if variants.tflite:
        tflite_path = f"head/{name}.tflite"

        def tflite_head() -> Artifact:
            artifact = _export_tflite(board_head, HEAD, root, tflite_path, inputs, head_cases, outputs)
            tflite_runner = Handing(TfliteRunner(root / tflite_path))
            if exit_module is not None:
                exit_agreements.append(validate(Only(tflite_runner, (Exit.OUTPUT,)), exit_cases, RTOL,
                                                f"the exit of head {tflite_path}"))
            validate(Chain(tflite_runner, host), reference, RTOL, f"head {tflite_path} followed by {followed_by}")
            check_sizes(f"split {name}", sent[0], f"head {tflite_path}", tflite_runner.emitted)
            return artifact
        artifacts += _optional_tflite(root, tflite_path, tflite_head)
    exit_errors = None
    if exit_agreements:
        worst = max(exit_agreements, key=lambda a: a.max_rel)
        exit_errors = _errors(replace(worst, max_abs=max(a.max_abs for a in exit_agreements)))
    if variants.calibration is None:
        return artifacts, host_artifacts, None, exit_errors
    # int8 heads are not held to RTOL: their accuracy is measured instead (tests, --test-data).
    samples = variants.calibration
    int8_path = f"head/{name}.int8.onnx"
    quantize_onnx(root / head_path, root / int8_path, samples)
    check_sizes(f"split {name}", sent[0], f"head {int8_path}", _emitted(OnnxRunner(root / int8_path), inputs))
    artifacts += (make_artifact(root, int8_path, HEAD, ONNX, INT8),)
    if variants.tflite:
        int8_tflite = f"head/{name}.int8.tflite"

        def int8_tflite_head() -> Artifact:
            export_tflite(board_head, HEAD, torch.from_numpy(inputs[0]), root / int8_tflite, INT8, calibration=samples,
                          outputs=outputs)
            check_sizes(f"split {name}", sent[0], f"head {int8_tflite}",
                        _emitted(TfliteRunner(root / int8_tflite), inputs))
            return make_artifact(root, int8_tflite, HEAD, TFLITE, INT8)
        artifacts += _optional_tflite(root, int8_tflite, int8_tflite_head)
    return artifacts, host_artifacts, cut_quantization(root / head_path, samples), exit_errors


def _emitted(runner: Runner, inputs: list[np.ndarray]) -> list[Emitted]:
    """What ``runner`` emits at each of ``inputs``: an int8 head is held to no torch reference, yet
    what it sends crosses the link as the float32 head's does."""
    handing = Handing(runner)
    for x in inputs:
        handing({runner.input_names[0]: x})
    return handing.emitted


def _export_halves(
    head: torch.nn.Module, tail: torch.nn.Module, name: str, root: Path, inputs: list[np.ndarray], reference: list[Case],
    variants: Variants, sent: TensorSpec, exit_module: torch.nn.Module | None = None,
) -> tuple[tuple[Artifact, ...], Quantization | None, tuple[float, float | None] | None]:
    """A head (with ``exit_module`` as its second output) and its tail (:func:`_export_parts`), as a
    layer or bottleneck split lists them: the float32 ONNX head, the tail, then the head's other
    variants; and the exit's largest errors against torch."""
    heads, (tail_artifact,), quantization, exit_errors = _export_parts(
        head, [(tail, f"tail/{name}.onnx")], name, root, inputs, reference, variants, [sent], exit_module=exit_module)
    return (heads[0], tail_artifact, *heads[1:]), quantization, exit_errors


def _int8_full(
    module: torch.nn.Module, root: Path, example: np.ndarray, calibration: np.ndarray, tflite: bool
) -> tuple[Artifact, ...]:
    """int8 twins of the full model, for a board that runs locally (fallback, slow links)."""
    int8_path = FULL_PATH.replace(".onnx", ".int8.onnx")
    quantize_onnx(root / FULL_PATH, root / int8_path, calibration)
    artifacts = (make_artifact(root, int8_path, FULL, ONNX, INT8),)
    if tflite:
        int8_tflite = FULL_TFLITE_PATH.replace(".tflite", ".int8.tflite")

        def int8_tflite_full() -> Artifact:
            export_tflite(module, FULL, torch.from_numpy(example), root / int8_tflite, INT8, calibration=calibration)
            return make_artifact(root, int8_tflite, FULL, TFLITE, INT8)
        artifacts += _optional_tflite(root, int8_tflite, int8_tflite_full)
    return artifacts


def _errors(agreement: Agreement) -> tuple[float, float | None]:
    """An artifact's recorded errors: absolute, and relative to the spread of torch's outputs (None
    where they do not vary: vit_b_16's zero-initialised head answers 0 to everything, and then no
    comparison of outputs can tell a wrong artifact; the summary says so)."""
    return agreement.max_abs, agreement.max_rel if agreement.spread > 0 else None


def _optional_tflite(root: Path, relpath: str, make: Callable[[], Artifact]) -> tuple[Artifact, ...]:
    """``make()``'s TFLite artifact, or none: an op LiteRT lacks, or a conversion that does not
    reproduce torch, leaves that one file out (one line on stderr naming why) and the bundle is
    written without it; the board runs the ONNX artifact of the same part."""
    try:
        return (make(),)
    except (ExportError, ValidationError, BackendError) as exc:  # BackendError: the interpreter cannot load it
        (root / relpath).unlink(missing_ok=True)
        reason = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        log.debug("%s left out: the whole error", relpath, exc_info=exc)  # what --debug shows
        print(f"note: {relpath} left out of the bundle: {reason}", file=sys.stderr, flush=True)
        return ()


def _export_tflite(
    module: torch.nn.Module, role: str, root: Path, relpath: str, inputs: list[np.ndarray], cases: list[Case],
    outputs: tuple[str, ...] | None = None,
) -> Artifact:
    """A float32 TFLite twin of an ONNX artifact, held to the same tolerance against torch (``cases``:
    its first output's; ``outputs``: a head with an early exit's names, the exit validated apart)."""
    export_tflite(module, role, torch.from_numpy(inputs[0]), root / relpath, outputs=outputs)
    runner = TfliteRunner(root / relpath)
    agreement = validate(Only(runner, tuple(cases[0].expected)), cases, RTOL, f"{role} {relpath}")
    return make_artifact(root, relpath, role, TFLITE, FLOAT32, _errors(agreement))


def _export_split(
    traced: TracedModel, at: Sequence[CutPoint], root: Path, inputs: list[np.ndarray], reference: list[Case],
    variants: Variants, exits: ExitOptions | None = None, exit_data: TrainTest | None = None, progress: bool = False,
) -> Split:
    """A layer split at the one cut of ``at``; with ``exits``, its early exit trained on ``exit_data``'s
    training images and exported in every head (its table is measured later: :func:`_with_exit_table`)."""
    (cut,) = at
    head, tail = split_at(traced, cut.id)
    sent = _sent_at(cut)
    exit_module = None
    if exits is not None and exit_data is not None:
        exit_module = train_exit(head, tail, cut.shape, exits, exit_data.train, progress)
    artifacts, quantization, exit_errors = _export_halves(head, tail, cut.id, root, inputs, reference, variants,
                                                          sent["tensor"], exit_module)
    exit_entry = None
    if exit_module is not None and exits is not None:
        max_abs, max_rel = exit_errors or (None, None)
        exit_entry = Exit(output=Exit.OUTPUT, kind=kind_for(exits.kind, cut.shape), params=exit_parameters(exit_module),
                          measured_on=0, thresholds=(), max_abs_error=max_abs,
                          max_rel_error=max_rel)  # the table is measured once everything is exported
    return Split(id=cut.id, kind=LAYER, artifacts=artifacts, quantization=quantization, exit=exit_entry, **sent)


def _exit_data(options: ExitOptions, shape: tuple[int, ...], loaded: LoadedModel) -> TrainTest:
    """The exits' training images and the held-out images their tables are measured on (torch's view):
    ``options.test_data``, else Fashion-MNIST's test split, else a fifth of the training data held
    out, never trained on. Labels count where the data has the model's (else the full model teaches)."""
    train_spec = training_spec(options.train_data)
    train = load_images(train_spec, shape, loaded.preprocess, loaded.categories, labelled=False)
    test_spec = options.test_data or ("fashion-mnist:test" if train_spec.startswith("fashion-mnist") else None)
    if test_spec is not None:
        test = load_images(test_spec, shape, loaded.preprocess, loaded.categories, labelled=False)
    else:
        train, test = hold_out(train, max(1, round(0.2 * len(train))), options.seed)
    return TrainTest(train.subset(options.train_images, options.seed), test)


def _with_exit_table(split: Split, root: Path, test: ImageSet) -> Split:
    """``split`` with its exit's table measured on ``test`` (as the artifacts take them): its float32
    ONNX head's exit output against the bundle's float32 ONNX full model (:func:`exporter._exits.measure_exit`)."""
    if split.exit is None:
        return split
    thresholds = measure_exit(OnnxRunner(root / _float_head(split).path), OnnxRunner(root / FULL_PATH), test)
    return replace(split, exit=replace(split.exit, thresholds=thresholds, measured_on=len(test)))


def _export_chain(
    traced: TracedModel, cuts: Sequence[CutPoint], root: Path, inputs: list[np.ndarray], reference: list[Case],
    variants: Variants,
) -> Split:
    """A chain: the head up to its first cut (what the board sends is that cut's), then stage k
    from cut k, ``stage/<id>.<k>.onnx``, for the hosts."""
    head, *stages = split_chain(traced, [c.id for c in cuts])
    split_id = CHAIN_JOIN.join(c.id for c in cuts)
    paths = [f"stage/{split_id}.{k}.onnx" for k in range(1, len(stages) + 1)]
    tensors = [_tensor(cut) for cut in cuts]  # stage k's input; stage 1's is what the head sends
    heads, stage_artifacts, quantization, _ = _export_parts(head, list(zip(stages, paths)), split_id, root, inputs,
                                                         reference, variants, tensors)
    return Split(
        id=split_id, kind=CHAIN, artifacts=heads, quantization=quantization, **_sent_at(cuts[0]),
        stages=tuple(Stage(index=k, cut=cut.id, tensor=tensor, artifacts=(artifact,))
                     for k, (cut, tensor, artifact) in enumerate(zip(cuts, tensors, stage_artifacts), 1)),
    )


def _export_semantic(parts: SemanticParts, root: Path, inputs: list[np.ndarray], variants: Variants) -> Split:
    """A semantic split: the head up to its cut (what the board sends is that cut's, in every
    variant a layer split's head has), then fragment k, ``fragment/<id>.<k>.onnx``, for the hosts;
    head and fragments, merged, validated against the torch semantic model."""
    model = parts.model
    split_id = semantic_id(parts.cut.id, len(model.fragments))
    paths = [f"fragment/{split_id}.{k}.onnx" for k in range(1, len(model.fragments) + 1)]
    reference = variants.cases(model, IO_NAMES[FULL], inputs)
    sent = _sent_at(parts.cut)
    heads, fragment_artifacts, quantization, _ = _export_parts(
        model.head, list(zip(model.fragments, paths)), split_id, root, inputs, reference, variants, [sent["tensor"]],
        model.groups)
    fragments = tuple(
        Fragment(index=k, classes=classes, artifacts=(artifact,), params=parameters(module))
        for k, (classes, artifact, module) in enumerate(zip(model.groups, fragment_artifacts, model.fragments), 1)
    )
    return Split(id=split_id, kind=SEMANTIC, artifacts=heads, quantization=quantization, **sent,
                 fragments=fragments, grouping=parts.grouping)


def _with_accuracies(split: Split, parts: SemanticParts, root: Path, test: ImageSet, full: float | None) -> Split:
    """A semantic split's accuracies on the bundle's test images: the full model's, the layer split's
    at the same cut (its float32 head, then the tail, in ONNX) and its own (head, then fragments)."""
    head = _float_head(split)
    example = torch.zeros((1, *split.tensor.shape))
    layer = Chain(OnnxRunner(root / head.path), OnnxRunner(onnx_bytes(parts.tail, TAIL, example)))
    measured = {"layer": top1(layer, test), "semantic": split.accuracy}
    return replace(split, accuracies={**({} if full is None else {"full": full}), **measured})


def _tensor(cut: CutPoint) -> TensorSpec:
    return TensorSpec(shape=cut.shape, dtype=cut.dtype, bytes_per_sample=cut.bytes_per_sample)


def _sent_at(cut: CutPoint) -> dict:
    """A split's fields that describe what the board sends: the tensor at ``cut`` and where it is."""
    return dict(position=cut.position, tensor=_tensor(cut), compression_ratio=cut.compression_ratio,
                natural=cut.natural, compressive=cut.compressive)


def _export_bottleneck_split(
    loaded: LoadedModel, traced: TracedModel, cut: CutPoint, options: BottleneckOptions, data: TrainTest,
    root: Path, inputs: list[np.ndarray], progress: bool, variants: Variants,
) -> Split:
    """I-SPLIT: inject an autoencoder after ``cut``, train it (Eq. 3, then end to end), export
    head + encoder for the board and decoder + tail for the host, and measure the accuracy."""
    # A fresh copy per cut: fine-tuning end to end changes the weights of head and tail.
    head, tail = split_at(trace(copy.deepcopy(loaded.module), traced.input_shape), cut.id)
    # The autoencoder's initial weights from the training's seed, not from whatever the process drew
    # before: two builds of the same seed and data (with and without --bottleneck-bits) start alike.
    torch.manual_seed(options.training.seed)
    model = SplitModel(head, make_autoencoder(cut.shape, options.latent_ratio), tail)
    rate = None if options.bits is None else KBitQuantizer(options.bits, options.calibration_samples)
    teacher = loaded.module if rate is not None or options.distill else None
    train_bottleneck(model, data.train, options.training, progress, rate, teacher)
    latent = model.autoencoder.latent_shape
    latent_bytes = math.prod(latent) * 4
    tensor = TensorSpec(shape=latent, dtype=FLOAT32, bytes_per_sample=latent_bytes)
    split_id = f"{cut.id}{BOTTLENECK_SUFFIX}"
    reference = variants.cases(model, IO_NAMES[FULL], inputs)
    artifacts, quantization, _ = _export_halves(model.board, model.host, split_id, root, inputs, reference, variants,
                                                tensor)
    return Split(
        id=split_id,
        position=cut.position,
        kind=BOTTLENECK,
        tensor=tensor,
        compression_ratio=latent_bytes / traced.input_bytes,
        natural=latent_bytes < traced.input_bytes,
        compressive=cut.compressive,
        artifacts=artifacts,
        quantization=quantization,
        accuracy=accuracy(model, data.test),
    )


def _hosts(split: Split, root: Path) -> Runner:
    """What the hosts run of ``split`` after its head: the tail, a chain's stages in a row, or a
    semantic split's fragments merged."""
    if split.fragments:
        return Merged([OnnxRunner(root / f.artifacts[0].path) for f in split.fragments],
                      [f.classes for f in split.fragments])
    return Chain(*(OnnxRunner(root / a.path) for a in artifacts_of(split) if a.role == TAIL))


def _float_head(split: Split) -> Artifact:
    """The split's float32 ONNX head: validated against torch, the one every split has."""
    return next(a for a in split.artifacts if a.role == HEAD and a.format == ONNX and a.precision == FLOAT32)


def _measure_variants(split: Split, root: Path, test: ImageSet) -> Split:
    """Top-1 of the split model through each head variant (int8 heads with the uint8 link) and
    the host's tail, a chain's stages in a row, or a semantic split's fragments merged."""
    hosts = _hosts(split, root)
    measured = []
    for artifact in split.artifacts:
        if artifact.role != HEAD:
            measured.append(artifact)
            continue
        head = _runner(root, artifact)
        if artifact.precision == INT8 and (q := split.quantization) is not None:
            head = Link(head, uint8_round_trip(q))
        measured.append(replace(artifact, accuracy=top1(Chain(head, hosts), test)))
    float_head = _float_head(replace(split, artifacts=tuple(measured)))
    return replace(split, artifacts=tuple(measured), accuracy=split.accuracy if split.accuracy is not None else float_head.accuracy)


def _with_codings(
    splits: Sequence[Split], root: Path, samples: np.ndarray, bits: tuple[int, ...], test: ImageSet, progress: bool,
) -> tuple[list[Split], tuple[SplitCurve, ...]]:
    """Every split with its k-bit cut codings (``bits``), calibrated on its float32 head's cut over
    ``samples`` (the calibration images as the head takes them) and measured on ``test``; and the
    curve, float32 and uint8 measured beside them (:func:`exporter._codings.coded`)."""
    coded_splits, curves = [], []
    with tqdm(total=len(test) * len(splits), desc="measuring cut codings", unit="image", disable=not progress) as bar:
        for split in splits:
            if split.tensor.dtype != FLOAT32:  # a coding's decode gives float32: an integer cut's tail takes none
                print(f"note: split {split.id} sends {split.tensor.dtype}, not float32: no k-bit codings for it",
                      file=sys.stderr, flush=True)
                coded_splits.append(split)
                bar.update(len(test))
                continue
            head = root / _float_head(split).path
            outputs, codings = calibrate(head, samples, bits, split.tensor.bytes_per_sample)
            with_codings, curve = coded(split, OnnxRunner(head), _hosts(split, root), outputs, codings, test,
                                        bar.update)
            coded_splits.append(with_codings)
            curves.append(curve)
    return coded_splits, tuple(curves)


def _runner(root: Path, artifact: Artifact) -> Runner:
    return OnnxRunner(root / artifact.path) if artifact.format == ONNX else TfliteRunner(root / artifact.path)


def _export(
    module: torch.nn.Module, role: str, root: Path, relpath: str, example: np.ndarray, names: tuple[str, str] | None = None,
) -> OnnxRunner:
    export_onnx(module, role, torch.from_numpy(example), root / relpath, names)
    return OnnxRunner(root / relpath)


def _labels(loaded: LoadedModel, output_shape: tuple[int, ...], labels_file: str | Path | None) -> tuple[str, ...]:
    """An explicit labels file wins; then the weights' categories when the class count fits; then ``class_i``.

    A per-sample output of three dimensions is a dense prediction, (C, H, W) as torch lays it out
    (a segmentation's ``out``): its classes are its channels, not the last (width) dimension."""
    classes = (output_shape[0] if len(output_shape) == 3 else output_shape[-1]) if output_shape else 1
    if labels_file is not None:
        labels = read_labels(labels_file)
        if len(labels) != classes:
            raise ModelSpecError(f"labels file {labels_file} has {len(labels)} labels; the model outputs {classes} classes")
        return labels
    if loaded.categories is not None and len(loaded.categories) == classes:
        return loaded.categories
    return tuple(f"class_{i}" for i in range(classes))
