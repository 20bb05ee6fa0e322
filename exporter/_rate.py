"""A learned rate term for the I-SPLIT bottleneck (``--bottleneck-bits K``, issue 47 point 5).

The autoencoder's end-to-end phase (:func:`exporter._bottleneck.train_bottleneck`, stage 2) trains
with the latent passed through the very k-bit coding the wire will send
(:class:`device_runtime.wire.coding.CutCoding`), and is distilled from the full model:

* **Forward**: each batch's latent is replaced by ``CutCoding.decode(CutCoding.encode(z))``,
  computed in torch with the same float32 operations (round half to even, saturate, per-channel
  affine), so the tail is trained on the values the host will decode, bit for bit
  (tests/exporter/test_learned_rate.py holds it to the wire's own encode and decode).
* **Range**: tracked, not learned. The coding is refitted at every step by ``CutCoding.calibrate``
  itself on the latents of the last ``samples`` training images (the build's ``--calib-samples``),
  so it is the least-squared-error, clip-searched fit the build will make on the calibration
  images after training, and it pools the channels exactly where the build will (a channel seen
  fewer than ``MIN_CHANNEL_VALUES`` times shares one range). A learned range (LSQ, PACT) would
  train the tail on ranges the wire never uses: the build calibrates its own afterwards. What is
  left of the mismatch is images and weights: the build fits on other images (the calibration
  set) with the final weights; the test measures what that costs.
* **Backward**: straight through (Bengio et al. 2013) inside the coding's range, zero outside it
  (a saturated value gets no gradient, as clipping would give it none).
* **Distillation** (Hinton et al. 2015; the Entropic Student and BottleFit of the SC2 benchmark do
  the same): the loss is ``KD_WEIGHT * T**2 * KL(teacher_T || student_T) + (1 - KD_WEIGHT) *
  CE(student, labels)`` with ``T = TEMPERATURE``, the teacher the uncut model, frozen, in eval mode.

Why a k-bit quantizer with a straight-through estimator rather than a factorized entropy
bottleneck (Ballé et al. 2018): the wire sends fixed-width packed codes (``k8`` .. ``k2``) and no
entropy coder exists yet on the board or the host (point 2 of the issue is still open), so a
learned prior's CDF tables would have nothing to run them, and its rate would be a figure no frame
realises; the STE trains exactly the code that crosses today. ``bench/fmnist_codings.py`` also
measures each coded latent's empirical entropy (bits a value under a per-channel histogram): what
an entropy coder could still take off the k-bit code, once one exists.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import torch
from torch import nn

from device_runtime.bundle import CUT_BITS
from device_runtime.wire.coding import CutCoding

__all__ = ["KD_WEIGHT", "TEMPERATURE", "KBitQuantizer", "distillation_loss", "quantize_like_wire"]

#: Softening of both models' logits for the KL term (Hinton et al. 2015 use 2-20; 4 is the common
#: choice for 10 classes). Not tuned on Fashion-MNIST: a fixed, stated choice.
TEMPERATURE = 4.0
#: The KL term's share of the loss; the rest is cross-entropy on the labels.
KD_WEIGHT = 0.5


class _StraightThrough(torch.autograd.Function):
    """Forward: the coding's round trip (exact). Backward: the gradient where the value lies in the
    coding's range, zero where it saturated."""

    @staticmethod
    def forward(ctx, z: torch.Tensor, inverse: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                levels: int) -> torch.Tensor:
        # The numpy of CutCoding.encode then decode, in float32: rint(z * (1 / s)) + zero (a multiply
        # by the float32 inverse, as encode computes it: a divide rounds differently at a few values),
        # clipped to 0..levels, then (q - zero) * s.
        q = torch.round(z * inverse) + zero
        ctx.save_for_backward((q >= 0) & (q <= levels))
        return (q.clamp(0, levels) - zero) * scale

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (inside,) = ctx.saved_tensors
        return grad * inside, None, None, None, None


def quantize_like_wire(z: torch.Tensor, coding: CutCoding) -> torch.Tensor:
    """``z`` (``[N, C, ...]``) as the host decodes it after the board encodes it with ``coding``,
    with a straight-through gradient inside the coding's range."""
    view = (1, coding.channels) + (1,) * (z.dim() - 2)
    scale = torch.from_numpy(coding.scale).reshape(view)
    inverse = torch.from_numpy((1.0 / coding.scale).astype(np.float32)).reshape(view)
    zero = torch.from_numpy(coding.zero.astype(np.float32)).reshape(view)
    return _StraightThrough.apply(z.float(), inverse, scale, zero, (1 << coding.bits) - 1)


class KBitQuantizer(nn.Module):
    """The k-bit coding of a latent during training: in train mode it refits its coding on the
    last ``samples`` latents it saw (``CutCoding.calibrate``, as the build will), then codes the
    batch; in eval mode it codes with the last coding fitted."""

    def __init__(self, bits: int, samples: int) -> None:
        super().__init__()
        if bits not in CUT_BITS:
            raise ValueError(f"a latent coding has {', '.join(map(str, CUT_BITS))} bits, not {bits!r}")
        if samples < 1:
            raise ValueError(f"a latent coding is calibrated on at least one sample, not {samples}")
        self.bits, self.samples = bits, samples
        self._seen: deque[np.ndarray] = deque()  # recent latents, one array a batch, newest last
        self.coding: CutCoding | None = None

    def track(self, z: torch.Tensor) -> CutCoding:
        """Refit the coding on the last ``samples`` latents, ``z`` (a batch) the newest."""
        self._seen.append(z.detach().cpu().numpy().astype(np.float32, copy=False))
        while sum(len(b) for b in self._seen) - len(self._seen[0]) >= self.samples:
            self._seen.popleft()  # the rest still hold ``samples``
        recent = np.concatenate(list(self._seen))[-self.samples :]
        self.coding = CutCoding.calibrate(recent, self.bits)
        return self.coding

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        if self.training or self.coding is None:
            self.track(z)
        assert self.coding is not None
        return quantize_like_wire(z, self.coding)


def distillation_loss(
    student: torch.Tensor, teacher: torch.Tensor, labels: torch.Tensor,
    temperature: float = TEMPERATURE, kd_weight: float = KD_WEIGHT,
) -> torch.Tensor:
    """Hinton et al. (2015): the KL divergence of the softened student from the softened teacher,
    scaled by ``temperature**2`` so its gradients keep their size, plus cross-entropy on the labels."""
    kl = nn.functional.kl_div(
        nn.functional.log_softmax(student / temperature, dim=1),
        nn.functional.log_softmax(teacher / temperature, dim=1),
        reduction="batchmean", log_target=True,
    )
    return kd_weight * temperature**2 * kl + (1 - kd_weight) * nn.functional.cross_entropy(student, labels)
