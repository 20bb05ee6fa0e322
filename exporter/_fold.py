"""The model's normalisation folded into the artifacts the board feeds (heads, the full model).

A board that normalises each frame itself pays for it in float32 arithmetic on the frame's every
value and must send float32 for full offload. Folded, the artifacts take the crop's pixel values
(0-255, float32) and apply ``(x / 255 - mean) / std`` as their first operation, so the board
hands over the uint8 crop as it is (issue 29). The rest of the build keeps torch's view (normalised
inputs: training, torch references): artifacts are validated against the unfolded torch module
with the normalisation applied outside it (:func:`normalise`), and data sets in torch's view are
turned back into pixels (:func:`pixels`) before an artifact sees them.
"""

from __future__ import annotations

import numpy as np
import torch

from device_runtime import Preprocess

__all__ = ["Folded", "normalise", "pixels"]


def _scale_shift(spec: Preprocess) -> tuple[np.ndarray, np.ndarray]:
    """Per channel, (1 / (255 std), -mean / std): ``normalised = pixels * scale + shift``."""
    std = np.asarray(spec.std, dtype=np.float64)[:, None, None]
    mean = np.asarray(spec.mean, dtype=np.float64)[:, None, None]
    return 1.0 / (255.0 * std), -mean / std


class Folded(torch.nn.Module):
    """``module`` taking the crop's pixels: one multiply and one add per value before it, as a
    per-channel 1x1 convolution. A broadcast multiply by a (1, C, 1, 1) constant is the same
    arithmetic, but litert-torch cannot convert it against a dynamic batch (it broadcasts the
    batch's symbolic size as a negative one); a convolution converts everywhere, ONNX and TFLite,
    float32 and int8."""

    def __init__(self, module: torch.nn.Module, spec: Preprocess) -> None:
        super().__init__()
        self.module = module
        scale, shift = _scale_shift(spec)
        channels = scale.shape[0]
        self.register_buffer("weight", torch.tensor(scale, dtype=torch.float32).reshape(channels, 1, 1, 1))
        self.register_buffer("bias", torch.tensor(shift, dtype=torch.float32).reshape(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(torch.nn.functional.conv2d(x, self.weight, self.bias, groups=self.weight.shape[0]))


def described(role: str, module: torch.nn.Module) -> str:
    """``the head``, ``the full ResNet``: a part named by its role and the user's class under the
    exporter's wrappers (a folded normalisation); a piece of graph the exporter cut (an fx
    ``GraphModule``) by its role alone, as the file's name tells which."""
    while isinstance(module, Folded):
        module = module.module
    name = type(module).__name__
    return f"the {role}" if name == "GraphModule" else f"the {role} {name}"


def normalise(x: np.ndarray, spec: Preprocess) -> np.ndarray:
    """Pixels (N, C, H, W) as torch's module takes them: the normalisation, applied outside it."""
    scale, shift = _scale_shift(spec)
    return (x * scale + shift).astype(np.float32)


def pixels(x: np.ndarray, spec: Preprocess) -> np.ndarray:
    """Normalised inputs (N, C, H, W) back to the pixels a folded artifact takes."""
    scale, shift = _scale_shift(spec)
    return ((x - shift) / scale).astype(np.float32)
