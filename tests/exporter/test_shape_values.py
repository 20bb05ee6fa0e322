"""Shape-only values a model's Python asks for are answered, as ``if`` and ``len()`` already were;
what still cannot be traced is refused in one line naming the user's line (issue 44)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from exporter._graph import find_cut_points, split_at, trace
from splitedge.errors import CutPointError

SHAPE = (3, 32, 32)


class Conv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.fc = nn.Linear(8, 10)


class Unpacked(Conv):
    """Hugging Face's ``(*input_shape, -1, head_dim)`` and ``batch, c, h, w = x.shape``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(x)
        batch, channels, height, width = x.shape
        tokens = x.reshape(*x.shape[:2], -1).transpose(1, 2)          # (B, HW, C)
        heads = tokens.reshape(*tokens.shape[:-1], 2, channels // 2)  # (B, HW, 2, C/2)
        x = heads.reshape(batch, height, width, channels).permute(0, 3, 1, 2)
        return self.fc(self.b(x).mean((2, 3)))


class Rounded(Conv):
    """MobileViT's ``int(math.ceil(height / patch) * patch)``, and ``range()`` over a size."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(x)
        patch = 5
        padded = int(math.ceil(x.shape[-1] / patch) * patch)
        x = nn.functional.interpolate(x, size=(padded, padded), mode="bilinear", align_corners=False)
        for _ in range(x.dim() - 3):
            x = torch.relu(x)
        return self.fc(self.b(x).mean((2, 3)))


class OnDevice(Conv):
    """EfficientViT-B's ``torch.autocast(device_type=x.device.type, enabled=False)`` and a dtype read."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(x)
        with torch.autocast(device_type=x.device.type, enabled=False):
            x = torch.relu(x.to(x.dtype))
        scale = torch.ones(1, dtype=x.dtype, device=x.device)
        return self.fc((self.b(x) * scale).mean((2, 3)))


class Masked(Conv):
    """An optional second input, left to its default when the model is split."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, *, scale: float = 1.0) -> torch.Tensor:
        x = self.a(x) * scale
        if mask is not None:
            x = x * mask
        return self.fc(self.b(x).mean((2, 3)))


class TwoInputs(Conv):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.fc(self.b(self.a(x) + y).mean((2, 3)))


class RowByRow(Conv):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = [r.sum() for r in self.a(x)]  # iterates over the batch's values
        return self.fc(self.b(self.a(x)).mean((2, 3))) + sum(rows)


class BatchInt(Conv):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch = int(x.shape[0])
        return self.fc(self.b(self.a(x)).mean((2, 3))).reshape(batch, 10)


@pytest.mark.parametrize("cls", [Unpacked, Rounded, OnDevice, Masked])
def test_a_model_asking_shape_values_traces_and_every_cut_is_the_model(cls: type[nn.Module]) -> None:
    torch.manual_seed(0)
    model = cls().eval()
    traced = trace(model, SHAPE)
    cuts = find_cut_points(traced)
    assert cuts
    x = torch.randn(3, *SHAPE)
    with torch.no_grad():
        expected = model(x)
        for cut in cuts:
            head, tail = split_at(traced, cut.id)
            np.testing.assert_allclose(tail(head(x)).numpy(), expected.numpy(), rtol=1e-4, atol=1e-5)


def test_tracing_leaves_the_model_as_it_was() -> None:
    model = Masked().eval()
    trace(model, SHAPE)
    assert type(model) is Masked
    model(torch.zeros(1, *SHAPE), torch.ones(1, 8, 32, 32))  # still takes its mask


def test_a_second_required_input_is_refused_naming_both() -> None:
    with pytest.raises(CutPointError) as caught:
        trace(TwoInputs().eval(), SHAPE)
    message = str(caught.value)
    assert "TwoInputs.forward takes 2 required inputs (x, y)" in message and "wrap it" in message
    assert "\n" not in message


def test_iterating_over_values_names_the_users_line_without_torch_fx_internals() -> None:
    with pytest.raises(CutPointError) as caught:
        trace(RowByRow().eval(), SHAPE)
    message = str(caught.value)
    assert f"{__file__}:" in message and "for r in self.a(x)" in message
    assert "Proxy" not in message and "\n" not in message


def test_an_int_of_the_batch_size_is_refused_naming_the_line() -> None:
    with pytest.raises(CutPointError) as caught:
        trace(BatchInt().eval(), SHAPE)
    message = str(caught.value)
    assert "takes int() of the batch size" in message and "int(x.shape[0])" in message


def test_a_wrong_input_shape_names_the_users_line_and_the_flag() -> None:
    class Fixed(Conv):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(self.b(self.a(x)).flatten(1)[:, :8] + self.b(self.a(x)).reshape(-1, 8 * 16 * 16)[:, :8])

    with pytest.raises(CutPointError) as caught:
        trace(Fixed().eval(), (3, 30, 30))
    message = str(caught.value)
    assert "does not run on an input of shape (1, 3, 30, 30)" in message and "--input-shape" in message
    assert f"{__file__}:" in message and "ShapeProp" not in message and "\n" not in message
