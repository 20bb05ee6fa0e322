"""Turn a MODEL spec from the command line into an ``nn.Module`` and what the bundle says about it.

Two spec forms: ``torchvision:NAME`` (any classification model torchvision's registry
knows; random weights unless a state dict is given) and ``package.module:factory`` (a
user's function returning an ``nn.Module``). Nothing is imported by evaluating strings:
the factory is looked up with ``importlib`` and ``getattr``.

What differs between torchvision models is read from torchvision's own metadata (the
weights enum's ``transforms()`` and ``meta["categories"]``) or, for constructor
arguments, from the :data:`FACTORY_KWARGS` table, never from ``if name == ...`` code.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import traceback
from collections.abc import Iterator
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torchvision

from device_runtime import Preprocess
from exporter.preprocessing import LABELS, PREPROCESSING, PreprocessFlags, declared, resolve
from splitedge import ModelSpecError

__all__ = ["LoadedModel", "FACTORY_KWARGS", "load_model", "load_state_dict", "read_labels"]

TORCHVISION_PREFIX = "torchvision:"

#: ImageNet normalisation, used when a model brings no transforms of its own.
IMAGENET_PREPROCESS = Preprocess(resize=256, crop=224, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))

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
    preprocessing and input shape resolved from the weights, the factory and ``preprocessing``
    (:func:`exporter.preprocessing.resolve`; ``for_board``: a bundle, where an input shape
    contradicting a known crop is refused). A model returning several tensors (a tuple, list or
    dict) answers with the one ``output`` names, by index or key (default: the first)."""
    if spec.startswith(TORCHVISION_PREFIX):
        loaded = _torchvision_model(spec.removeprefix(TORCHVISION_PREFIX), weights, preprocessing, input_shape,
                                    for_board)
    else:
        loaded = _factory_model(spec, preprocessing, input_shape, for_board)
    if weights is not None:
        load_state_dict(loaded.module, weights)
    loaded.module.eval()
    return _one_output(loaded, spec, output)


def _one_output(loaded: LoadedModel, spec: str, output: str | None) -> LoadedModel:
    """``loaded`` answering with one tensor: a model of several outputs keeps the one ``output``
    names, its class made a subclass whose ``forward`` returns that one (its modules, names and
    state dict unchanged, so cut ids and weights files are the model's own)."""
    module = loaded.module
    try:
        with torch.no_grad():
            answer = module(torch.zeros((1, *loaded.input_shape)))
    except Exception as exc:
        raise ModelSpecError(f"{spec} does not run on an input of shape {[1, *loaded.input_shape]}: "
                             f"{_raised(exc, getattr(sys.modules.get(type(module).__module__), '__file__', None))}; give the shape it takes "
                             "with --input-shape C,H,W") from exc
    if isinstance(answer, torch.Tensor):
        if output not in (None, "0"):
            raise ModelSpecError(f"--output {output}: {spec} returns one tensor; leave --output out")
        return loaded
    outputs = dict(answer) if isinstance(answer, dict) else dict(enumerate(answer)) \
        if isinstance(answer, (tuple, list)) else {}
    if not outputs or not all(isinstance(v, torch.Tensor) for v in outputs.values()):
        raise ModelSpecError(f"{spec} returns {type(answer).__name__}, not a tensor or a tuple, list or dict of "
                             "tensors; make forward return the logits")
    listed = ", ".join(f"{key} {list(value.shape[1:])}" for key, value in outputs.items())
    key: Any = next(iter(outputs)) if output is None else output
    if isinstance(answer, (tuple, list)) and isinstance(key, str):
        key = int(key) if key.isdigit() else key
    if key not in outputs:
        raise ModelSpecError(f"--output {output}: {spec} returns {len(outputs)} outputs: {listed}; "
                             "give one of their keys")
    base = type(module)

    def forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:  # one input, as fx traces it
        return base.forward(self, x)[key]
    module.__class__ = type(base.__name__, (base,), {"forward": forward, "__module__": base.__module__})
    return dataclasses.replace(loaded, output=f"{key} of {len(outputs)} outputs: {listed}")


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
        raise ModelSpecError(f"torchvision has no classification model {name!r}; known: {known}") from exc
    module = builder(weights=None, **FACTORY_KWARGS.get(name, {}))
    try:
        entries = list(torchvision.models.get_model_weights(name))
    except ValueError:  # an architecture without published weights: nothing to learn from
        entries = []
    entry = _matching_entry(entries, weights) if entries else None
    preprocess = _preprocess_from(entry.transforms()) if entry is not None else IMAGENET_PREPROCESS
    if getattr(module, "image_size", None) not in (None, preprocess.crop):
        # torchvision builds a ViT for the image size of the weights it loads (ViT-H/14's default, SWAG,
        # 518; ViT-B/16's SWAG 384), and for 224 with none: built again for the weights' own crop, their
        # position embeddings (and the board's input) fit.
        module = builder(weights=None, **FACTORY_KWARGS.get(name, {}), image_size=preprocess.crop)
    categories = entry.meta.get("categories") if entry is not None else None
    return _loaded(name, module, preprocess, preprocess is not IMAGENET_PREPROCESS, None, flags, input_shape,
                   tuple(categories) if categories else None, f"torchvision:{name}", strict)


def _loaded(name: str, module: torch.nn.Module, base: Preprocess, base_known: bool, declared_preprocessing: Any,
            flags: PreprocessFlags | None, input_shape: tuple[int, ...] | None,
            categories: tuple[str, ...] | None, where: str, strict: bool) -> LoadedModel:
    if declared_preprocessing is not None and not isinstance(declared_preprocessing, dict):
        raise ModelSpecError(f"{where}.{PREPROCESSING}: expected a dict (or a function returning one), got "
                             f"{type(declared_preprocessing).__name__}")
    preprocess, shape, sources = resolve(base, base_known, declared_preprocessing, flags, input_shape, where, strict)
    return LoadedModel(name, module, preprocess, shape, categories, sources)


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


def _preprocess_from(transforms: Any) -> Preprocess:
    """Read torchvision's ``ImageClassification`` preset; other presets get ImageNet defaults."""
    fields = ("resize_size", "crop_size", "mean", "std", "interpolation")
    if not all(hasattr(transforms, f) for f in fields):
        return IMAGENET_PREPROCESS
    return Preprocess(
        resize=int(transforms.resize_size[0]),
        crop=int(transforms.crop_size[0]),
        mean=tuple(float(m) for m in transforms.mean),
        std=tuple(float(s) for s in transforms.std),
        interpolation=transforms.interpolation.value,
    )


def _factory_model(spec: str, flags: PreprocessFlags | None, input_shape: tuple[int, ...] | None,
                   strict: bool) -> LoadedModel:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ModelSpecError(
            f"bad model spec {spec!r}: expected torchvision:NAME or package.module:factory"
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
    return _loaded(attr, module, IMAGENET_PREPROCESS, False, declared(PREPROCESSING, module, factory, py_module),
                   flags, input_shape, tuple(labels) if labels is not None else None, spec, strict)


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
