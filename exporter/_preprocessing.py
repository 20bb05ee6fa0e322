"""Where a model's preprocessing and labels come from, and the one input shape they imply.

Sources, later wins, each field on its own: ImageNet's defaults (a guess, for a factory that
says nothing) < what the model carries (torchvision's weights metadata, ``transforms()`` and
``meta["categories"]``; a timm model's ``pretrained_cfg``; a Hugging Face model's config and the
``preprocessor_config.json`` beside it, see :func:`carried`) < the factory's own declaration <
the command line (``--resize``, ``--crop``, ``--mean``, ``--std``, ``--color``). A crop said
without a resize gets torchvision's ImageNet ratio to it. A factory declares with attributes
named :data:`PREPROCESSING` and :data:`LABELS`, found on the module it returns, on the factory
function, or in the factory's Python module (in that order)::

    def make_net():
        return Net()
    make_net.splitedge_preprocessing = {"resize": 256, "crop": 224, "mean": [127.0] * 3, "std": [128.0] * 3}
    make_net.splitedge_labels = ["cat", "dog"]

Means and standard deviations given together with any value above 1 are in pixel units
(0-255) and are divided by 255, so a model trained on ``(x - 127) / 128`` says so as it was
written. ``--input-shape`` must agree
with the crop where the crop is known (not a guess): the board crops to it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from device_runtime import Preprocess
from splitedge.errors import ModelSpecError

__all__ = ["LABELS", "PREPROCESSING", "PreprocessFlags", "carried", "declared", "guessed", "resolve"]

PREPROCESSING = "splitedge_preprocessing"
LABELS = "splitedge_labels"
_FIELDS = ("resize", "crop", "mean", "std", "interpolation", "color")
_INTERPOLATIONS = ("bilinear", "bicubic", "nearest")
_COLORS = ("RGB", "BGR")
RESIZE_PER_CROP = 256 / 224  # torchvision's ImageNet ratio, for a crop given alone
GUESS = "ImageNet's"  # how the sources of guessed fields begin
#: What a model may carry besides the preprocessing fields: the number of input channels.
CHANNELS = "channels"
#: PIL's resampling filters by number, as a Hugging Face ``preprocessor_config.json`` writes
#: ``resample``; those the board has (LANCZOS 1, BOX 4, HAMMING 5 are left to the guess).
_PIL_FILTERS = {0: "nearest", 2: "bilinear", 3: "bicubic"}
TIMM_CROP_PCT = 0.875  # timm's DEFAULT_CROP_PCT, for a pretrained_cfg without one
HF_PROCESSOR = "preprocessor_config.json"


@dataclass(frozen=True)
class PreprocessFlags:
    """What the command line said; None: not said."""

    resize: int | None = None
    crop: int | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    color: str | None = None

    def given(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


def declared(name: str, *owners: object) -> Any:
    """The first of ``owners`` (module, factory, Python module) that has attribute ``name``."""
    for owner in owners:
        value = getattr(owner, name, None)
        if value is not None:
            return value() if callable(value) and not isinstance(value, (Mapping, Sequence)) else value
    return None


def _numbers(values: Any, what: str, where: str) -> tuple[float, ...]:
    try:
        numbers = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise ModelSpecError(f"{where}: {what} {values!r}: expected numbers, one per channel") from None
    if not numbers or not all(math.isfinite(v) for v in numbers):
        raise ModelSpecError(f"{where}: {what} {values!r}: expected finite numbers, one per channel")
    return numbers


def _checked(fields: Mapping[str, Any], where: str) -> dict[str, Any]:
    unknown = sorted(set(fields) - set(_FIELDS))
    if unknown:
        raise ModelSpecError(f"{where}: unknown preprocessing key(s) {', '.join(unknown)}; keys: {', '.join(_FIELDS)}")
    out: dict[str, Any] = {}
    for key, value in fields.items():
        if key in ("resize", "crop"):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ModelSpecError(f"{where}: {key} {value!r}: expected a positive number of pixels")
            out[key] = value
        elif key in ("mean", "std"):
            out[key] = _numbers(value, key, where)
            if key == "std" and any(v <= 0 for v in out[key]):
                raise ModelSpecError(f"{where}: std {value!r}: expected positive numbers")
        elif key == "interpolation" and value not in _INTERPOLATIONS:
            raise ModelSpecError(f"{where}: interpolation {value!r}: expected one of {', '.join(_INTERPOLATIONS)}")
        elif key == "color" and value not in _COLORS:
            raise ModelSpecError(f"{where}: color {value!r}: expected one of {', '.join(_COLORS)}")
        else:
            out[key] = value
    given = [v for key in ("mean", "std") for v in out.get(key, ())]
    if given and max(abs(v) for v in given) > 1:  # pixel units (0-255), as (x - 127) / 128 is written
        out.update({key: tuple(v / 255.0 for v in out[key]) for key in ("mean", "std") if key in out})
    return out


_BUILD_RECORDS = ("folded", "fast_agreement", "fast_agreement_on")


def resolve(
    base: Preprocess, base_known: bool, factory: Mapping[str, Any] | None, flags: PreprocessFlags | None,
    input_shape: tuple[int, ...] | None, where: str, strict: bool = True,
    carried: Sequence[tuple[str, Mapping[str, Any]]] = (),
) -> tuple[Preprocess, tuple[int, ...], dict[str, str]]:
    """The preprocessing in force, the per-sample input shape, and each field's source.

    ``base`` is the weights' preprocessing (``base_known``) or ImageNet's guess; ``carried``, what
    the model says of itself as (source, fields) pairs (:func:`carried`), comes over it. With
    ``strict`` (a bundle: the board will crop), an ``input_shape`` that contradicts a known crop is
    refused; otherwise (``points``, ``analyze``: the model at another resolution) the crop follows it.
    """
    fields: dict[str, Any] = dataclasses.asdict(base)
    # What the build records itself (the fold and the fast path's agreement) comes from no source.
    sources = {k: ("the weights" if base_known else f"{GUESS} defaults (a guess)") for k in fields
               if k not in _BUILD_RECORDS}
    said_channels = [layer[CHANNELS] for _, layer in carried if CHANNELS in layer]
    layers = [(source, _checked({k: v for k, v in layer.items() if k != CHANNELS}, source))
              for source, layer in carried]
    layers += [(f"{where}'s {PREPROCESSING}", _checked(dict(factory or {}), f"{where}.{PREPROCESSING}")),
               ("the command line", _checked((flags or PreprocessFlags()).given(), "the command line"))]
    for source, given in layers:
        fields.update(given)
        sources.update({k: source for k in given})
    if sources["resize"].startswith(GUESS) and not sources["crop"].startswith(GUESS):
        # A crop said alone (a Hugging Face config's image_size): ImageNet's 256 would be no guess
        # at all for 384 (smaller than the crop) or 32 (the board keeping the centre eighth).
        fields["resize"] = round(fields["crop"] * RESIZE_PER_CROP)
        sources["resize"] = f"{GUESS} ratio to the crop (a guess)"
    channels = len(fields["mean"])
    if len(fields["std"]) != channels:
        raise ModelSpecError(f"mean has {channels} values and std {len(fields['std'])}: give one per channel")
    if said_channels and sources["mean"].startswith(GUESS):  # ImageNet's three values say nothing of the model
        channels = said_channels[-1]
    crop_known = strict and not sources["crop"].startswith(GUESS)
    if input_shape is not None:
        shown = ",".join(map(str, input_shape))
        if len(input_shape) != 3 or input_shape[1] != input_shape[2]:
            raise ModelSpecError(f"--input-shape {shown}: expected C,H,W with H = W (the board centre-crops a square)")
        if input_shape[0] != channels and not sources["mean"].startswith(GUESS):
            raise ModelSpecError(f"--input-shape {shown} has {input_shape[0]} channel(s); the mean and std from "
                                 f"{sources['mean']} have {channels}")
        channels, size = input_shape[0], input_shape[1]
        if crop_known and fields["crop"] != size:
            raise ModelSpecError(
                f"--input-shape {shown} contradicts the crop {fields['crop']} from {sources['crop']}: the board "
                f"would crop to {fields['crop']}; give --crop {size} (and --resize), or leave out --input-shape")
        if fields["crop"] != size:
            scale = fields["resize"] / fields["crop"]
            fields["crop"], sources["crop"] = size, "--input-shape"
            if not sources["resize"].startswith("the command line"):
                fields["resize"] = round(size * scale)
                sources["resize"] = f"--input-shape (the crop's ratio to it, {scale:.3f})"
    if fields["resize"] < fields["crop"]:
        raise ModelSpecError(f"resize {fields['resize']} is smaller than the crop {fields['crop']} "
                             f"(from {sources['resize']} and {sources['crop']}): the crop must fit in the resized image")
    preprocess = Preprocess(**fields)
    return preprocess, (channels, preprocess.crop, preprocess.crop), sources


def guessed(sources: Mapping[str, str]) -> list[str]:
    """The fields of the board's normalisation that nothing declared (``resize``, ``crop``, ``mean``,
    ``std``): what a build must say it assumed, since a wrong one costs accuracy without an error."""
    return [k for k in ("resize", "crop", "mean", "std") if sources[k].startswith(GUESS)]


def carried(module: object) -> list[tuple[str, dict[str, Any]]]:
    """What ``module`` says of its own preprocessing, as (source, fields) pairs, later wins: a timm
    model's ``pretrained_cfg``; a Hugging Face model's config (its input: ``image_size``,
    ``num_channels``), then the image processor saved beside it (the ``preprocessor_config.json``
    in the folder ``config._name_or_path`` names). Whoever built the model (``timm:NAME``, a
    user's factory) does not matter: the module carries it."""
    layers: list[tuple[str, dict[str, Any]]] = []
    cfg = getattr(module, "pretrained_cfg", None)
    if isinstance(cfg, Mapping):
        layers.append(("timm pretrained_cfg", _timm_fields(cfg)))
    config = getattr(module, "config", None)
    side = _side(getattr(config, "image_size", None))
    channels = getattr(config, "num_channels", None)
    if not isinstance(channels, int) or isinstance(channels, bool):
        channels = None
    if side is not None:
        layers.append((f"{type(module).__name__}'s config (image_size)",
                       {"crop": side, **({CHANNELS: channels} if channels is not None else {})}))
    folder = getattr(config, "_name_or_path", None)
    if isinstance(folder, str) and folder and (Path(folder) / HF_PROCESSOR).is_file():
        path = Path(folder) / HF_PROCESSOR
        layers.append((str(path), _hf_processor_fields(path, channels or 3)))
    return [(source, fields) for source, fields in layers if fields]


def _timm_fields(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """timm's own eval transform (``resolve_data_config``, ``create_transform``): the shorter side
    resized to floor(crop / crop_pct), then the centre ``input_size`` cropped."""
    fields: dict[str, Any] = {}
    size = cfg.get("input_size")
    if isinstance(size, Sequence) and len(size) == 3 and size[1] == size[2]:  # the board crops a square
        fields[CHANNELS], fields["crop"] = int(size[0]), int(size[1])
        fields["resize"] = math.floor(fields["crop"] / float(cfg.get("crop_pct") or TIMM_CROP_PCT))
    if cfg.get("interpolation") in _INTERPOLATIONS:  # not timm's "random" (a training augmentation)
        fields["interpolation"] = cfg["interpolation"]
    fields.update({key: tuple(cfg[key]) for key in ("mean", "std") if cfg.get(key) is not None})
    return fields


def _hf_processor_fields(path: Path, channels: int) -> dict[str, Any]:
    """A Hugging Face image processor's steps in the board's terms. ``size`` is the shorter side
    (``shortest_edge``) or a square; ``crop_size`` the centre crop (none: the resized square is the
    input; ConvNeXt's ``crop_pct``: ``shortest_edge`` is the crop); pixels are scaled by
    ``rescale_factor`` (1/255 unless ``do_rescale`` is false) before ``image_mean`` and ``image_std``,
    which apply only where ``do_normalize`` is true (false, or a processor without the step such as
    MobileViT's: mean 0, std 1); ``do_flip_channel_order`` feeds BGR."""
    try:
        said = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelSpecError(f"cannot read {path}: {exc}; fix or remove it") from exc
    if not isinstance(said, dict):
        raise ModelSpecError(f"cannot read {path}: expected a JSON object, got {type(said).__name__}")
    fields: dict[str, Any] = {}
    resize = _side(said.get("size"))
    crop = _side(said.get("crop_size")) if said.get("do_center_crop", True) else None
    if resize is not None and crop is None and said.get("crop_pct"):
        crop, resize = resize, math.floor(resize / float(said["crop_pct"]))
    if resize is not None and said.get("do_resize", True):
        fields["resize"] = resize
    if crop or resize:
        fields["crop"] = crop or resize
    filter_ = said.get("resample")
    if isinstance(filter_, int) and filter_ in _PIL_FILTERS:
        fields["interpolation"] = _PIL_FILTERS[filter_]
    # The board computes (pixel / 255 - mean) / std; the processor (pixel * rescale - mean) / std.
    scale = 255 * float(said.get("rescale_factor") or 1 / 255) if said.get("do_rescale", True) else 255.0
    if said.get("do_normalize") and said.get("image_mean") is not None and said.get("image_std") is not None:
        fields["mean"] = tuple(float(m) / scale for m in said["image_mean"])
        fields["std"] = tuple(float(s) / scale for s in said["image_std"])
    elif not said.get("do_normalize"):
        fields["mean"], fields["std"] = (0.0,) * channels, (1.0 / scale,) * channels
    if said.get("do_flip_channel_order"):
        fields["color"] = "BGR"
    return fields


def _side(size: Any) -> int | None:
    """One side of a square from how configs write sizes: 224, [224, 224], {"shortest_edge": 224} or
    {"height": 224, "width": 224}; None for what is no square (the board crops one)."""
    if isinstance(size, int) and not isinstance(size, bool):
        return size
    if isinstance(size, Sequence) and not isinstance(size, str) and len(size) == 2 and size[0] == size[1]:
        return _side(size[0])
    if isinstance(size, Mapping):
        if isinstance(size.get("shortest_edge"), int):
            return size["shortest_edge"]
        if size.get("height") == size.get("width"):
            return _side(size.get("height"))
    return None
