"""Turn a MODEL spec from the command line into an ``nn.Module`` and what the bundle says about it.

Three spec forms: ``torchvision:NAME`` (any classification or segmentation model
torchvision's registry knows), ``timm:NAME`` (any model timm's registry knows, ``NAME.TAG``
for one release's preprocessing; timm is imported for this form only) and
``package.module:factory`` (a user's function returning an ``nn.Module``). Weights are random
unless a state dict is given: nothing is ever downloaded. Nothing is imported by evaluating
strings: the factory is looked up with ``importlib`` and ``getattr``.

What differs between models is read from their own metadata (torchvision's weights enum,
``transforms()`` and ``meta["categories"]``; what the module carries, see
:func:`exporter._preprocessing.carried`) or, for constructor arguments, from the
:data:`FACTORY_KWARGS` table, never from ``if name == ...`` code.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import inspect
import logging
import os
import sys
import traceback
from collections.abc import Iterator, Mapping
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torchvision

from device_runtime import Preprocess
from exporter._preprocessing import LABELS, PREPROCESSING, PreprocessFlags, carried, declared, guessed, resolve
from splitedge.errors import ModelSpecError

__all__ = ["LoadedModel", "FACTORY_KWARGS", "load_model", "load_state_dict", "read_labels"]

TORCHVISION_PREFIX = "torchvision:"
TIMM_PREFIX = "timm:"

log = logging.getLogger("splitedge.export")

#: ImageNet normalisation, used when a model brings no transforms of its own.
IMAGENET_PREPROCESS = Preprocess(resize=256, crop=224, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))

#: torchvision's model families a split bundle cannot carry, by the module their builders live in,
#: and why (with what would do instead).
REFUSED_FAMILIES: dict[str, str] = {
    "torchvision.models.detection": (
        "a detection model answers with lists of boxes whose count depends on the image (after "
        "non-maximum suppression), not the fixed-shape tensors a split bundle carries; give a factory "
        "returning the raw tensors of its backbone and heads (e.g. the model's .backbone) instead"),
}

#: Constructor arguments some torchvision models need to build a plain, traceable
#: classifier from random weights: the auxiliary heads of GoogLeNet and Inception v3
#: are training-only outputs and their legacy truncated-normal init is slow and warns.
FACTORY_KWARGS: dict[str, dict[str, Any]] = {
    "googlenet": {"aux_logits": False, "init_weights": False},
    "inception_v3": {"aux_logits": False, "init_weights": False},
}


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to trace, with the facts the bundle manifest records about it."""

    name: str  # short name, used in the bundle id: "mobilenet_v2", "my_factory"
    module: torch.nn.Module
    preprocess: Preprocess
    input_shape: tuple[int, ...]  # default per-sample input, (3, crop, crop)
    categories: tuple[str, ...] | None  # class names the weights were trained on, if known
    sources: dict[str, str] = dataclasses.field(default_factory=dict)  # preprocessing field -> where it came from
    output: str | None = None  # a model of several outputs: the one kept, in words ("0 of 0 [1000], 1 [10]")


def load_model(spec: str, weights: str | Path | None = None, preprocessing: PreprocessFlags | None = None,
               input_shape: tuple[int, ...] | None = None, for_board: bool = False,
               output: str | None = None) -> LoadedModel:
    """Build the model a spec names, load ``weights`` (a state dict file) into it, set eval mode; its
    preprocessing and input shape resolved from the weights, what the module carries, the factory and
    ``preprocessing`` (:func:`exporter._preprocessing.resolve`; ``for_board``: a bundle, where an input
    shape contradicting a known crop is refused). A model returning several outputs (a tuple, list or
    dict, a Hugging Face ``ModelOutput``) answers with the one tensor ``output`` names, by index or
    key (default: the first tensor). What a split model cannot be (several required inputs, state
    changed by every call) is refused here, in the user's terms, before anything traces it."""
    if spec.startswith(TORCHVISION_PREFIX):
        loaded = _torchvision_model(spec.removeprefix(TORCHVISION_PREFIX), weights, preprocessing, input_shape,
                                    for_board)
    elif spec.startswith(TIMM_PREFIX):
        loaded = _timm_model(spec.removeprefix(TIMM_PREFIX), preprocessing, input_shape, for_board)
    else:
        loaded = _factory_model(spec, preprocessing, input_shape, for_board)
    if weights is not None:
        load_state_dict(loaded.module, weights)
    loaded.module.eval()
    loaded = _one_output(loaded, spec, output)
    _say_assumed(loaded, spec)
    return loaded


def _one_output(loaded: LoadedModel, spec: str, output: str | None) -> LoadedModel:
    """``loaded`` answering with one tensor: a model of several outputs keeps the one ``output``
    names, its class made a subclass whose ``forward`` returns that one (its modules, names and
    state dict unchanged, so cut ids and weights files are the model's own).

    The model runs twice on zeros: the first call may set itself up once (a lazy module, a cache of
    position embeddings); state the second one changes too would change on the board at every frame,
    where the exported graph keeps none of it."""
    module = loaded.module
    _one_input(module, spec)
    zeros = torch.zeros((1, *loaded.input_shape))
    try:
        with torch.no_grad():
            module(zeros)
            before = _state(module)
            answer = module(zeros)
    except Exception as exc:
        raise ModelSpecError(f"{spec} does not run on an input of shape {[1, *loaded.input_shape]}: "
                             f"{_raised(exc, getattr(sys.modules.get(type(module).__module__), '__file__', None))}; give the shape it takes "
                             "with --input-shape C,H,W") from exc
    changed = _changed(module, before)
    if changed:
        raise ModelSpecError(f"{spec}: {type(module).__name__}.forward changes {', '.join(changed)} at every call; "
                             "a split model must answer an input the same way each time (its exported parts keep no "
                             "state): move the update out of forward (into a method the training loop calls)")
    if isinstance(answer, torch.Tensor):
        if output not in (None, "0"):
            raise ModelSpecError(f"--output {output}: {spec} returns one tensor; leave --output out")
        return loaded
    outputs = dict(answer) if isinstance(answer, Mapping) else dict(enumerate(answer)) \
        if isinstance(answer, (tuple, list)) else {}
    tensors = [key for key, value in outputs.items() if isinstance(value, torch.Tensor)]
    listed = ", ".join(_described(key, value) for key, value in outputs.items())
    if not tensors:
        raise ModelSpecError(f"{spec} returns {type(answer).__name__}{f' ({listed})' if listed else ''}, no tensor "
                             "among its outputs; make forward return the logits")
    key: Any = tensors[0] if output is None else output
    if isinstance(answer, (tuple, list)) and isinstance(key, str):
        key = int(key) if key.isdigit() else key
    if key not in outputs:
        raise ModelSpecError(f"--output {output}: {spec} returns {len(outputs)} outputs: {listed}; "
                             "give one of their keys")
    if key not in tensors:
        raise ModelSpecError(f"--output {output}: {spec}'s output {_described(key, outputs[key])} is not a tensor; "
                             f"give one of {', '.join(map(str, tensors))}")
    base = type(module)

    def forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:  # one input, as fx traces it
        return base.forward(self, x)[key]
    module.__class__ = type(base.__name__, (base,), {"forward": forward, "__module__": base.__module__})
    return dataclasses.replace(loaded, output=f"{key} of {len(outputs)} outputs: {listed}")


def _one_input(module: torch.nn.Module, spec: str) -> None:
    """Refuse a forward that cannot take the one tensor a split model is fed (the board's camera
    frame, then each cut's tensor); inputs with defaults keep them."""
    try:
        parameters = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):  # a forward without a readable signature: calling it will tell
        return
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    required = [p.name for p in parameters if p.default is p.empty
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    cls = type(module).__name__
    if not positional:
        raise ModelSpecError(f"{spec}: {cls}.forward takes no input; a split model takes one tensor: give forward "
                             "a parameter for it")
    if len(required) > 1:
        raise ModelSpecError(
            f"{spec}: {cls}.forward takes {len(required)} required inputs ({', '.join(required)}); a split model "
            f"takes one tensor: wrap it in a module whose forward({required[0]}) builds {', '.join(required[1:])} "
            f"and calls {cls}")


def _state(module: torch.nn.Module) -> dict[str, Any]:
    """What a call could change: each buffer's values (copied; buffers are small) and each
    parameter's version counter (an in-place write bumps it; no copy of the weights)."""
    state: dict[str, Any] = {f"buffer {name}": buffer.detach().clone() for name, buffer in module.named_buffers()}
    state.update({f"parameter {name}": (param, param._version) for name, param in module.named_parameters()})
    return state


def _changed(module: torch.nn.Module, before: dict[str, Any]) -> list[str]:
    """The buffers and parameters a call changed, added or removed since ``before`` (:func:`_state`);
    a buffer written again with the same values (a scratch buffer) is no change."""
    after = _state(module)
    changed = sorted(set(before) ^ set(after))
    for name in sorted(set(before) & set(after)):
        old, new = before[name], after[name]
        if isinstance(old, tuple):
            if old[0] is not new[0] or old[1] != new[1]:
                changed.append(name)
        elif old.shape != new.shape or old.dtype != new.dtype or \
                not bool(torch.isclose(old, new, rtol=0, atol=0, equal_nan=True).all()):
            changed.append(name)
    return changed


def _described(key: Any, value: Any) -> str:
    """An output in the words of a listing: a tensor by its per-sample shape, anything else by its kind."""
    if isinstance(value, torch.Tensor):
        return f"{key} {list(value.shape[1:])}"
    if isinstance(value, (tuple, list)):
        return f"{key} ({type(value).__name__} of {len(value)})"
    return f"{key} ({type(value).__name__})"


def load_state_dict(module: torch.nn.Module, path: str | Path) -> None:
    """Load a state dict strictly, naming the missing and unexpected keys when it does not fit.

    ``weights_only=True`` refuses pickled code: a weights file must not be able to run
    anything on the machine that builds bundles.
    """
    path = Path(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError as exc:
        raise ModelSpecError(f"weights file {path} does not exist") from exc
    except Exception as exc:  # torch.load on a file that is not its own raises anything (IndexError, KeyError...)
        raise ModelSpecError(f"cannot read weights file {path}: not a (safe) torch state dict "
                             f"({type(exc).__name__}: {exc}); save one with torch.save(model.state_dict(), PATH)") \
            from exc
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ModelSpecError(f"weights file {path} does not hold a state dict (a mapping of names to tensors)")
    expected = set(module.state_dict())
    missing = sorted(expected - set(state))
    unexpected = sorted(set(state) - expected)
    if missing or unexpected:
        raise ModelSpecError(
            f"weights file {path} does not fit {type(module).__name__}: "
            f"missing keys {_preview(missing)}; unexpected keys {_preview(unexpected)}"
        )
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:  # same keys, different shapes
        raise ModelSpecError(f"weights file {path} does not fit {type(module).__name__}: {exc}") from exc


def read_labels(path: str | Path) -> tuple[str, ...]:
    """One label per line; blank trailing lines are ignored."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ModelSpecError(f"cannot read labels file {path}: {exc}") from exc
    while lines and not lines[-1].strip():
        lines.pop()
    return tuple(line.strip() for line in lines)


def _torchvision_model(name: str, weights: str | Path | None, flags: PreprocessFlags | None,
                       input_shape: tuple[int, ...] | None, strict: bool) -> LoadedModel:
    try:
        builder = torchvision.models.get_model_builder(name)
    except ValueError as exc:
        known = ", ".join(sorted(torchvision.models.list_models(module=torchvision.models)))
        segmentation = ", ".join(sorted(torchvision.models.list_models(module=torchvision.models.segmentation)))
        raise ModelSpecError(f"torchvision has no classification model {name!r}; known: {known} "
                             f"(segmentation: {segmentation})") from exc
    refused = next((why for family, why in REFUSED_FAMILIES.items() if builder.__module__.startswith(family)), None)
    if refused is not None:
        raise ModelSpecError(f"torchvision:{name}: {refused}")
    kwargs = dict(FACTORY_KWARGS.get(name, {}))
    if "weights_backbone" in inspect.signature(builder).parameters:
        # Segmentation and detection builders fetch ImageNet weights for their backbone unless told
        # not to; random weights must never need the network.
        kwargs["weights_backbone"] = None
    module = builder(weights=None, **kwargs)
    try:
        entries = list(torchvision.models.get_model_weights(name))
    except ValueError:  # an architecture without published weights: nothing to learn from
        entries = []
    entry = _matching_entry(entries, weights) if entries else None
    said = _preprocess_from(entry.transforms()) if entry is not None else {}
    crop = said.get("crop", IMAGENET_PREPROCESS.crop)
    if getattr(module, "image_size", None) not in (None, crop):
        # torchvision builds a ViT for the image size of the weights it loads (ViT-H/14's default, SWAG,
        # 518; ViT-B/16's SWAG 384), and for 224 with none: built again for the weights' own crop, their
        # position embeddings (and the board's input) fit.
        module = builder(weights=None, **kwargs, image_size=crop)
    categories = entry.meta.get("categories") if entry is not None else None
    return _loaded(name, module, [("the weights", said)] if said else [], None, flags, input_shape,
                   tuple(categories) if categories else None, f"torchvision:{name}", strict)


def _timm_model(name: str, flags: PreprocessFlags | None, input_shape: tuple[int, ...] | None,
                strict: bool) -> LoadedModel:
    try:
        timm = importlib.import_module("timm")
    except ImportError as exc:
        raise ModelSpecError(f"timm:{name} needs timm, which is not installed: pip install timm") from exc
    known = timm.list_pretrained() if "." in name else timm.list_models()
    if name not in known:
        close = difflib.get_close_matches(name, known, n=5)
        raise ModelSpecError(f"timm has no model {name!r}; "
                             + (f"close: {', '.join(close)}" if close else "timm.list_models() lists those it has"))
    try:
        module = timm.create_model(name, pretrained=False)  # random weights: never a download
    except Exception as exc:
        raise ModelSpecError(f"timm.create_model({name!r}) raised {_raised(exc, None)}") from exc
    return _loaded(name, module, [], None, flags, input_shape, None, f"timm:{name}", strict)


def _loaded(name: str, module: torch.nn.Module, weights_said: list[tuple[str, dict[str, Any]]],
            declared_preprocessing: Any, flags: PreprocessFlags | None, input_shape: tuple[int, ...] | None,
            categories: tuple[str, ...] | None, where: str, strict: bool) -> LoadedModel:
    if declared_preprocessing is not None and not isinstance(declared_preprocessing, dict):
        raise ModelSpecError(f"{where}.{PREPROCESSING}: expected a dict (or a function returning one), got "
                             f"{type(declared_preprocessing).__name__}")
    preprocess, shape, sources = resolve(IMAGENET_PREPROCESS, False, declared_preprocessing, flags, input_shape,
                                         where, strict, carried=[*weights_said, *carried(module)])
    return LoadedModel(name, module, preprocess, shape, categories, sources)


def _say_assumed(loaded: LoadedModel, spec: str) -> None:
    """One line (a warning: the CLI prints it as it is, --debug names the logger) for what nothing
    declared of the board's normalisation: a wrong one costs accuracy without any error."""
    assumed = guessed(loaded.sources)
    if assumed:
        values = ", ".join(f"{k} {_shown(getattr(loaded.preprocess, k))}" for k in assumed)
        log.warning("%s: nothing declares its %s: assumed ImageNet's (%s); set them with %s (or a factory's %s)",
                    spec, " / ".join(assumed), values, "/".join(f"--{k}" for k in assumed), PREPROCESSING)


def _shown(value: Any) -> str:
    return ",".join(f"{v:g}" for v in value) if isinstance(value, tuple) else str(value)


def _matching_entry(entries: list[Any], weights: str | Path | None) -> Any:
    """The weights enum entry a file came from, found by its published file name, else DEFAULT.

    Releases of one architecture differ in preprocessing (MobileNetV2's V1 weights,
    ``mobilenet_v2-b0353104.pth``, resize to 256; the V2 weights to 232), so a known
    file must get its own transforms, not those of the newest release.
    """
    if weights is not None:
        for entry in entries:
            if entry.url.rsplit("/", 1)[-1] == Path(weights).name:
                return entry
    return type(entries[0]).DEFAULT


def _preprocess_from(transforms: Any) -> dict[str, Any]:
    """What torchvision's preset says, in the board's terms. A preset without a crop (segmentation's
    resizes the whole image, 520 on its shorter side) says nothing of the board's square crop: its
    resize is left out with it, for the build to say they were assumed."""
    fields: dict[str, Any] = {}
    if hasattr(transforms, "resize_size") and hasattr(transforms, "crop_size"):
        fields.update(resize=int(transforms.resize_size[0]), crop=int(transforms.crop_size[0]))
    fields.update({key: tuple(float(v) for v in getattr(transforms, key)) for key in ("mean", "std")
                   if hasattr(transforms, key)})
    if hasattr(transforms, "interpolation"):
        fields["interpolation"] = transforms.interpolation.value
    return fields


def _factory_model(spec: str, flags: PreprocessFlags | None, input_shape: tuple[int, ...] | None,
                   strict: bool) -> LoadedModel:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ModelSpecError(
            f"bad model spec {spec!r}: expected torchvision:NAME or package.module:factory (or timm:NAME)"
        )
    try:
        with _current_directory_importable():
            py_module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelSpecError(f"bad model spec {spec!r}: cannot import {module_name!r} ({exc})") from exc
    except Exception as exc:  # the user's module raised while it was imported
        raise ModelSpecError(f"importing {module_name} raised {_raised(exc, None)}; fix the module, "
                             "then run the command again") from exc
    factory: Callable[[], Any] | None = getattr(py_module, attr, None)
    if not callable(factory):
        raise ModelSpecError(f"bad model spec {spec!r}: {module_name} has no callable {attr!r}")
    try:
        module = factory()
    except Exception as exc:
        raise ModelSpecError(f"the factory {spec} raised {_raised(exc, getattr(py_module, '__file__', None))}; fix the factory (or what it reads), "
                             "then run the command again") from exc
    if not isinstance(module, torch.nn.Module):
        raise ModelSpecError(f"{spec} returned {type(module).__name__}, not a torch.nn.Module")
    labels = declared(LABELS, module, factory, py_module)
    if labels is not None and (isinstance(labels, str) or not all(isinstance(x, str) for x in labels)):
        raise ModelSpecError(f"{spec}.{LABELS}: expected a list of class names")
    return _loaded(attr, module, [], declared(PREPROCESSING, module, factory, py_module), flags, input_shape,
                   tuple(labels) if labels is not None else None, spec, strict)


@contextlib.contextmanager
def _current_directory_importable() -> Iterator[None]:
    """The current directory first on ``sys.path`` while a factory's module is imported, as
    ``python -m`` has it: ``split-export points mynet:make`` finds ./mynet.py (a console script's
    own path is its bin directory, not where the user stands)."""
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        yield
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)


def _raised(exc: BaseException, home: str | None) -> str:
    """``Type: message at FILE:LINE`` for an exception from a user's code, the line the innermost
    one in their file ``home`` (else the innermost outside this module): where they would look."""
    frames = [(frame.f_code.co_filename, line) for frame, line in traceback.walk_tb(exc.__traceback__)
              if frame.f_code.co_filename != __file__]
    theirs = [f for f in frames if f[0] == home] or frames
    where = f" at {theirs[-1][0]}:{theirs[-1][1]}" if theirs else ""
    return f"{type(exc).__name__}: {exc}{where}"


def _preview(keys: list[str], limit: int = 5) -> str:
    if not keys:
        return "none"
    shown = ", ".join(keys[:limit])
    return f"{shown} (+{len(keys) - limit} more)" if len(keys) > limit else shown
