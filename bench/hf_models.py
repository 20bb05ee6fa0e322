"""Hugging Face vision models for the zoo (``bench/zoo.py --family hf``), as ``hf_models:NAME`` specs.

No machine here reaches the hub, so each model is built from its config at the sizes of a published
checkpoint, with random weights (seeded: every run exports the same model). What ``split-export``
makes of a transformers model (its forward's keyword arguments, its ``ModelOutput``, its config) is
the question; its weights are not. Each factory declares its checkpoint's image processor in the
board's terms, since no ``preprocessor_config.json`` lies beside a model built from a config.
"""

from __future__ import annotations

import torch
from transformers import DeiTConfig, DeiTForImageClassification, MobileViTConfig, MobileViTForImageClassification

__all__ = ["deit_tiny", "mobilevit_xx_small"]

SEED = 0
IMAGENET_CLASSES = 1000  # both checkpoints classify ImageNet-1k; a config's own default is 2 labels


def deit_tiny() -> torch.nn.Module:
    """facebook/deit-tiny-patch16-224: a ViT of 12 layers, width 192, 3 heads, 16-pixel patches."""
    torch.manual_seed(SEED)
    return DeiTForImageClassification(DeiTConfig(hidden_size=192, num_hidden_layers=12, num_attention_heads=3,
                                                 intermediate_size=768, num_labels=IMAGENET_CLASSES))


# Its processor: resized to 256 (bicubic), the centre 224 cropped, ImageNet's mean and std.
deit_tiny.splitedge_preprocessing = {  # type: ignore[attr-defined]
    "resize": 256, "crop": 224, "interpolation": "bicubic",
    "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225],
}


def mobilevit_xx_small() -> torch.nn.Module:
    """apple/mobilevit-xx-small: MobileNetV2 blocks and three MobileViT blocks of widths 64, 80, 96.

    Its convolutions and linear layers are drawn again, scaled by their fan-in (Kaiming): Hugging
    Face draws every weight from N(0, 0.02), which shrinks the activations layer after layer to
    logits of 1e-42, subnormal, where float32 keeps no relative precision and an artifact would be
    compared with torch's rounding noise; drawn again, they are about 1e-5, as a model's outputs go.
    """
    torch.manual_seed(SEED)
    model = MobileViTForImageClassification(MobileViTConfig(
        hidden_sizes=[64, 80, 96], neck_hidden_sizes=[16, 16, 24, 48, 64, 80, 320], expand_ratio=2.0,
        num_labels=IMAGENET_CLASSES))
    for layer in model.modules():
        if isinstance(layer, (torch.nn.Conv2d, torch.nn.Linear)):
            torch.nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")
    return model


# Its processor: shorter side 288, the centre 256 cropped, pixels scaled to [0, 1] with no
# normalisation, channels flipped to BGR.
mobilevit_xx_small.splitedge_preprocessing = {  # type: ignore[attr-defined]
    "resize": 288, "crop": 256, "mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0], "color": "BGR",
}
