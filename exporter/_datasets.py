"""Labelled image sets for analysis and training, from a ``--data`` spec.

Three forms, all offline:

- ``fashion-mnist`` (or ``fashion-mnist:train``): Debian's ``dataset-fashion-mnist``, read
  from its IDX files (test split by default: analysis belongs on held-out data);
- a folder with one sub-folder per class (``data/cat/*.jpg``), each image preprocessed
  exactly as the board will (the manifest's :class:`Preprocess`, in numpy);
- an ``.npz`` with arrays ``x`` (N, C, H, W float, already model input; or N, H, W[, C]
  uint8 images) and ``y`` (N integer labels), optionally ``classes`` (names).

Every set is checked against the model's input before anything runs, so a wrong size or
channel count is an error naming both shapes rather than a convolution failure.
"""

from __future__ import annotations

import difflib
import gzip
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from device_runtime import Preprocess
from device_runtime.engine import preprocess
from device_runtime.stream import IMAGE_SUFFIXES
from splitedge import SplitEdgeError

__all__ = ["DataError", "ImageSet", "FASHION_MNIST_CLASSES", "FASHION_MNIST_DIR", "TrainTest", "hold_out", "load_images",
           "training_spec",
           "photos", "read_synonyms", "train_test"]

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_CLASSES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)


class DataError(SplitEdgeError):
    """A data set cannot be read or does not fit the model."""


@dataclass(frozen=True)
class ImageSet:
    """Model-ready images and their labels."""

    x: np.ndarray  # (N, *input_shape) float32
    y: np.ndarray  # (N,) int64
    classes: tuple[str, ...]
    source: str
    labelled: bool = True  # False: y only numbers the folders (calibration images: only pixels count)

    def __len__(self) -> int:
        return len(self.y)

    def subset(self, n: int | None, seed: int = 0) -> "ImageSet":
        """At most ``n`` images, drawn without replacement and stratified by class, reproducibly."""
        if n is None or n >= len(self):
            return self
        rng = np.random.default_rng(seed)
        per_class = [rng.permutation(np.flatnonzero(self.y == c)) for c in np.unique(self.y)]
        # Round-robin over classes keeps the subset balanced when the full set is.
        order = [idx[i] for i in range(max(map(len, per_class))) for idx in per_class if i < len(idx)]
        chosen = np.sort(np.asarray(order[:n]))
        return ImageSet(self.x[chosen], self.y[chosen], self.classes, f"{self.source} ({n} of {len(self)})", self.labelled)

    def take(self, indices: np.ndarray, part: str) -> "ImageSet":
        return ImageSet(self.x[indices], self.y[indices], self.classes, f"{self.source} ({part})", self.labelled)


def hold_out(images: ImageSet, n_test: int, seed: int = 0) -> tuple[ImageSet, ImageSet]:
    """(the rest, ``n_test`` images held out), a seeded draw: what accuracy is measured on is
    never what was trained or calibrated on."""
    if not 0 < n_test < len(images):
        raise DataError(f"{images.source}: {len(images)} images are too few to hold {n_test} out for testing")
    order = np.random.default_rng(seed).permutation(len(images))
    return images.take(np.sort(order[n_test:]), "the rest"), images.take(np.sort(order[:n_test]), "held out")


def load_images(
    spec: str,
    input_shape: Sequence[int],
    preprocess_spec: Preprocess | None = None,
    model_classes: Sequence[str] | None = None,
    labelled: bool = True,
    synonyms: Mapping[str, str] | None = None,
) -> ImageSet:
    """Read ``spec`` and check it against a model taking ``input_shape`` (per sample).

    ``model_classes`` are the class names the model was trained on (ImageNet's for
    torchvision weights): class folders must be named after them or after one of their
    ``synonyms`` (:func:`match_folders`), so a folder ``espresso/`` means ImageNet class 967,
    not "the first folder". Without ``labelled`` (calibration images: only their pixels count)
    any folder names do, and the set says whether its labels are the model's
    (:attr:`ImageSet.labelled`).
    """
    if spec.startswith("fashion-mnist"):
        _, _, split = spec.partition(":")
        images = _fashion_mnist(split or "test")
        if tuple(input_shape) == (3, *images.x.shape[2:]):  # a camera model: the grey images as three equal channels
            x = np.broadcast_to(images.x, (len(images), 3, *images.x.shape[2:]))  # a view: copied only when taken
            images = ImageSet(x, images.y, images.classes, images.source, images.labelled)
    else:
        path = Path(spec)
        if path.suffix == ".npz":
            images = _npz(path, input_shape, preprocess_spec)
        elif path.is_dir():
            images = _folder(path, input_shape, preprocess_spec, model_classes, labelled, synonyms or {})
        else:
            raise DataError(f"--data {spec!r}: not 'fashion-mnist', a folder of class folders, or an .npz file")
    _check_fits(images, tuple(input_shape))
    return images


def training_spec(spec: str) -> str:
    """``spec`` as data to train or calibrate on: the bare ``fashion-mnist`` means its training
    split there (read alone, it is the test split, which accuracy is measured on)."""
    return "fashion-mnist:train" if spec == "fashion-mnist" else spec


@dataclass(frozen=True)
class TrainTest:
    train: ImageSet
    test: ImageSet


def train_test(
    train_spec: str,
    test_spec: str | None,
    input_shape: Sequence[int],
    preprocess_spec: Preprocess | None = None,
    model_classes: Sequence[str] | None = None,
    holdout: float = 0.2,
    seed: int = 0,
) -> TrainTest:
    """Training data and the data accuracy is measured on, never the same images.

    Fashion-MNIST has its own test split; any other set without ``test_spec`` gives a
    seeded ``holdout`` fraction of its images to the test side.
    """
    train_spec = training_spec(train_spec)
    train = load_images(train_spec, input_shape, preprocess_spec, model_classes)
    if test_spec is None and train_spec.startswith("fashion-mnist"):
        test_spec = "fashion-mnist:test"
    if test_spec is not None:
        return TrainTest(train, load_images(test_spec, input_shape, preprocess_spec, model_classes))
    return TrainTest(*hold_out(train, max(1, int(round(holdout * len(train)))), seed))


def _check_fits(images: ImageSet, input_shape: tuple[int, ...]) -> None:
    shape = tuple(images.x.shape[1:])
    if shape != input_shape:
        channels = "channel count" if shape[:1] != input_shape[:1] else "size"
        raise DataError(
            f"{images.source}: images are {'x'.join(map(str, shape))} but the model takes "
            f"{'x'.join(map(str, input_shape))} (wrong {channels})"
        )
    if len(images) == 0:
        raise DataError(f"{images.source}: no images")


def _read_idx(path: Path) -> np.ndarray:
    """IDX (the MNIST container): magic, dims, big-endian sizes, then uint8 data."""
    try:
        with gzip.open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise DataError(
            f"cannot read {path}: {exc}; install Debian's dataset-fashion-mnist (apt install dataset-fashion-mnist)"
        ) from exc
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise DataError(f"{path}: not an IDX file of unsigned bytes")
    dims = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def _fashion_mnist(split: str) -> ImageSet:
    prefix = {"test": "t10k", "train": "train"}.get(split)
    if prefix is None:
        raise DataError(f"fashion-mnist split {split!r}: use fashion-mnist:train or fashion-mnist:test")
    images = _read_idx(FASHION_MNIST_DIR / f"{prefix}-images-idx3-ubyte.gz")
    labels = _read_idx(FASHION_MNIST_DIR / f"{prefix}-labels-idx1-ubyte.gz")
    x = (images.astype(np.float32) / 255.0)[:, None]  # (N, 1, 28, 28) in [0, 1]
    return ImageSet(x, labels.astype(np.int64), FASHION_MNIST_CLASSES, f"fashion-mnist:{split}")


def _npz(path: Path, input_shape: Sequence[int], spec: Preprocess | None) -> ImageSet:
    try:
        with np.load(path) as data:
            x, y = data["x"], data["y"]
            classes = tuple(str(c) for c in data["classes"]) if "classes" in data else None
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot read {path}: {exc}") from exc
    except KeyError as exc:
        raise DataError(f"{path}: needs arrays 'x' and 'y' (has {exc})") from exc
    if x.dtype == np.uint8:
        x = _from_uint8(x, input_shape, spec, str(path))
    y = np.asarray(y).astype(np.int64).reshape(-1)
    if len(y) != len(x):
        raise DataError(f"{path}: {len(x)} images but {len(y)} labels")
    n_classes = int(y.max()) + 1 if len(y) else 0
    return ImageSet(x.astype(np.float32), y, classes or tuple(f"class_{i}" for i in range(n_classes)), str(path))


def _from_uint8(x: np.ndarray, input_shape: Sequence[int], spec: Preprocess | None, source: str) -> np.ndarray:
    """uint8 images: RGB (N, H, W, 3) go through the board's preprocessing, grey (N, H, W) are scaled."""
    if x.ndim == 4 and x.shape[-1] == 3 and spec is not None and tuple(input_shape)[0] == 3:
        return np.concatenate([preprocess(img, spec) for img in x])
    if x.ndim == 3:
        return (x.astype(np.float32) / 255.0)[:, None]
    raise DataError(f"{source}: uint8 images of shape {x.shape[1:]} cannot be fed to a model taking {tuple(input_shape)}")


def _decode(path: Path) -> np.ndarray:
    """An image file as the camera hands frames over: RGB uint8 (H, W, 3)."""
    from torchvision.io import ImageReadMode, decode_image

    try:
        return decode_image(str(path), mode=ImageReadMode.RGB).permute(1, 2, 0).numpy()
    except RuntimeError as exc:
        raise DataError(f"{path}: not a readable image ({exc})") from exc


def photos(spec: str, limit: int) -> list[np.ndarray]:
    """Up to ``limit`` of the photos a data spec holds, as RGB uint8 (H, W, 3) frames, spread over
    the whole set: a folder's images (in its class folders), an .npz's uint8 (N, H, W, 3) ``x``.
    Empty for sets that hold no photos (Fashion-MNIST, preprocessed arrays): nothing to compare
    two ways of resizing on."""
    path = Path(spec)
    if path.suffix == ".npz":
        try:
            with np.load(path) as data:
                x = data["x"]
        except (OSError, ValueError, KeyError) as exc:
            raise DataError(f"cannot read {path}: {exc}") from exc
        found = list(x) if x.dtype == np.uint8 and x.ndim == 4 and x.shape[-1] == 3 else []
        return found[:: max(1, -(-len(found) // limit))]
    if not path.is_dir():
        return []
    files = sorted(p for p in path.glob("*/*") if p.suffix.lower() in IMAGE_SUFFIXES)
    return [_decode(p) for p in files[:: max(1, -(-len(files) // limit))]]


def _normal(name: str) -> str:
    return " ".join(name.replace("_", " ").replace("-", " ").casefold().split())


def read_synonyms(path: str | Path, classes: Sequence[str]) -> dict[str, str]:
    """A synonyms file: one ``NAME = LABEL`` a line (``#`` comments), so a folder ``cat/`` can mean
    "tabby". Every LABEL must be one of the model's (matched as folders are), else the line is named."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read synonyms file {path}: {exc}") from exc
    loose = _loose(classes)
    synonyms = {}
    for number, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, label = (part.strip() for part in line.partition("="))
        if not sep or not name or not label:
            raise DataError(f"{path}:{number}: expected NAME = LABEL, got {line!r}")
        if _normal(label) not in loose:
            raise DataError(f"{path}:{number}: {label!r} is not a label of the model ({len(classes)} classes)")
        synonyms[_normal(name)] = classes[loose[_normal(label)]]
    return synonyms


def _loose(classes: Sequence[str]) -> dict[str, int]:
    loose: dict[str, int] = {}
    for i, c in enumerate(classes):
        loose.setdefault(_normal(c), i)
    return loose


def match_folders(
    names: Sequence[str], classes: Sequence[str], root: Path, synonyms: Mapping[str, str] | None = None
) -> list[int]:
    """The model's class index of each class folder: its label exactly, else the same words in
    another case or with ``_``/``-`` for spaces (``egyptian_cat/`` is "Egyptian cat"), else the
    label a ``synonyms`` entry (:func:`read_synonyms`) names for it. A folder matching no label is
    an error naming it (never "the first classes"): the accuracy and the CUI curve of an analysis
    are only as true as these labels."""
    exact = {c: i for i, c in enumerate(classes)}
    loose = _loose(classes)
    aliases = {alias: exact[label] for alias, label in (synonyms or {}).items()}
    found, unmatched = [], []
    for name in names:
        index = exact.get(name, loose.get(_normal(name), aliases.get(_normal(name))))
        if index is None:
            near = difflib.get_close_matches(_normal(name), list(loose), n=3, cutoff=0.6)
            unmatched.append(f"{name}/" + (f" (did you mean {', '.join(repr(classes[loose[n]]) for n in near)}?)"
                                           if near else ""))
        found.append(index)
    if unmatched:
        raise DataError(f"{root}: class folder(s) {'; '.join(unmatched)} match no label of the model "
                        f"({len(classes)} classes, e.g. {', '.join(map(repr, classes[:3]))}): rename each folder "
                        "after the label it holds, or name its label in a --synonyms file (a line 'cat = tabby')")
    return [i for i in found if i is not None]


def _folder(
    root: Path, input_shape: Sequence[int], spec: Preprocess | None, model_classes: Sequence[str] | None,
    labelled: bool = True,
    synonyms: Mapping[str, str] | None = None,
) -> ImageSet:
    class_dirs = sorted(p for p in root.iterdir() if p.is_dir())
    if not class_dirs:
        raise DataError(f"{root}: no class sub-folders (expected {root}/<class>/<image>)")
    names = [p.name for p in class_dirs]
    # Without the model's class names, folder order is all there is (labels only if asked for).
    classes, labels, named = tuple(names), list(range(len(names))), labelled and not model_classes
    if model_classes:
        try:
            classes, labels, named = tuple(model_classes), match_folders(names, model_classes, root, synonyms), True
        except DataError:
            if labelled:
                raise
    xs, ys = [], []
    for label, folder in zip(labels, class_dirs):
        for path in sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES):
            image = _decode(path)
            if spec is None or tuple(input_shape)[0] != 3:
                raise DataError(f"{path}: RGB photos need a model taking 3 channels, this one takes {tuple(input_shape)}")
            xs.append(preprocess(image, spec))
            ys.append(label)
    if not xs:
        raise DataError(f"{root}: the class folders hold no images ({', '.join(IMAGE_SUFFIXES)})")
    return ImageSet(np.concatenate(xs), np.asarray(ys, dtype=np.int64), classes, str(root), labelled=named)
