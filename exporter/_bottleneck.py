"""I-SPLIT's bottleneck: an under-complete autoencoder injected at a cut, trained, then fine-tuned.

I-SPLIT Sec. III-B/C: after the split layer, an encoder of two stride-2 convolutions squeezes
the cut tensor to a latent of ``latent_ratio`` of its size (10% in the paper); a decoder of
two layers restores the cut tensor's shape *exactly* — odd sizes included, through each
transposed convolution's ``output_padding`` — so the tail runs unchanged. The encoder goes
to the board with the head, the decoder to the host with the tail: the latent is what
crosses the link.

Training, as the paper does it: first the autoencoder alone on the frozen network's cut
features with the reconstruction loss (Eq. 3), then everything end to end with
cross-entropy (the role of Eq. 4), at a lower learning rate. With ``bits`` (``--bottleneck-bits``,
issue 47), the end-to-end phase sees the latent as the wire's k-bit coding sends it and is
distilled from the uncut model (:mod:`exporter._rate`).

A cut tensor without spatial extent (after flattening: (C,); after global pooling:
(C, 1, 1)) gets the same shape of autoencoder with linear layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from exporter._datasets import ImageSet
from exporter._rate import KBitQuantizer, distillation_loss

__all__ = [
    "Autoencoder", "BottleneckOptions", "BottleneckTraining", "SplitModel", "make_autoencoder", "train_bottleneck",
]


def _down(n: int) -> int:
    """Output size of a 3x3, stride-2, padding-1 convolution."""
    return (n - 1) // 2 + 1


def _up(cin: int, cout: int, n_in: tuple[int, int], n_out: tuple[int, int]) -> nn.ConvTranspose2d:
    """A stride-2 transposed convolution landing exactly on ``n_out``: (2n - 1) + output_padding."""
    padding_out = tuple(o - (2 * i - 1) for i, o in zip(n_in, n_out))
    assert all(p in (0, 1) for p in padding_out), (n_in, n_out)
    return nn.ConvTranspose2d(cin, cout, 3, stride=2, padding=1, output_padding=padding_out)


class Autoencoder(nn.Module):
    """``encoder`` (board side) and ``decoder`` (host side); ``latent_shape`` is what is sent."""

    def __init__(self, encoder: nn.Module, decoder: nn.Module, cut_shape: tuple[int, ...], latent_shape: tuple[int, ...]):
        super().__init__()
        self.encoder, self.decoder = encoder, decoder
        self.cut_shape, self.latent_shape = cut_shape, latent_shape

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(h))


def make_autoencoder(cut_shape: tuple[int, ...], latent_ratio: float = 0.1) -> Autoencoder:
    """An autoencoder for a per-sample cut tensor of ``cut_shape``: (C, H, W) or (C,)."""
    if not 0 < latent_ratio < 1:
        raise ValueError(f"latent ratio must be in (0, 1), got {latent_ratio}")
    size = math.prod(cut_shape)
    if len(cut_shape) == 3 and cut_shape[1:] == (1, 1):
        # A pooled (C, 1, 1) map has nothing for a 3x3 kernel to slide over: a stride-2 conv AE
        # there trained to 0.24 accuracy on fmnist_resnet where the linear one reached 0.85.
        flat = make_autoencoder((size,), latent_ratio)
        return Autoencoder(
            nn.Sequential(nn.Flatten(), flat.encoder),
            nn.Sequential(flat.decoder, nn.Unflatten(1, cut_shape)),
            cut_shape,
            flat.latent_shape,
        )
    if len(cut_shape) == 3:
        c, h, w = cut_shape
        h1, w1 = _down(h), _down(w)
        h2, w2 = _down(h1), _down(w1)
        latent_c = max(1, round(latent_ratio * size / (h2 * w2)))
        mid = max(latent_c, (c + latent_c) // 2)
        encoder = nn.Sequential(
            nn.Conv2d(c, mid, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(mid, latent_c, 3, stride=2, padding=1)
        )
        decoder = nn.Sequential(_up(latent_c, mid, (h2, w2), (h1, w1)), nn.ReLU(), _up(mid, c, (h1, w1), (h, w)))
        return Autoencoder(encoder, decoder, cut_shape, (latent_c, h2, w2))
    if len(cut_shape) == 1:
        latent = max(1, round(latent_ratio * size))
        mid = max(latent, (size + latent) // 2)
        encoder = nn.Sequential(nn.Linear(size, mid), nn.ReLU(), nn.Linear(mid, latent))
        decoder = nn.Sequential(nn.Linear(latent, mid), nn.ReLU(), nn.Linear(mid, size))
        return Autoencoder(encoder, decoder, cut_shape, (latent,))
    raise ValueError(f"a bottleneck needs a (C, H, W) or (C,) cut tensor, got {cut_shape}")


class SplitModel(nn.Module):
    """head → encoder ‖ link ‖ decoder → tail; ``board`` and ``host`` are the two exported halves."""

    def __init__(self, head: nn.Module, autoencoder: Autoencoder, tail: nn.Module) -> None:
        super().__init__()
        self.head, self.autoencoder, self.tail = head, autoencoder, tail

    @property
    def board(self) -> nn.Module:
        return nn.Sequential(self.head, self.autoencoder.encoder)

    @property
    def host(self) -> nn.Module:
        return nn.Sequential(self.autoencoder.decoder, self.tail)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tail(self.autoencoder(self.head(x)))


@dataclass(frozen=True)
class BottleneckTraining:
    """How the autoencoder is trained; the defaults are what the CUI experiment uses."""

    # Measured on fmnist_vgg (one epoch of training, 0.826 test accuracy), 5000 images, cuts
    # after its first and second pooling stages: (2 AE epochs at 1e-3, 1 fine-tuning epoch
    # at 1e-4) lost 4-5 points; these settings end at 0.839 / 0.841.
    ae_epochs: int = 2  # Eq. 3: reconstruction, network frozen
    finetune_epochs: int = 2  # end to end, cross-entropy
    batch_size: int = 128
    ae_lr: float = 3e-3
    finetune_lr: float = 1e-3
    seed: int = 0


@dataclass(frozen=True)
class BottleneckOptions:
    """``split-export build --bottleneck ae``: what to inject and what to train it on."""

    train_data: str
    test_data: str | None = None
    latent_ratio: float = 0.1  # I-SPLIT: the latent is 10% of the cut tensor
    train_images: int | None = None  # at most this many training images (stratified, seeded)
    training: BottleneckTraining = BottleneckTraining()
    #: The learned rate term (exporter._rate): the end-to-end phase trains through this k-bit
    #: coding of the latent, refitted on ``calibration_samples`` latents as the build's calibration
    #: fits it, and distils the uncut model. None: I-SPLIT's plain float latent.
    bits: int | None = None
    calibration_samples: int = 64
    #: Distil the uncut model without coding the latent: bench/fmnist_codings.py's ablation, which
    #: tells the rate term's gain from distillation's. ``bits`` always distils.
    distill: bool = False


def _batches(n: int, batch_size: int, rng: np.random.Generator, desc: str, progress: bool):
    order = rng.permutation(n)
    starts = range(0, n, batch_size)
    for start in tqdm(starts, desc=desc, unit="batch", disable=not progress, leave=False):
        yield torch.from_numpy(order[start : start + batch_size])


def train_bottleneck(
    model: SplitModel, data: ImageSet, config: BottleneckTraining = BottleneckTraining(), progress: bool = True,
    rate: KBitQuantizer | None = None, teacher: nn.Module | None = None,
) -> SplitModel:
    """I-SPLIT's two stages; with ``rate`` (and the uncut model as ``teacher``), the second codes
    the latent with it and distils ``teacher`` (:mod:`exporter._rate`); with ``teacher`` alone, it
    distils the float latent (the benchmark's ablation). Returns the model in eval mode; ``rate``
    keeps the coding it fitted last."""
    if rate is not None and teacher is None:
        raise ValueError("a learned rate term distils the uncut model: give the teacher")
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    x, y = torch.from_numpy(data.x), torch.from_numpy(data.y)
    # Stage 1 (Eq. 3): the network is frozen and in eval mode (BN statistics stay as trained);
    # only the autoencoder learns to reproduce the cut features.
    model.eval()
    model.autoencoder.train()
    optimiser = torch.optim.Adam(model.autoencoder.parameters(), lr=config.ae_lr)
    for epoch in range(config.ae_epochs):
        for idx in _batches(len(data), config.batch_size, rng, f"autoencoder {epoch + 1}/{config.ae_epochs}", progress):
            with torch.no_grad():
                h = model.head(x[idx])
            optimiser.zero_grad()
            nn.functional.mse_loss(model.autoencoder(h), h).backward()
            optimiser.step()
    # Stage 2: end to end with cross-entropy, gently, so the tail adapts to the reconstruction;
    # with a rate term, through the coded latent and towards the teacher's softened answers too.
    model.train()
    if teacher is not None:
        teacher.eval()
    optimiser = torch.optim.Adam(model.parameters(), lr=config.finetune_lr)
    for epoch in range(config.finetune_epochs):
        for idx in _batches(len(data), config.batch_size, rng, f"fine-tune {epoch + 1}/{config.finetune_epochs}", progress):
            optimiser.zero_grad()
            if teacher is None:
                loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
            else:
                latent = model.autoencoder.encoder(model.head(x[idx]))  # (B, *latent_shape)
                if rate is not None:
                    latent = rate(latent)  # as the host decodes it
                with torch.no_grad():
                    target = teacher(x[idx])
                loss = distillation_loss(model.tail(model.autoencoder.decoder(latent)), target, y[idx])
            loss.backward()
            optimiser.step()
    if rate is not None:
        rate.eval()
    return model.eval()
