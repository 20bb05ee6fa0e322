"""``split-export``: a thin command line over :mod:`exporter`'s library functions.

Every :class:`SplitEdgeError` becomes ``split-export: error: <message>`` on a line of its own
on stderr (below any progress bar it interrupted) and exit status 2, as argparse does for usage
errors; Ctrl-C and SIGTERM end any command with one line and exit status 130 or 143, what it was
writing removed (:func:`splitedge.exit_on_signals`); no traceback reaches the user.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import sys
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Sequence

from boards import BOARDS
from device_runtime import Artifact, HEAD, Manifest, TensorSpec, slice_bundle
from device_runtime.bundle import CUT_BITS, FORMATS, INT8, ONNX, PARTS, PRECISIONS
from exporter.deploy import add_deploy_command
from splitedge import Bounds, SettingError, SplitEdgeError, as_flag_type
from splitedge.lifecycle import exit_on_signals

if TYPE_CHECKING:
    from exporter._graph import CutPoint

# The commands that need torch import it when they run: `slice` runs where torch is absent (a deploy).
AE_EPOCHS = 2  # exporter._bottleneck.BottleneckTraining.ae_epochs, checked by tests/exporter/test_cli.py
# exporter._semantic's defaults (FragmentTraining.epochs == AE_EPOCHS, SemanticOptions.width and
# .train_images), checked by tests/exporter/test_semantic.py
SEMANTIC_WIDTH = 0.5
SEMANTIC_IMAGES = 10_000
# device_runtime.Exit.KINDS and exporter._exits.DEFAULT_KIND, checked by tests/exporter/test_exits.py
EXIT_KINDS = ("pool_linear", "conv")
EXIT_KIND = "conv"
EXIT_EPOCHS = 5  # exporter._exits.EPOCHS, checked there too
EXIT_KIND_HELP = ("the exit: pool_linear (global average pooling, then a linear layer) or conv (one 3x3 "
                  "convolution block before them); conv where the cut is (C, H, W) and this flag is not given, "
                  "else pool_linear: measured on one thread (bench/early_exits.py), conv cost 1.09-1.28x the head "
                  "alone on the suite's Fashion-MNIST nets (pool_linear 1.02-1.10x) and about 1.02x on MobileNetV2, "
                  "and answered far more frames as well as the full model (fmnist_vgg's _13: 0.92 of the test "
                  "images within a point of its top-1, pool_linear 0.21)")

PROG = "split-export"

# The bounds of every number split-export takes (splitedge._numbers), each maximum with why: NaN,
# the infinities, a negative and anything past the maximum are a usage error naming the flag and
# its range, exit status 2, before torch is imported (issue 45). Finer rules that need the model
# or the data (2 fragments up to the number of labels, 32 calibration images or more, a width of
# at most 1) stay where the build knows them, each in its own line.

#: Fragments of a semantic split: one group of classes each, so at most the labels; 1000 is
#: ImageNet's. The build refuses fewer than 2 and more than the model's labels.
SEMANTIC_FRAGMENTS = Bounds(int, 1, 1000, "a number of fragments", "5")
#: A fragment's channel widths, a fraction of the tail's: the build takes (0, 1] and says so; past
#: 16 (256 times a convolution's weights) a width is a typo, not a narrowing.
WIDTH = Bounds(float, 0, 16, "a width (a fraction of the tail's)", str(SEMANTIC_WIDTH), low_open=True)
#: Images int8 calibration runs on: they are held as one float32 array and onnxruntime's
#: quantize_static runs the model on each, so 10,000 at 224x224 are 6 GB before any activation;
#: the build asks at least 32.
CALIB_SAMPLES = Bounds(int, 1, 10_000, "a number of images", "64")
#: The autoencoder's latent, a share of the cut tensor: a bottleneck is smaller than the cut
#: (exporter._bottleneck takes (0, 1); 1 itself once ended the build in a ValueError).
LATENT_RATIO = Bounds(float, 0, 0.99, "a share of the cut tensor", "0.1", low_open=True)
#: Images drawn from a data set: more than the set takes them all, and 100 million is past any
#: set a workstation trains on or analyses in memory (ImageNet-21k is 14 million).
IMAGES = Bounds(int, 1, 100_000_000, "a number of images", "10000")
#: Training epochs (2 by default, the zoo's recipes 1 to 4): past a thousand a count of epochs is
#: a typo, not a training.
EPOCHS = Bounds(int, 1, 1000, "a number of epochs", str(AE_EPOCHS))
#: Images per Grad-CAM batch: 4096 of 224x224 are gigabytes of input and as much of gradients.
BATCH_SIZE = Bounds(int, 1, 4096, "a number of images", "32")
#: A seed: numpy's legacy generators and most tools take 32 bits.
SEED = Bounds(int, 0, 2**32 - 1, "a seed", "0")
#: A dimension of one sample's input (C, H or W): past 65,536 pixels, channels or positions is no
#: input a board sends (a camera's side stops at 8192); the whole sample is held to INPUT_ELEMENTS.
INPUT_DIMENSION = Bounds(int, 1, 65_536, example="224")
#: The values of one sample's input: 2^28 are 1 GiB of float32 (2.7 frames of 8K video in RGB).
INPUT_ELEMENTS = 2**28
#: --resize and --crop: what the board does to a camera frame, so at most a camera's side, as
#: split-device's --frame takes it (above 8K video's 7680x4320; tests/test_numeric_flags.py holds
#: them equal).
SIDE = Bounds(int, 1, 8192, "pixels", "224")
#: A channel's mean, in 0-1 or pixel units (any value above 1: 0-255).
MEAN = Bounds(float, 0, 255, "a channel's mean", "0.485 (or 127 in pixel units)")
#: A channel's std, as --mean and above 0 (it divides).
STD = Bounds(float, 0, 255, "a channel's std", "0.229 (or 58 in pixel units)", low_open=True)

EPILOG = """\
examples:
  split-export points torchvision:mobilenet_v2
  split-export points torchvision:resnet18 --input-shape 3,160,160 --json
  split-export build torchvision:mobilenet_v2 --weights mobilenet_v2-b0353104.pth --splits auto --out bundle/
  split-export build mypkg.models:make_net --splits features_4,features_7 --out bundle/ --labels labels.txt
  split-export build torchvision:mobilenet_v2 --splits auto --board rpi-zero2w --formats onnx,tflite --out bundle/
  split-export build torchvision:mobilenet_v2 --splits auto --chain features_4_conv_2,features_14_conv_2 --out bundle/
  split-export build exporter.zoo:fmnist_vgg --weights cnn.pt --input-shape 1,28,28 --splits auto \
      --semantic 5 --train-data fashion-mnist --out bundle/
  split-export build exporter.zoo:fmnist_vgg --weights cnn.pt --input-shape 1,28,28 --splits auto \
      --bottleneck ae --latent-ratio 0.1 --train-data fashion-mnist --out bundle/
  split-export build torchvision:vit_b_16 --splits encoder_layers_encoder_layer_5_add_1 --out bundle/
  split-export build mynet:two_heads --output logits --splits auto --out bundle/   # a forward returning a dict
  split-export build torchvision:mobilenet_v2 --splits auto --out bundle/ --json | jq -r '.splits[].id'   # for scripts
  split-export analyze torchvision:mobilenet_v2 --weights mobilenet_v2-b0353104.pth --data photos/ --out report/
  split-export analyze mypkg.models:fmnist_cnn --weights cnn.pt --data fashion-mnist --classes 5,7,9 --out report/
  split-export slice bundle/ --for board --formats tflite --precision int8 --out board-bundle/   # no torch needed
  split-export slice bundle/ --for host --out host-bundle/
  split-export deploy bundle/ --to pi@192.168.1.31 --to pi@192.168.1.32 --host 192.168.1.20:7767   # no torch

A cut point is named by its torch.fx node; `points` lists them. Marks: N = natural
bottleneck (cut tensor smaller than the input, DSC c_l < 1), C = compressive (smaller
than every earlier cut, DSC Eq. 3), B = a block's output (the cuts DSC counts), * =
compressive among block outputs; the last line gives the counts at both levels. `--splits
auto` exports the compressive ones (C). `--chain A,B` cuts at A and at B: the board runs
the head up to A, one host the stage from A to B, another the stage from B to the end.
`--semantic K` cuts at `--cut` (default: the first C) and replaces the tail by K narrow
fragments, each scoring one group of classes (the classes the model confuses go together),
run side by side on hosts (SplitPlace's semantic split).
"""


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    debug = getattr(args, "debug", False)
    if debug:  # a part left out of the bundle is logged whole (its note gives the first line)
        logging.basicConfig(format="%(name)s: %(message)s")  # the root stays at WARNING: other libraries quiet
        logging.getLogger("splitedge").setLevel(logging.DEBUG)
    return exit_on_signals(PROG, lambda: _run(args), debug=debug)


def _run(args: argparse.Namespace) -> int:
    """``args``' command, every progress bar it left open closed however it ends.

    A bar an error unwinds through stays as tqdm last drew it, a carriage return and the bar with no
    newline, so the error's own line would be glued onto it (and, when the bar is collected, drawn
    again after the error). Closed here, before the error is printed, each bar ends its line, left
    where it stopped: how far the command got.
    """
    try:
        return int(args.run(args))
    finally:
        bars = sys.modules.get("tqdm")  # not imported: no bar was drawn (slice and deploy never import it)
        if bars is not None:
            for bar in sorted(bars.tqdm._instances, key=lambda bar: -abs(bar.pos)):  # inner bars first
                bar.leave = True
                bar.close()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Find the cut points of a network and export split bundles (head for the board, tail for the host).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    points = commands.add_parser(
        "points", help="list every valid cut point", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    _model_arguments(points)
    points.add_argument("--json", action="store_true", help="print the cut points as JSON instead of a table")
    points.set_defaults(run=_points)

    build = commands.add_parser(
        "build", help="export a bundle", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    _model_arguments(build)
    build.add_argument(
        "--splits", type=_splits, metavar="auto|ID,ID",
        help="'auto' (compressive bottlenecks) or cut ids; required unless --chain or --semantic is given",
    )
    build.add_argument(
        "--chain", dest="chains", action="append", type=_cut_ids, default=[], metavar="ID,ID[,ID...]",
        help="a chain split: the board's head up to the first cut, then one stage per cut for a chain of "
        "hosts (two cut ids or more, in graph order); repeat for more chains",
    )
    build.add_argument(
        "--semantic", type=as_flag_type(SEMANTIC_FRAGMENTS), metavar="K",
        help="a semantic split: the board's head up to --cut, then K narrow fragments of the tail for hosts, each "
        "scoring one group of classes, grouped by the model's confusion on --train-data (2 to the number of labels)",
    )
    build.add_argument("--cut", metavar="ID", help="where --semantic cuts (default: the first compressive "
                       "bottleneck, the first C of `split-export points`)")
    build.add_argument("--width", type=as_flag_type(WIDTH), default=SEMANTIC_WIDTH, metavar="W",
                       help=f"each --semantic fragment's channel widths, a fraction of the tail's (default {SEMANTIC_WIDTH})")
    build.add_argument("--out", required=True, metavar="DIR", help="bundle directory to write")
    build.add_argument("--json", action="store_true",
                       help="print the summary as one JSON object on stdout at the end (what it says otherwise goes "
                       "to stderr)")
    build.add_argument("--labels", metavar="FILE", help="class names, one per line")
    build.add_argument(
        "--formats", type=_formats, default=None, metavar="onnx[,tflite]",
        help="artifact formats; tflite adds LiteRT heads and full model for the board (tails stay ONNX); "
        "default: onnx, plus the --board profile's backend",
    )
    build.add_argument("--quantize", choices=(INT8,),
                       help="add int8 heads and send the cut as uint8 (calibrated on --calib-data)")
    build.add_argument("--cut-bits", type=_cut_bits, default=(), metavar="K,K",
                       help="also code each split's cut in K bits a value, per-channel scales calibrated on --calib-data, "
                       f"each coding's accuracy measured as --quantize's is (some of {','.join(map(str, CUT_BITS))}); "
                       "the curve goes to the bundle's report/codings.json and codings.png")
    build.add_argument("--calib-data", metavar="SPEC",
                       help="calibration images for --quantize and --cut-bits (default: --train-data)")
    build.add_argument("--calib-samples", type=as_flag_type(CALIB_SAMPLES), default=64, metavar="N",
                       help="calibration images used (default 64, at least 32)")
    build.add_argument("--bottleneck", choices=("ae",), help="inject and train an I-SPLIT autoencoder at each split")
    build.add_argument("--latent-ratio", type=as_flag_type(LATENT_RATIO), default=0.1,
                       help="latent size / cut tensor size (default 0.1)")
    build.add_argument("--bottleneck-bits", type=_bottleneck_bits, metavar="K",
                       help="with --bottleneck ae: train end to end through the K-bit coding of the latent the wire "
                       f"sends (straight-through, range as calibration fits it) distilled from the uncut model; "
                       f"adds K to --cut-bits (one of {','.join(map(str, CUT_BITS))})")
    build.add_argument("--exits", action="store_true",
                       help="an early exit at each layer split, a second output of its heads (exit_logits), trained on "
                       "--train-data with the network frozen (its labels where they are the model's, else distilled "
                       "from the full model), with a table of confidence thresholds measured on held-out images "
                       "(--test-data, else fashion-mnist's test split or 20%% of --train-data held out); the table goes "
                       "to the manifest and the bundle's report/exits.json and exits.png")
    build.add_argument("--exit-kind", choices=EXIT_KINDS, default=None,
                       help=f"with --exits: {EXIT_KIND_HELP}")
    build.add_argument("--train-data", metavar="SPEC",
                       help="data the bottleneck, the semantic fragments or the exits are trained on (as --data of "
                       "analyze)")
    build.add_argument("--test-data", metavar="SPEC", help="measure every variant's accuracy on this data (default "
                       "with --bottleneck: fashion-mnist's test split, else 20%% of --train-data held out; with "
                       "--quantize or --cut-bits: 32-500 images of --calib-data held out of calibration)")
    build.add_argument("--train-images", type=as_flag_type(IMAGES), metavar="N",
                       help=f"train on at most N images (default: all for --bottleneck, {SEMANTIC_IMAGES:,} for --semantic "
                       "and --exits)")
    build.add_argument("--epochs", type=as_flag_type(EPOCHS), default=None,
                       help="training epochs: the autoencoder's (I-SPLIT Eq. 3; end-to-end fine-tuning follows), "
                       f"the semantic fragments' ({AE_EPOCHS} unless given) or the exits' ({EXIT_EPOCHS} unless given)")
    build.add_argument(
        "--board", choices=sorted(BOARDS), metavar="ID",
        help="write the formats this board runs best and refuse the bundle unless each head and the full model "
        f"fit its memory ({', '.join(sorted(BOARDS))})",
    )
    build.set_defaults(run=_build)

    analyse = commands.add_parser(
        "analyze", help="CUI curves and bottlenecks of every cut point, with plots",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _model_arguments(analyse)
    analyse.add_argument(
        "--data", required=True, metavar="SPEC",
        help="fashion-mnist[:train|:test], a folder with one sub-folder per class, or an .npz with x and y",
    )
    analyse.add_argument("--classes", metavar="I,J|NAME,NAME", help="also analyse this class subset")
    analyse.add_argument("--synonyms", metavar="FILE",
                         help="class folders named otherwise than the model's labels: one 'FOLDER = LABEL' a line")
    analyse.add_argument("--images", type=as_flag_type(IMAGES), metavar="N",
                         help="use at most N images (stratified, seeded)")
    analyse.add_argument("--target", choices=("label", "predicted"), default="label",
                         help="Grad-CAM class: the ground truth (default) or the model's prediction")
    analyse.add_argument("--score", choices=("logit", "softmax"), default="logit",
                         help="the class score differentiated (default: the logit, as Grad-CAM)")
    analyse.add_argument("--batch-size", type=as_flag_type(BATCH_SIZE), default=32)
    analyse.add_argument("--seed", type=as_flag_type(SEED), default=0)
    analyse.add_argument("--out", required=True, metavar="DIR", help="report directory (points.json and PNGs)")
    analyse.set_defaults(run=_analyze)

    cut = commands.add_parser(
        "slice", help="write the part of a bundle a board or a host needs, as a bundle of its own (no torch)",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cut.add_argument("bundle", help="bundle directory written by split-export build")
    cut.add_argument("--for", dest="part", required=True, choices=PARTS,
                     help="board: heads and full model, no tails; host: tails and the ONNX full model, no heads")
    cut.add_argument("--formats", type=_slice_formats, default=None, metavar="onnx|tflite",
                     help="board: keep only these formats of heads and full model (default: every one)")
    cut.add_argument("--precision", choices=PRECISIONS, default=None,
                     help="board: keep only this precision, float32 where an artifact has no other (default: every one)")
    cut.add_argument("--out", required=True, metavar="DIR", help="directory to write (must not exist, or be empty)")
    cut.set_defaults(run=_slice)
    add_deploy_command(commands)
    return parser


def _model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="MODEL", help="torchvision:NAME or package.module:factory")
    parser.add_argument("--weights", metavar="PATH", help="state dict to load (default: random weights)")
    parser.add_argument(
        "--input-shape", type=_shape, metavar="C,H,W", help="per-sample input shape (default: the model's own)"
    )
    parser.add_argument("--debug", action="store_true",
                        help="on an error, and for a TFLite file left out of the bundle, print what the libraries "
                             "raised under it (torch.onnx's graph, LiteRT's trace), not only its line")
    parser.add_argument("--output", metavar="INDEX|KEY", default=None,
                        help="a model returning several tensors (tuple, list or dict): the one the board answers "
                             "with (default: the first; points lists them)")
    pre = parser.add_argument_group(
        "preprocessing", "what the board does to a camera frame (default: the torchvision weights' own, else the "
        "factory's splitedge_preprocessing, else ImageNet's); recorded in the bundle")
    pre.add_argument("--resize", type=as_flag_type(SIDE), default=None, metavar="PX",
                     help="shorter side after resizing")
    pre.add_argument("--crop", type=as_flag_type(SIDE), default=None, metavar="PX",
                     help="centre crop (the model's input size)")
    pre.add_argument("--mean", type=_channels(MEAN), default=None, metavar="R,G,B",
                     help="per-channel mean, 0-1 or pixel units (0-255: any value above 1), e.g. 127,127,127")
    pre.add_argument("--std", type=_channels(STD), default=None, metavar="R,G,B", help="per-channel std, as --mean")
    pre.add_argument("--color", choices=("RGB", "BGR"), default=None, help="channel order the model expects")


def _points(args: argparse.Namespace) -> int:
    from exporter._blocks import count_blocks
    from exporter._graph import cut_blockers, find_cut_points, trace
    from exporter._models import load_model

    with contextlib.redirect_stdout(sys.stderr):  # stdout is the tool's own: what the model prints goes aside
        loaded = load_model(args.model, args.weights, _preprocessing(args), args.input_shape, output=args.output)
        traced = trace(loaded.module, loaded.input_shape)
        cuts = find_cut_points(traced)
    print(json.dumps([asdict(c) for c in cuts], indent=2) if args.json else format_table(cuts))
    print(count_blocks(cuts).summary(), file=sys.stderr if args.json else sys.stdout)
    if loaded.output is not None:
        print(f"note: the board answers with output {loaded.output} (--output to choose)", file=sys.stderr)
    for blocker in cut_blockers(traced):
        print(f"note: {blocker}", file=sys.stderr)
    return 0


def _build(args: argparse.Namespace) -> int:
    from exporter._bottleneck import BottleneckOptions, BottleneckTraining
    from exporter._build import BuildSpec, build_bundle
    from exporter._datasets import training_spec

    if args.splits is None and not args.chains and args.semantic is None:
        raise SplitEdgeError("build needs --splits (auto or cut ids), --chain ID,ID[,ID...], or both; "
                             "or --semantic K, alone or beside them")
    semantic = _semantic_options(args)
    bottleneck = None
    if args.bottleneck_bits is not None and not args.bottleneck:
        raise SplitEdgeError(f"--bottleneck-bits {args.bottleneck_bits} codes an autoencoder's latent: "
                             "give --bottleneck ae with it")
    if args.bottleneck:
        if not args.train_data:
            raise SplitEdgeError("--bottleneck ae needs --train-data to train the autoencoder on")
        bottleneck = BottleneckOptions(
            train_data=args.train_data, test_data=args.test_data, latent_ratio=args.latent_ratio,
            train_images=args.train_images, training=BottleneckTraining(ae_epochs=args.epochs or AE_EPOCHS),
            bits=args.bottleneck_bits,
        )
    exits = _exit_options(args)
    quantize_from = None
    # calibrated on the training data where no other is given, never on its test split
    calib_data = args.calib_data or (args.train_data and training_spec(args.train_data))
    if args.quantize:
        quantize_from = calib_data
        if quantize_from is None:
            raise SplitEdgeError("--quantize int8 needs --calib-data (or --train-data) to calibrate on")
    if (args.cut_bits or args.bottleneck_bits) and calib_data is None:
        raise SplitEdgeError("--cut-bits needs --calib-data (or --train-data) to calibrate the codings on")
    spec = BuildSpec(
        args.model,
        weights=args.weights,
        splits=() if args.splits is None else args.splits,
        chains=args.chains,
        labels=args.labels,
        input_shape=args.input_shape,
        preprocessing=_preprocessing(args),
        board=args.board,
        bottleneck=bottleneck,
        formats=args.formats or board_formats(args.board),
        quantize_from=quantize_from,
        calibration_samples=args.calib_samples,
        test_data=args.test_data,
        semantic=semantic,
        output=args.output,
        cut_bits=args.cut_bits,
        calib_data=calib_data,
        exits=exits,
    )
    if not args.json:
        _built(build_bundle(spec, args.out), args.out)
        return 0
    with contextlib.redirect_stdout(sys.stderr):  # stdout holds the JSON alone: the build's own words go aside
        manifest = build_bundle(spec, args.out)
        _built(manifest, args.out)
    print(json.dumps(_build_summary(manifest, args.out), indent=2))
    return 0


def _build_summary(manifest: Manifest, out: str) -> dict[str, Any]:
    """What :func:`_built` says of a bundle, as ``build --json`` prints it: a split's ``curve`` is
    its cut codings' (``--cut-bits``), float32 and uint8 first, empty without them."""
    from exporter._codings import read_curve

    curve = read_curve(out)
    curves = {c.split: [asdict(p) for p in c.points] for c in curve.splits} if curve is not None else {}

    def artifact(a: Artifact) -> dict[str, Any]:
        return {"path": a.path, "role": a.role, "format": a.format, "precision": a.precision, "bytes": a.bytes,
                "accuracy": a.accuracy, "max_abs_error": a.max_abs_error, "max_rel_error": a.max_rel_error}

    return {
        "bundle_id": manifest.bundle_id, "out": str(out), "output": manifest.model.output,
        "accuracy_on": manifest.model.accuracy_on, "accuracy": manifest.model.accuracy,
        "full": [artifact(a) for a in manifest.full],
        "splits": [{
            "id": s.id, "kind": s.kind, "shape": list(s.tensor.shape), "bytes_per_sample": s.tensor.bytes_per_sample,
            "accuracy": s.accuracy, "accuracies": dict(s.accuracies), "artifacts": [artifact(a) for a in s.artifacts],
            "stages": [{"index": t.index, "cut": t.cut, "shape": list(t.tensor.shape),
                        "bytes_per_sample": t.tensor.bytes_per_sample} for t in s.stages],
            "fragments": [{"index": f.index, "classes": list(f.classes), "params": f.params} for f in s.fragments],
            "curve": curves.get(s.id, []),
            "exit": None if s.exit is None else asdict(s.exit),
        } for s in manifest.splits],
        "curve_metric": None if curve is None else curve.metric,
    }


def _built(manifest: Manifest, out: str) -> None:
    """The human summary of a build: where it went, its artifacts, how they validated, what they measured."""
    print(f"wrote bundle {manifest.bundle_id} to {out}: splits {', '.join(s.id for s in manifest.splits)}")
    if manifest.model.output is not None:
        print(f"  answers with output {manifest.model.output} (--output to choose)")
    for what, artifacts in [("full model", manifest.full),
                            *((f"{s.id}'s head", [a for a in s.artifacts if a.role == HEAD]) for s in manifest.splits)]:
        print(f"  {what} in {', '.join(f'{a.format} {a.precision}' for a in artifacts)}")
    for split in manifest.splits:
        if split.stages:
            print(f"  chain {split.id}: the board's head, then")
            for stage in split.stages:
                print(f"    stage {stage.index} from {stage.cut}: takes {_sent(stage.tensor)}")
        if split.fragments:
            print(_semantic_summary(split))
    validated = [a for a in (*manifest.full, *(a for s in manifest.splits for a in s.artifacts))
                 if a.max_abs_error is not None]
    if validated:
        print("validated against torch: largest difference, and its share of the outputs' spread (a tail: with its head)")
        width = max(len(a.path) for a in validated)
        for a in validated:
            share = (f"({a.max_rel_error:.2g})" if a.max_rel_error is not None else
                     "(torch's outputs never vary with these weights: a wrong artifact would pass too; "
                     "build from trained weights to validate it)")
            print(f"  {a.path:<{width}}  {a.max_abs_error:.2g}  {share}")
    if manifest.model.accuracy_on is not None:
        print(f"measured: {manifest.model.accuracy_on}")
        if manifest.model.accuracy is not None:
            print(f"  full model {manifest.model.accuracy:.4f}")
        for split in manifest.splits:
            print(f"  {split.id}: {split.accuracy:.4f}, sends {_sent(split.tensor)}")
            for a in split.artifacts:
                if a.role == HEAD and a.accuracy is not None:
                    print(f"    head {a.format} {a.precision}: {a.accuracy:.4f}, {a.bytes:,} B")
        for a in manifest.full:
            if a.accuracy is not None:
                print(f"  full {a.format} {a.precision}: {a.accuracy:.4f}, {a.bytes:,} B")
    _codings_summary(out)
    _exits_summary(manifest, out)


def _exits_summary(manifest: Manifest, out: str) -> None:
    """Each early exit (``--exits``) and its table: per confidence threshold, the share of frames that
    exit and how they fare against the full model (and their labels, where the images had them)."""
    from exporter._exits import EXITS_JSON, EXITS_PNG, describe_row

    exiting = [s for s in manifest.splits if s.exit is not None]
    if not exiting:
        return
    print(f"early exits (a second head output, exit_logits), measured on held-out images; the tables in "
          f"{out}/report/{EXITS_JSON} and {EXITS_PNG}")
    for split in exiting:
        e = split.exit
        error = "" if e.max_abs_error is None else f"; validated against torch within {e.max_abs_error:.2g}"
        print(f"  {split.id}: {e.kind}, {e.params:,} parameters{error}; threshold (softmax maximum) -> "
              f"on {e.measured_on:,} images:")
        for row in e.thresholds:
            print(f"    {describe_row(row)}")


def _codings_summary(out: str) -> None:
    """The curve of a ``--cut-bits`` build: per split, bytes per sample and accuracy per coding."""
    from exporter._codings import CURVE_JSON, CURVE_PNG, REPORT_DIR, read_curve

    curve = read_curve(out)
    if curve is None:
        return
    metric = "top-1" if curve.metric == "top1" else "agreement"
    print(f"cut codings: bytes per sample and {metric} on the same images; the curve in "
          f"{out}/{REPORT_DIR}/{CURVE_JSON} and {CURVE_PNG}")
    for split in curve.splits:
        print(f"  {split.split}:")
        width = max(len(p.coding) for p in split.points)
        size = max(len(f"{p.bytes_per_sample:,}") for p in split.points)
        for p in split.points:
            print(f"    {p.coding:<{width}}  {p.bytes_per_sample:>{size},} B  {p.accuracy:.4f}")


def _exit_options(args: argparse.Namespace):
    """``--exits`` and its companions, checked before the model is loaded; None without it."""
    if not args.exits:
        if args.exit_kind is not None:
            raise SplitEdgeError(f"--exit-kind {args.exit_kind} chooses the exit --exits trains: give --exits with it")
        return None
    for given, flag in ((args.chains, "--chain"), (args.semantic is not None, "--semantic"),
                        (args.bottleneck, "--bottleneck")):
        if given:
            raise SplitEdgeError(f"--exits and {flag} together: an exit is trained at a layer split's cut; export the "
                                 f"{flag.lstrip('-')} split in a build without --exits")
    if args.splits is None:
        raise SplitEdgeError("--exits adds an exit at each layer split: give --splits (auto or cut ids)")
    if not args.train_data:
        raise SplitEdgeError("--exits needs --train-data to train the exits on (its labels where they are the "
                             "model's, else any images: the full model teaches), e.g. --train-data fashion-mnist")
    from exporter._exits import ExitOptions

    return ExitOptions(train_data=args.train_data, test_data=args.test_data, kind=args.exit_kind,
                       train_images=args.train_images or SEMANTIC_IMAGES, epochs=args.epochs or EXIT_EPOCHS)


def _semantic_options(args: argparse.Namespace):
    """``--semantic K`` and its companions, checked before the model is loaded; None without it."""
    if args.semantic is None:
        if args.cut is not None:
            raise SplitEdgeError("--cut names where a semantic split cuts: give --semantic K with it")
        return None
    from exporter._semantic import FragmentTraining, SemanticOptions

    if args.semantic < 2:
        raise SplitEdgeError(f"--semantic {args.semantic}: a semantic split has 2 fragments or more, one group of "
                             "classes each (up to one per label)")
    if not args.train_data:
        raise SplitEdgeError("--semantic needs --train-data to train the fragments on, e.g. --train-data fashion-mnist")
    if not 0 < args.width <= 1:
        raise SplitEdgeError(f"--width {args.width:g}: a fragment's widths are a fraction of the tail's, in (0, 1]")
    return SemanticOptions(
        fragments=args.semantic, train_data=args.train_data, test_data=args.test_data, cut=args.cut, width=args.width,
        train_images=SEMANTIC_IMAGES if args.train_images is None else args.train_images,
        training=FragmentTraining(epochs=args.epochs or AE_EPOCHS),
    )


def _semantic_summary(split) -> str:
    """``semantic split _17~5: 5 fragments, groups ..., accuracy full 0.90 / layer 0.90 / semantic 0.87``."""
    groups = " | ".join(",".join(map(str, f.classes)) for f in split.fragments)
    params = ", ".join(f"{f.params:,}" for f in split.fragments)
    accuracy = " / ".join(f"{k} {v:.4f}" for k, v in split.accuracies.items())
    return (f"  semantic split {split.id}: {len(split.fragments)} fragments, groups {groups} "
            f"({params} parameters){', accuracy ' + accuracy if accuracy else ''}\n    grouped by {split.grouping}")


def _analyze(args: argparse.Namespace) -> int:
    from exporter._analysis import AnalysisSpec, analyze, summary_text

    spec = AnalysisSpec(
        args.model, args.data, weights=args.weights, classes=args.classes, images=args.images, target=args.target,
        score=args.score, input_shape=args.input_shape, batch_size=args.batch_size, seed=args.seed,
        preprocessing=_preprocessing(args), synonyms=args.synonyms, output=args.output,
    )
    report = analyze(spec, args.out)
    print(summary_text(report))
    print(f"wrote {args.out}/points.json, cui_curve.png, cui_per_class.png, head_cost.png")
    return 0


def _slice(args: argparse.Namespace) -> int:
    result = slice_bundle(args.bundle, args.out, args.part, formats=args.formats, precision=args.precision)
    for note in result.notes:
        print(f"note: {note}")
    print(result.summary())
    return 0


def format_table(cuts: Sequence[CutPoint]) -> str:
    """One row per cut point, widths fitted to the longest id and shape."""
    rows = [("id", "pos", "op", "shape", "bytes/sample", "c_l", "marks")]
    rows += [
        (
            c.id,
            str(c.position),
            c.op,
            "x".join(map(str, c.shape)),
            f"{c.bytes_per_sample:,}",
            f"{c.compression_ratio:.4f}",
            ("N" if c.natural else "") + ("C" if c.compressive else "") + ("B" if c.block_output else "") + ("*" if c.block_compressive else ""),
        )
        for c in cuts
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    right = {1, 4, 5}  # numbers line up on the right
    return "\n".join(
        "  ".join(cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths))).rstrip()
        for row in rows
    )


def _channels(bounds: Bounds):
    """``--mean``/``--std``: comma-separated numbers, one per channel, each within ``bounds``."""

    def channels(text: str) -> tuple[float, ...]:
        try:
            return tuple(bounds(part.strip()) for part in text.split(",") if part.strip())
        except SettingError as exc:
            raise argparse.ArgumentTypeError(f"{text!r} (one number per channel): {exc}") from None

    channels.bounds = bounds  # type: ignore[attr-defined]
    channels.template = "{},0.5,0.5"  # type: ignore[attr-defined]
    return channels


def _preprocessing(args: argparse.Namespace):
    from exporter._preprocessing import PreprocessFlags

    return PreprocessFlags(resize=args.resize, crop=args.crop, mean=args.mean, std=args.std, color=args.color)


def _shape(text: str) -> tuple[int, ...]:
    """``--input-shape C,H,W``: each dimension within :data:`INPUT_DIMENSION`, at most :data:`INPUT_ELEMENTS` in all."""
    try:
        shape = tuple(INPUT_DIMENSION(part.strip()) for part in text.split(","))
    except SettingError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} (C,H,W, like 3,224,224): {exc}") from None
    if math.prod(shape) > INPUT_ELEMENTS:
        raise argparse.ArgumentTypeError(f"{text!r}: {math.prod(shape):,} values a sample; at most {INPUT_ELEMENTS:,} "
                                         "(1 GiB of float32)")
    return shape


_shape.bounds = INPUT_DIMENSION  # type: ignore[attr-defined]
_shape.template = "3,{},224"  # type: ignore[attr-defined]


def board_formats(board_id: str | None) -> tuple[str, ...]:
    """ONNX always (the host's tails, and every board can run it), plus the board's recommended backend."""
    if board_id is None:
        return (ONNX,)
    return tuple(dict.fromkeys((ONNX, BOARDS[board_id].backend)))


def _formats(text: str) -> tuple[str, ...]:
    formats = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown format(s) {', '.join(unknown)}; formats: {', '.join(FORMATS)}")
    return formats if ONNX in formats else (ONNX, *formats)


def _slice_formats(text: str) -> tuple[str, ...]:
    """Unlike build's --formats, ONNX is not added: a board that runs TFLite needs no ONNX heads."""
    formats = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown or not formats:
        raise argparse.ArgumentTypeError(f"format(s) {text!r}: expected some of {', '.join(FORMATS)}")
    return formats


def _sent(tensor: TensorSpec) -> str:
    """What crosses a link, per sample: ``32x56x56 (401,408 B per sample)``."""
    return f"{'x'.join(map(str, tensor.shape))} ({tensor.bytes_per_sample:,} B per sample)"


def _cut_bits(text: str) -> tuple[int, ...]:
    """``--cut-bits 8,4,2``: some of :data:`CUT_BITS`, most bits first, each once."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts or any(part not in {str(k) for k in CUT_BITS} for part in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: bits a value, comma separated, some of "
                                         f"{', '.join(map(str, CUT_BITS))}")
    return tuple(sorted({int(part) for part in parts}, reverse=True))


def _bottleneck_bits(text: str) -> int:
    """``--bottleneck-bits 4``: one of :data:`CUT_BITS`."""
    if text.strip() not in {str(k) for k in CUT_BITS}:
        raise argparse.ArgumentTypeError(f"{text!r}: the latent's bits a value, one of {', '.join(map(str, CUT_BITS))}")
    return int(text)


def _splits(text: str) -> str | list[str]:
    if text == "auto":
        return text
    ids = _cut_ids(text)
    if not ids:
        raise argparse.ArgumentTypeError("expected 'auto' or a comma-separated list of cut ids")
    return ids


def _cut_ids(text: str) -> list[str]:
    """A chain's cut ids as given: their number and order are checked by the build, in one line."""
    return [part.strip() for part in text.split(",") if part.strip()]


if __name__ == "__main__":
    sys.exit(main())
