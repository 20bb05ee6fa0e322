"""A semantic split's merge on the board: fragments' logits into label order, missing groups absent."""

from __future__ import annotations

import numpy as np
import pytest

from device_runtime.bundle import SEMANTIC, Fragment, Split, TensorSpec
from device_runtime.stream._fragments import merge
from device_runtime.stream._results import top1
from splitedge.errors import HostUnavailableError

GROUPS = ((3, 0, 7), (1, 2), (4, 5, 6))


def semantic_split(groups=GROUPS) -> Split:
    fragments = tuple(Fragment(k, classes, ()) for k, classes in enumerate(groups, 1))
    return Split("cut~3", 5, SEMANTIC, TensorSpec((4, 2, 2), "float32", 64), 0.1, True, True, (), fragments=fragments)


def test_the_fragments_logits_land_on_their_labels() -> None:
    rng = np.random.default_rng(0)
    outputs = {k: rng.normal(size=(2, len(g))).astype(np.float32) for k, g in enumerate(GROUPS, 1)}
    logits = merge(semantic_split(), 8, outputs, batch=2)
    expected = np.empty((2, 8), np.float32)
    for k, group in enumerate(GROUPS, 1):
        for column, label in enumerate(group):
            expected[:, label] = outputs[k][:, column]
    np.testing.assert_array_equal(logits, expected)


def test_a_missing_group_is_scored_absent() -> None:
    outputs = {1: np.array([[0.0, 5.0, 1.0]], np.float32), 3: np.array([[2.0, 0.0, 0.0]], np.float32)}
    logits = merge(semantic_split(), 8, outputs, batch=1)
    assert np.isneginf(logits[0, [1, 2]]).all()
    label, probability = top1(logits[0], [f"c{i}" for i in range(8)])
    assert label == "c0"  # fragment 1's second column is label 0
    shifted = np.exp(logits[0] - logits[0].max())
    assert shifted[[1, 2]].sum() == 0.0 and probability == pytest.approx(shifted.max() / shifted.sum())


def test_an_output_of_the_wrong_shape_is_refused() -> None:
    with pytest.raises(HostUnavailableError, match=r"fragment 2 of cut~3 answered shape \(1, 3\), expected \(1, 2\)"):
        merge(semantic_split(), 8, {2: np.zeros((1, 3), np.float32)}, batch=1)
