"""Where a model's preprocessing and labels come from, and the one input shape they imply.

Sources, later wins, each field on its own: ImageNet's defaults (a guess, for a factory that
says nothing) < torchvision's weights metadata (``transforms()``, ``meta["categories"]``) <
the factory's own declaration < the command line (``--resize``, ``--crop``, ``--mean``,
``--std``, ``--color``). A factory declares with attributes named :data:`PREPROCESSING` and
:data:`LABELS`, found on the module it returns, on the factory function, or in the factory's
Python module (in that order)::

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
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from device_runtime import Preprocess
from splitedge import ModelSpecError

__all__ = ["LABELS", "PREPROCESSING", "PreprocessFlags", "declared", "resolve"]

PREPROCESSING = "splitedge_preprocessing"
LABELS = "splitedge_labels"
_FIELDS = ("resize", "crop", "mean", "std", "interpolation", "color")
_INTERPOLATIONS = ("bilinear", "bicubic", "nearest")
_COLORS = ("RGB", "BGR")
RESIZE_PER_CROP = 256 / 224  # torchvision's ImageNet ratio, for a crop given alone


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
) -> tuple[Preprocess, tuple[int, ...], dict[str, str]]:
    """The preprocessing in force, the per-sample input shape, and each field's source.

    ``base`` is the weights' preprocessing (``base_known``) or ImageNet's guess. With ``strict``
    (a bundle: the board will crop), an ``input_shape`` that contradicts a known crop is refused;
    otherwise (``points``, ``analyze``: the model at another resolution) the crop follows it.
    """
    fields: dict[str, Any] = dataclasses.asdict(base)
    # What the build records itself (the fold and the fast path's agreement) comes from no source.
    sources = {k: ("the weights" if base_known else "ImageNet's defaults (a guess)") for k in fields
               if k not in _BUILD_RECORDS}
    for source, given in ((f"{where}'s {PREPROCESSING}", _checked(dict(factory or {}), f"{where}.{PREPROCESSING}")),
                          ("the command line", _checked((flags or PreprocessFlags()).given(), "the command line"))):
        fields.update(given)
        sources.update({k: source for k in given})
    channels = len(fields["mean"])
    if len(fields["std"]) != channels:
        raise ModelSpecError(f"mean has {channels} values and std {len(fields['std'])}: give one per channel")
    crop_known = strict and not sources["crop"].startswith("ImageNet")
    if input_shape is not None:
        shown = ",".join(map(str, input_shape))
        if len(input_shape) != 3 or input_shape[1] != input_shape[2]:
            raise ModelSpecError(f"--input-shape {shown}: expected C,H,W with H = W (the board centre-crops a square)")
        if input_shape[0] != channels and not sources["mean"].startswith("ImageNet"):
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
