"""A cut's bytes per sample are measured, never inferred from batch 1 (issue 44).

After a window or patch partition a tensor's first dimension is the batch times the windows. The
exporter once read that dimension as the batch, both where it folds sizes (``x.size(0) * a + b``)
and where it costs a cut, and listed the window cuts of the model below at a quarter, a sixteenth
and a sixty-fourth of what their heads emit, with a bundle that validated.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from exporter._graph import find_cut_points, split_at, split_chain, trace

SHAPE = (3, 64, 64)


def windows(x: torch.Tensor, n: int) -> torch.Tensor:
    """(B, C, H, W) as (B * n * n, C, H / n, W / n): the windows of each sample, sample by sample."""
    b, c, h, w = x.shape
    x = x.reshape(b, c, n, h // n, n, w // n).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b * n * n, c, h // n, w // n)


def merged(x: torch.Tensor, n: int) -> torch.Tensor:
    """The inverse of :func:`windows`."""
    bn, c, h, w = x.shape
    b = bn // (n * n)
    return x.reshape(b, n, n, c, h, w).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h * n, w * n)


class Windowed(nn.Module):
    """A user's window model: convolutions inside 2x2 and 4x4 windows of a 16-channel map."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 2, stride=2)
        self.inside = nn.Conv2d(16, 16, 3, padding=1)
        self.smaller = nn.Conv2d(16, 4, 3, padding=1)
        self.fc = nn.Linear(4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(x))                     # (B, 16, 32, 32)
        x = torch.relu(self.inside(windows(x, 2)))       # (4B, 16, 16, 16)
        x = merged(x, 2)
        x = torch.relu(self.smaller(windows(x, 4)))      # (16B, 4, 8, 8)
        return self.fc(merged(x, 4).mean((2, 3)))


class WindowMajor(Windowed):
    """The windows of all samples ordered window by window: rows of one sample are not together."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(x))
        w = windows(x, 2)
        w = w.reshape(x.shape[0], 4, *w.shape[1:]).transpose(0, 1).reshape(-1, *w.shape[1:])
        w = torch.relu(self.inside(w))
        w = w.reshape(4, x.shape[0], *w.shape[1:]).transpose(0, 1).reshape(-1, *w.shape[1:])
        return self.fc(self.smaller(merged(w, 2)).mean((2, 3)))


class SequenceFirst(nn.Module):
    """Tokens as (L, B, E), the layout of nn.MultiheadAttention without batch_first."""

    def __init__(self) -> None:
        super().__init__()
        self.patches = nn.Conv2d(3, 8, 8, stride=8)
        self.mix = nn.Linear(8, 8)
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patches(x).flatten(2).permute(2, 0, 1)  # (64, B, 8)
        tokens = torch.relu(self.mix(tokens))
        return self.fc(tokens.mean(0))


def _emitted(head: nn.Module, batch: int) -> torch.Tensor:
    with torch.no_grad():
        return head(torch.randn(batch, *SHAPE))


def test_each_cut_lists_the_bytes_its_head_really_emits_per_sample() -> None:
    torch.manual_seed(0)
    model = Windowed().eval()
    traced = trace(model, SHAPE)
    cuts = find_cut_points(traced)
    grouped = [c for c in cuts if c.rows > 1]
    assert {c.rows for c in grouped} == {4, 16}  # the 2x2 and the 4x4 windows are offered
    for cut in cuts:
        head, tail = split_at(traced, cut.id)
        for batch in (1, 3):
            out = _emitted(head, batch)
            assert out.shape == (batch, *cut.shape), cut.id
            assert out.numel() * out.element_size() == cut.bytes_per_sample * batch, cut.id
            x = torch.randn(batch, *SHAPE)
            with torch.no_grad():
                np.testing.assert_allclose(tail(head(x)).numpy(), model(x).numpy(), rtol=1e-4, atol=1e-5)
    inside = next(c for c in cuts if c.id == "inside")
    assert inside.shape == (4, 16, 16, 16) and inside.bytes_per_sample == 4 * 16 * 16 * 16 * 4  # not 16 * 16 * 16 * 4


def test_a_grouped_cut_crosses_with_the_batch_first_so_requests_concatenate() -> None:
    """A host batches requests by concatenating them on the first dimension: two samples' heads,
    concatenated, must give the tail what one batch of both gives."""
    torch.manual_seed(0)
    model = Windowed().eval()
    traced = trace(model, SHAPE)
    head, tail = split_at(traced, "inside")
    a, b = torch.randn(1, *SHAPE), torch.randn(2, *SHAPE)
    with torch.no_grad():
        joined = tail(torch.cat([head(a), head(b)]))
        np.testing.assert_allclose(joined.numpy(), model(torch.cat([a, b])).numpy(), rtol=1e-4, atol=1e-5)


def test_a_chain_through_grouped_cuts_is_the_model() -> None:
    torch.manual_seed(0)
    model = Windowed().eval()
    traced = trace(model, SHAPE)
    ids = [c.id for c in find_cut_points(traced) if c.rows > 1][:2]
    stages = split_chain(traced, ids)
    x = torch.randn(3, *SHAPE)
    with torch.no_grad():
        value = x
        for stage in stages:
            value = stage(value)
        np.testing.assert_allclose(value.numpy(), model(x).numpy(), rtol=1e-4, atol=1e-5)


def test_rows_not_in_sample_order_are_not_offered() -> None:
    model = WindowMajor().eval()
    traced = trace(model, SHAPE)
    ids = [c.id for c in find_cut_points(traced)]
    assert "inside" not in ids and "relu_1" not in ids  # computed on the windows in window order
    assert "stem" in ids and "reshape_1" in ids  # batch first, and the windows still sample by sample


def test_a_batch_in_another_dimension_is_not_a_cut() -> None:
    model = SequenceFirst().eval()
    ids = [c.id for c in find_cut_points(trace(model, SHAPE))]
    assert ids == ["patches", "flatten", "mean"]  # (64, B, 8) from the permute to the mean never crosses


@pytest.mark.parametrize("name", ["mobilevit_xxs", "efficientvit_b0"])
def test_timm_edge_models_trace_and_cut_right(name: str) -> None:
    """MobileViT partitions patches (the size fold read them as the batch: a reshape that failed);
    EfficientViT-B asks ``torch.autocast(device_type=x.device.type)``. At 128 px, to be quick;
    bench/zoo.py --family timm builds them at their own size."""
    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False).eval()
    shape = (3, 128, 128)
    traced = trace(model, shape)
    cuts = find_cut_points(traced)
    assert len(cuts) > 50
    x = torch.randn(2, *shape)
    with torch.no_grad():
        expected = model(x)
        for cut in [c for c in cuts if c.compressive][:3] + [c for c in cuts if c.rows > 1][:2]:
            head, tail = split_at(traced, cut.id)
            out = head(x)
            assert out.shape == (2, *cut.shape)
            assert out.numel() * out.element_size() == 2 * cut.bytes_per_sample
            np.testing.assert_allclose(tail(out).numpy(), expected.numpy(), rtol=1e-3, atol=1e-4)
