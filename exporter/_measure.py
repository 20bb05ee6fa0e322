"""Top-1 of exported artifacts on an image set, and of a head whose cut crosses a lossy link.

One measuring loop serves every figure a bundle records: a whole runner's top-1 (a full model, a
head and its tail) and, for the cut codings of issue 47, one head run per batch followed by each
link's round trip (float32, uint8, k bits) and the hosts' part, so the head is run once per image
however many codings are measured, and every coding is measured on the same images and the same
cut values. Labels are the images' own, or the float32 model's answers (agreement).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from device_runtime import Quantization
from device_runtime.wire import dequantize, quantize
from exporter._datasets import ImageSet
from exporter._validate import Runner

__all__ = ["BATCH", "Link", "RoundTrip", "top1", "top1_each", "uint8_round_trip"]

#: Images per run of an artifact: what onnxruntime takes at once without a 224x224 early cut of 256
#: images (400 MB) growing past a workstation's memory.
BATCH = 256

#: What crosses a link: the head's cut (``[N, C, ...]`` float32) in, what the host dequantizes out.
RoundTrip = Callable[[np.ndarray], np.ndarray]


def uint8_round_trip(q: Quantization) -> RoundTrip:
    """The affine uint8 link (:mod:`device_runtime.wire._quantization`) of parameters ``q``."""
    return lambda cut: dequantize(quantize(cut, q.scale, q.zero_point), q.scale, q.zero_point)


class Link:
    """A head followed by a lossy link (``round_trip``: the uint8 cut, a k-bit coding): what the
    board's head, as the host sees it, gives. A runner like any other, so it chains with the tail."""

    def __init__(self, head: Runner, round_trip: RoundTrip) -> None:
        self.head, self.round_trip = head, round_trip
        self.input_names, self.output_names = head.input_names, head.output_names

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {k: self.round_trip(v) for k, v in self.head(feeds).items()}


def top1(runner: Runner, images: ImageSet, batch: int = BATCH) -> float:
    """The share of ``images`` whose top-1 answer from ``runner`` is their label."""
    return top1_each(runner, {"": lambda outputs: outputs}, images, batch)[""]


def top1_each(
    first: Runner, then: Mapping[str, Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]], images: ImageSet,
    batch: int = BATCH, advance: Callable[[int], object] | None = None,
) -> dict[str, float]:
    """Top-1 of ``first`` followed by each of ``then`` (name: what turns ``first``'s outputs into the
    answer, a single output), ``first`` run once per batch for all of them; ``advance(n)`` after each
    batch of ``n`` images (a progress bar's update)."""
    (input_name,) = first.input_names
    hits = dict.fromkeys(then, 0)
    for start in range(0, len(images), batch):
        x, y = images.x[start : start + batch], images.y[start : start + batch]
        outputs = first({input_name: x})
        for name, answer in then.items():
            (logits,) = answer(outputs).values()
            hits[name] += int((logits.argmax(1) == y).sum())
        if advance is not None:
            advance(len(y))
    return {name: count / len(images) for name, count in hits.items()}
